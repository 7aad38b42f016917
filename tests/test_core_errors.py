"""core raises errors under one root, `CoreError`, each leaf also a builtin a caller expects."""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil

import pytest

import core
from core.errors import CoreError, ExpressionError, NumericalError, SpecError


def core_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in a module of core (imported here, so none hides)."""
    found = set()
    for info in pkgutil.walk_packages(core.__path__, "core."):
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.startswith("core."):
                found.add(value)
    return sorted(found, key=lambda cls: cls.__qualname__)


def test_every_core_exception_is_a_core_error_and_each_leaf_a_builtin_too():
    classes = core_exceptions()
    assert {NumericalError, SpecError, ExpressionError} <= set(classes)
    builtin_errors = {
        value
        for value in vars(builtins).values()
        if isinstance(value, type) and issubclass(value, Exception) and value is not Exception
    }
    for cls in classes:
        assert issubclass(cls, CoreError), cls
        if cls is not CoreError:
            assert any(issubclass(cls, b) for b in builtin_errors), cls


@pytest.mark.parametrize(
    ("module", "name", "builtin"),
    [
        ("core.gp", "NumericalError", RuntimeError),
        ("core.spec", "SpecError", ValueError),
        ("core.expression", "ExpressionError", ValueError),
    ],
)
def test_errors_stay_importable_where_they_were(module, name, builtin):
    cls = getattr(importlib.import_module(module), name)
    assert cls is getattr(importlib.import_module("core.errors"), name)
    assert issubclass(cls, builtin)


def test_a_spec_error_keeps_its_source_and_problems():
    error = SpecError("spec.yaml", ["nodes: missing", "policy: unknown"])
    assert (error.source, error.problems) == ("spec.yaml", ["nodes: missing", "policy: unknown"])
    assert str(error) == "spec.yaml: nodes: missing; policy: unknown"
