"""Validation errors in plain words, each naming its field, with a "did you mean" for typos.

pydantic's messages are written for programmers ("Extra inputs are not permitted", "Input
should be greater than or equal to 1"). The spec, the policies' settings and the service's
configuration are written by people, so their errors are turned into sentences a person can act
on: `schedule.max_round: unknown setting (did you mean 'max_rounds'?)`,
`schedule.pipeline: must be at least 1, got 0`.

>>> did_you_mean("max_round", ["max_rounds", "pipeline"])
" (did you mean 'max_rounds'?)"
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

_MAX_LISTED = 16  # choices listed when none is close to the typo


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" for the closest of `choices`, or "" when none is close."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_name(kind: str, word: str, choices: Sequence[str]) -> str:
    """ "unknown KIND 'word' (did you mean ...?)", else the known names (at most 16)."""
    return f"unknown {kind} {word!r}{_hint(word, choices)}"


def _hint(word: str, choices: Sequence[str]) -> str:
    """The closest choice, else the choices (at most 16), else nothing."""
    if close := did_you_mean(word, choices):
        return close
    if not choices:
        return ""
    listed = ", ".join(map(str, choices[:_MAX_LISTED]))
    return f" (known: {listed}{', ...' if len(choices) > _MAX_LISTED else ''})"


def field_names(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys a mapping at `loc` inside `model` accepts (aliases where set), or [] if unknown.

    Follows `loc` through nested models, lists, tuples, optionals and dicts.
    """
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(part, int) or not _is_model(current):
            if typing.get_origin(current) in (list, tuple, dict):
                current = typing.get_args(current)[-1] if typing.get_args(current) else None
                continue
            return []
        field = _field(current, part)
        if field is None:
            return []
        current = field.annotation
    current = _unwrap(current)
    if not _is_model(current):
        return []
    return [field.alias or name for name, field in current.model_fields.items()]


def plain_problems(
    error: ValidationError, model: type[BaseModel] | None = None, prefix: str = ""
) -> list[str]:
    """One plain line per problem of `error`, `field.path: what is wrong`.

    Args:
        error: what pydantic raised.
        model: the model validated (to suggest the right name for an unknown key).
        prefix: put before every field path (e.g. "policy.settings").
    """
    problems = []
    for item in error.errors():
        loc = tuple(item["loc"])
        path = _path((prefix,) if prefix else (), loc)
        for message in _plain_message(item, model, loc).split("; "):
            problems.append(f"{path}: {message}" if path else message)
    return problems


def _path(prefix: tuple[str, ...], loc: tuple[str | int, ...]) -> str:
    text = ".".join(prefix)
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")


def _plain_message(item: Any, model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> str:
    kind, ctx, given = item["type"], item.get("ctx") or {}, item.get("input")
    if kind == "extra_forbidden":
        known = field_names(model, loc[:-1]) if model is not None else []
        return f"unknown key{_hint(str(loc[-1]), known)}"
    if kind == "missing":
        return "required, but missing"
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"{given!r} is not one of {', '.join(map(repr, expected))}" + did_you_mean(
            str(given), expected
        )
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("greater than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        return f"must be {words} {ctx.get(key)}, got {given!r}"
    if kind == "too_short":
        return f"needs at least {_items(ctx.get('min_length'))}, got {ctx.get('actual_length')}"
    if kind == "too_long":
        return f"takes at most {_items(ctx.get('max_length'))}, got {ctx.get('actual_length')}"
    if kind == "string_pattern_mismatch":
        return f"{given!r} is not allowed here (it must match {ctx.get('pattern')})"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"{given!r} is not {_article(kind.removesuffix('_type').removesuffix('_parsing'))}"
    return str(item["msg"]).removeprefix("Value error, ")


def _items(count: Any) -> str:
    return f"{count} item" + ("" if count == 1 else "s")


def _article(type_name: str) -> str:
    words = {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "string": "a string",
        "list": "a list",
        "tuple": "a list",
        "dict": "a mapping",
        "model": "a mapping",
        "model_attributes": "a mapping",
    }
    return words.get(type_name, f"a valid {type_name.replace('_', ' ')}")


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/Union-with-None and Annotated around an annotation."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _field(model: type[BaseModel], key: str) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None
