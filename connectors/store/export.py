"""`Store.export`: an experiment's rounds, readings, oracle values, ledger and visited states, one
CSV or Parquet file per table, each written atomically.

`check` refuses a bad request before anything is read, `read_tables` reads the five tables (run
it in one consistent read) and `write_tables` writes the files. A table is a column spec (name,
kind) and rows of plain values. CSV needs only the standard library; Parquet needs pyarrow, the
project's `parquet` extra (which the image and the test extra install): without it `check`
raises `StoreError` before any file is touched, and the message says how to install it or to
use CSV.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Final, Literal

from connectors.store.errors import StoreError
from connectors.store.sql import Connection

__all__ = [
    "EXPORT_TABLES",
    "ExportFormat",
    "ParquetUnavailable",
    "check",
    "read_tables",
    "require_pyarrow",
    "write_csv",
    "write_parquet",
    "write_tables",
]

ExportFormat = Literal["csv", "parquet"]
ColumnKind = Literal["int", "float", "str", "floats"]
Columns = Sequence[tuple[str, ColumnKind]]
Rows = Sequence[Sequence[Any]]

EXPORT_TABLES: Final = ("rounds", "readings", "oracle", "ledger", "visited_states")
_EXPORT_MODE: Final = 0o644


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


def check(experiment: str, fmt: str) -> None:
    """StoreError for an unknown format, Parquet without pyarrow, or an experiment name that
    cannot name a file."""
    if fmt not in ("csv", "parquet"):
        raise StoreError(f"export format must be 'csv' or 'parquet', got {fmt!r}")
    if fmt == "parquet":
        try:
            require_pyarrow()
        except ParquetUnavailable as exc:
            raise StoreError(str(exc)) from exc
    if Path(experiment).name != experiment or experiment in (".", ".."):
        raise StoreError(f"experiment name {experiment!r} cannot name an export file")


def read_tables(conn: Connection, experiment: str) -> dict[str, list[Any]]:
    """The experiment's rows of each of EXPORT_TABLES, in the columns of `_QUERIES`; an array
    reading's bytes, and a trace of visited states', become a flat list of floats (C order;
    `array_shape`, `shape` give the shape)."""
    tables = {
        name: conn.execute(_QUERIES[name][1], (experiment,)).fetchall() for name in EXPORT_TABLES
    }
    for name in ("readings", "visited_states"):
        tables[name] = [_unpack_array(row) for row in tables[name]]
    return tables


def _unpack_array(row: Sequence[Any]) -> list[Any]:
    """The row with its last column, an array's bytes, as a list of floats (its dtype two
    columns before)."""
    *head, data = row
    dtype = head[-2]
    if data is None or dtype is None:
        return [*head, None]
    import numpy as np

    values = np.frombuffer(bytes(data), dtype="<f4" if dtype == "float32" else "<f8")
    return [*head, values.astype(np.float64).tolist()]


def write_tables(
    directory: str | Path, experiment: str, fmt: ExportFormat, tables: dict[str, list[Any]]
) -> list[Path]:
    """Write ``<directory>/<experiment>_<table>.<fmt>`` for each table; the paths in the order
    of EXPORT_TABLES.

    Raises:
        StoreError: `directory` exists and is not a directory, or a file cannot be written
            (one line naming the path and the cause).
    """
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise StoreError(f"{out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"{out}: cannot create the directory ({exc.strerror or exc})") from None
    write = write_csv if fmt == "csv" else write_parquet
    paths = []
    for name in EXPORT_TABLES:
        path = out / f"{experiment}_{name}.{fmt}"
        try:
            write(path, _QUERIES[name][0], tables[name])
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
        paths.append(path)
    return paths


def write_csv(path: Path, columns: Columns, rows: Rows) -> None:
    """Write a header line and the rows; floats as repr, so they read back bit for bit."""
    with _atomic(path) as raw:
        handle = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        writer = csv.writer(handle)
        writer.writerow([name for name, _ in columns])
        writer.writerows([_csv_cell(value) for value in row] for row in rows)
        handle.flush()
        handle.detach()  # `_atomic` owns the file: it syncs and closes it


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):  # an array: JSON, floats as repr (they read back bit for bit)
        return "[" + ",".join(repr(float(v)) for v in value) + "]"
    return value


def write_parquet(path: Path, columns: Columns, rows: Rows) -> None:
    """Write the rows as one Parquet file with an explicit schema (so empty tables have one)."""
    pa = require_pyarrow()
    types = {
        "int": pa.int64(),
        "float": pa.float64(),
        "str": pa.string(),
        "floats": pa.list_(pa.float64()),
    }
    schema = pa.schema([(name, types[kind]) for name, kind in columns])
    data = {name: [row[i] for row in rows] for i, (name, _) in enumerate(columns)}
    table = pa.Table.from_pydict(data, schema=schema)
    with _atomic(path) as raw:
        pa.parquet.write_table(table, raw)


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[BinaryIO]:
    """Write to a fresh temporary file beside `path`, renamed over it only when complete.

    The temporary file is created with O_CREAT | O_EXCL (`tempfile.mkstemp`) under a random
    name, so a file or symlink planted in the directory is never opened, followed or
    overwritten: creation fails on any existing name, and the rename replaces `path` itself
    (a symlink at `path` is replaced, its target untouched).
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(fd, _EXPORT_MODE)  # mkstemp makes 0600; exports are ordinary files
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _columns(spec: str) -> list[tuple[str, ColumnKind]]:
    out: list[tuple[str, ColumnKind]] = []
    for item in spec.split(","):
        name, kind = item.split(":")
        out.append((name.strip(), kind.strip()))  # type: ignore[arg-type]
    return out


def _query(
    table: str, spec: str, order: str, data: str | None = None
) -> tuple[list[tuple[str, ColumnKind]], str]:
    columns = _columns(spec)
    # a `floats` column is read from its bytes column (`array` <- `array_data`, or `data`)
    names = ", ".join(
        (data or f"{name}_data") if kind == "floats" else name for name, kind in columns
    )
    return columns, f"SELECT {names} FROM {table} WHERE experiment = ? ORDER BY {order}"


# Each exported table: its columns with their kinds, and the query that reads them.
_QUERIES: Final = {
    "rounds": _query(
        "rounds",
        "experiment:str, round:int, action_id:str, kind:str, cost:float, status:str, "
        "attempt:int, reason:str, proposed_at:float, status_at:float, intervention:str, "
        "target_set:str, applied:str, expires_at:float",
        "round",
    ),
    "readings": _query(
        "readings",
        "id:int, experiment:str, round:int, node:str, value:float, seq:int, device_id:str, "
        "measured_at:float, received_at:float, array_dtype:str, array_shape:str, array:floats",
        "id",
    ),
    "oracle": _query(
        "oracle",
        "experiment:str, round:int, action_id:str, expected_reward:float, optimum:float, at:float",
        "round",
    ),
    "ledger": _query(
        "ledger",
        "experiment:str, round:int, amount:float, state:str, budget_total:float, "
        "reserved_at:float, settled_at:float, released_at:float",
        "round",
    ),
    # a trace [T, agents, obs] per row: `states` flat in C order, `shape` its shape (JSON)
    "visited_states": _query(
        "visited_states",
        "id:int, experiment:str, round:int, device_id:str, received_at:float, dtype:str, "
        "shape:str, states:floats",
        "id",
        data="data",
    ),
}
