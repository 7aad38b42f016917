"""The readings and oracle tables: what devices measured, and what a simulator says a round's
action was worth.

A reading is stored once per (experiment, device_id, node, seq): a repeat writes nothing,
whatever its other fields. Reading ids are the arrival order over the whole store, never
reused. Oracle values (E[y | action] and the optimum) are kept once per round, the first wins.

`add_many` stores a batch in one statement (`executemany`) after one check of its rounds: the
agent's ingest path, where statements per reading were most of the store's time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from connectors.store import rounds
from connectors.store.errors import StoreError
from connectors.store.rows import ORACLE_COLUMNS, READING_COLUMNS, OracleRow, ReadingRow
from connectors.store.sql import Connection

__all__ = [
    "NewReading",
    "add",
    "add_many",
    "add_oracle",
    "count",
    "last_id",
    "newest_id",
    "oracles",
    "select",
]

_INSERT = (
    "INSERT INTO readings (experiment, round, node, value, seq, device_id, "
    "measured_at, received_at, variance, replications, array_dtype, array_shape, "
    "array_data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (experiment, device_id, node, seq) DO NOTHING"
)


@dataclass(frozen=True, slots=True)
class NewReading:
    """One reading to store (`Store.add_readings`): `Store.add_reading`'s arguments after the
    experiment. `array`: an array reading's numpy array (its mean is `value`)."""

    round: int
    node: str
    value: float
    seq: int
    device_id: str
    received_at: float
    measured_at: float | None = None
    variance: float | None = None
    replications: int | None = None
    array: Any = None

    def arguments(self) -> tuple[Any, ...]:
        """The fields in order: `Store.add_reading`'s (and `add`'s) arguments after the
        experiment."""
        return tuple(getattr(self, field.name) for field in fields(self))


def add(
    conn: Connection,
    experiment: str,
    round: int,
    node: str,
    value: float,
    seq: int,
    device_id: str,
    received_at: float,
    measured_at: float | None,
    variance: float | None = None,
    replications: int | None = None,
    array: tuple[str, str, bytes] | None = None,
) -> bool:
    """Insert the reading; False (nothing written) if its key is stored. StoreError if the
    round is unknown (readings name a round the store knows). `array`: an array reading's
    dtype, shape (JSON) and little-endian bytes."""
    rounds.require(conn, experiment, round)
    row = NewReading(
        round, node, value, seq, device_id, received_at, measured_at, variance, replications, array
    )
    return conn.execute(_INSERT, _parameters(experiment, row)).rowcount == 1


def add_many(conn: Connection, experiment: str, rows: Sequence[NewReading]) -> int:
    """Insert every row with one statement; how many were new (a row whose key is stored, or
    repeats an earlier row's, writes nothing). StoreError, nothing written, if a round is
    unknown. Each row's `array`: as `add`'s (dtype, shape, bytes), or None."""
    rounds.require_all(conn, experiment, {row.round for row in rows})
    cursor = conn.executemany(_INSERT, [_parameters(experiment, row) for row in rows])
    return cursor.rowcount


def _parameters(experiment: str, row: NewReading) -> tuple[Any, ...]:
    dtype, shape, data = row.array if row.array is not None else (None, None, None)
    return (
        experiment,
        row.round,
        row.node,
        row.value,
        row.seq,
        row.device_id,
        row.measured_at,
        row.received_at,
        row.variance,
        row.replications,
        dtype,
        shape,
        data,
    )


def select(conn: Connection, experiment: str, after_id: int, limit: int | None) -> list[ReadingRow]:
    """Readings with id > `after_id`, in arrival order (at most `limit` of them)."""
    sql = f"SELECT {READING_COLUMNS} FROM readings WHERE experiment = ? AND id > ? ORDER BY id"
    parameters: tuple[str | int, ...] = (experiment, after_id)
    if limit is not None:
        sql, parameters = f"{sql} LIMIT ?", (*parameters, limit)
    return [ReadingRow(*r) for r in conn.execute(sql, parameters).fetchall()]


def last_id(conn: Connection, experiment: str) -> int:
    """The id of the experiment's newest reading, 0 if it has none."""
    row = conn.execute(
        "SELECT max(id) FROM readings WHERE experiment = ?", (experiment,)
    ).fetchone()
    return int(row[0] or 0)


def count(conn: Connection, experiment: str) -> int:
    """How many readings the experiment has."""
    return int(
        conn.execute(
            "SELECT count(*) FROM readings WHERE experiment = ?", (experiment,)
        ).fetchone()[0]
    )


def newest_id(conn: Connection) -> int:
    """The id of the store's newest reading, any experiment; 0 if there is none."""
    return int(conn.execute("SELECT coalesce(max(id), 0) FROM readings").fetchone()[0])


def add_oracle(
    conn: Connection,
    where: str,
    experiment: str,
    round: int,
    action_id: str,
    expected_reward: float,
    optimum: float,
    at: float,
) -> bool:
    """Insert the round's oracle values; False (nothing written) if it has them. StoreError,
    `where` naming the call, if the round is unknown or `action_id` is not its action."""
    held = rounds.require(conn, experiment, round)
    if held != action_id:
        raise StoreError(f"{where}: action_id {action_id!r} is not the round's {held!r}")
    cursor = conn.execute(
        "INSERT INTO oracle (experiment, round, action_id, expected_reward, optimum, at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (experiment, round) DO NOTHING",
        (experiment, round, action_id, expected_reward, optimum, at),
    )
    return cursor.rowcount == 1


def oracles(conn: Connection, experiment: str) -> list[OracleRow]:
    rows = conn.execute(
        f"SELECT {ORACLE_COLUMNS} FROM oracle WHERE experiment = ? ORDER BY round",
        (experiment,),
    ).fetchall()
    return [OracleRow(*r) for r in rows]
