"""Checks of the values a caller hands the store, before anything is written.

Each check returns the value in the form the store keeps (an `int`, a finite `float`, canonical
JSON) or raises `StoreError` naming the field and the value, so that a bad call says which
argument was wrong instead of failing inside SQL.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any, Final

from connectors.store.errors import StoreError

__all__ = [
    "MAX_INT64",
    "array_columns",
    "dumps",
    "integer",
    "json_object",
    "node_names",
    "node_values",
    "number",
    "text",
    "timestamp",
]

MAX_INT64: Final = 2**63 - 1  # the widest integer column SQLite (and PostgreSQL's bigint) holds


def text(name: str, value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise StoreError(f"{name} must be a non-empty string, got {value!r}")
    return value


def integer(name: str, value: object, lo: int = 0, hi: int = MAX_INT64) -> int:
    """An integer in [lo, hi]; bools and floats are refused, numpy integers accepted."""
    if isinstance(value, bool):
        raise StoreError(f"{name} must be an integer, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise StoreError(f"{name} must be an integer, got {value!r}") from None
    if not lo <= number <= hi:
        raise StoreError(f"{name} must be in [{lo}, {hi}], got {number}")
    return number


def number(name: str, value: object, nonneg: bool = False) -> float:
    """A finite float (>= 0 if `nonneg`); bools, strings and None are refused."""
    if isinstance(value, bool | str | bytes) or value is None:
        raise StoreError(f"{name} must be a number, got {value!r}")
    try:
        result = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise StoreError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(result):
        raise StoreError(f"{name} must be finite, got {result!r}")
    if nonneg and result < 0:
        raise StoreError(f"{name} must be >= 0, got {result!r}")
    return result


def timestamp(name: str, value: object) -> float:
    """A time in unix seconds: any finite number."""
    return number(name, value)


def node_values(name: str, value: object) -> dict[str, float]:
    """A mapping of node names to finite numbers (an intervention, or what a device applied)."""
    if not isinstance(value, Mapping):
        raise StoreError(f"{name} must be a mapping, got {type(value).__name__}")
    return {text(f"{name} node", k): number(f"{name}[{k!r}]", v) for k, v in value.items()}


def node_names(name: str, value: Iterable[object]) -> list[str]:
    """Node names from any iterable; a bare string (an iterable of letters) is refused."""
    if isinstance(value, str):
        raise StoreError(f"{name} must be a list of node names, got {value!r}")
    return [text(f"{name} entry", entry) for entry in value]


def dumps(value: object) -> str:
    """Canonical JSON: sorted keys, no spaces, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def json_object(value: object, what: str) -> str:
    """A mapping as canonical JSON text; `what` names it in the error."""
    if not isinstance(value, Mapping):
        raise StoreError(f"{what} must be a mapping, got {type(value).__name__}")
    try:
        return dumps(dict(value))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serializable: {exc}") from exc


def array_columns(array: Any) -> tuple[str, str, bytes]:
    """(dtype, shape as JSON, little-endian C-order bytes) of a float32/float64 numpy array;
    StoreError for another dtype or a non-finite element."""
    import numpy as np

    values = np.asarray(array)
    if values.dtype not in (np.float32, np.float64):
        raise StoreError(f"array must be float32 or float64, got {values.dtype}")
    if values.ndim == 0 or not np.isfinite(values).all():
        raise StoreError("array must have a shape and finite elements")
    dtype = "float32" if values.dtype == np.float32 else "float64"
    little = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    return dtype, json.dumps([int(n) for n in values.shape]), little.tobytes()
