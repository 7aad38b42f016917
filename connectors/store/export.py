"""Writers for `Store.export`: one CSV or Parquet file per table, written atomically.

A table arrives as a column spec (name, kind) and rows of plain values. CSV needs only the
standard library; Parquet needs pyarrow, the project's `parquet` extra (which the image and the
test extra install): without it `write_parquet` raises `ParquetUnavailable` before any file is
touched, and the message says how to install it or to use CSV.
"""

from __future__ import annotations

import contextlib
import csv
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

ColumnKind = Literal["int", "float", "str"]
Columns = Sequence[tuple[str, ColumnKind]]


class ParquetUnavailable(RuntimeError):
    """pyarrow is not installed, so Parquet cannot be written."""


def require_pyarrow() -> Any:
    """Import pyarrow (and pyarrow.parquet) or raise `ParquetUnavailable` saying what to do."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise ParquetUnavailable(
            "Parquet export needs pyarrow, which is not installed "
            "(pip install 'cbo-agent[parquet]', or pyarrow); use fmt='csv' (--format csv) instead"
        ) from exc
    return pyarrow


def write_csv(path: Path, columns: Columns, rows: Sequence[Sequence[Any]]) -> None:
    """Write a header line and the rows; floats as repr, so they read back bit for bit."""
    with _atomic(path, newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([name for name, _ in columns])
        writer.writerows(["" if value is None else value for value in row] for row in rows)


def write_parquet(path: Path, columns: Columns, rows: Sequence[Sequence[Any]]) -> None:
    """Write the rows as one Parquet file with an explicit schema (so empty tables have one)."""
    pa = require_pyarrow()
    types = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
    schema = pa.schema([(name, types[kind]) for name, kind in columns])
    data = {name: [row[i] for row in rows] for i, (name, _) in enumerate(columns)}
    table = pa.Table.from_pydict(data, schema=schema)
    tmp = path.with_name(path.name + ".tmp")
    try:
        pa.parquet.write_table(table, str(tmp))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def _atomic(path: Path, newline: str | None = None) -> Iterator[TextIO]:
    """Write to a sibling temporary file and rename it over `path` only when complete."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline=newline) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
