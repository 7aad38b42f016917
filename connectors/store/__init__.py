"""The durable store of cbo-agent: what the agent writes before it acknowledges or publishes.

One SQLite file per agent holds experiments (their specs), rounds (one per proposed action, with
its status and publication attempts), readings (deduplicated by experiment, device, node and
sequence number), oracle values, the budget ledger, snapshots of model state, and a bounded
list of dead letters. `Store.export` writes an experiment's history as CSV or Parquet.

Durability
    WAL journal with ``synchronous=FULL``: a commit returns only after the WAL has been fsynced,
    so everything a method wrote outside an explicit transaction — and everything in a
    `Store.transaction` block, when the block exits — survives a crash of the process *and* a
    power loss or kernel panic. With ``synchronous=NORMAL`` WAL mode syncs only at checkpoints:
    still consistent, but the last commits before a power loss may roll back, and the agent may
    already have published an action or spent budget on their strength. The price on this
    kind of machine is a fraction of a millisecond per commit (one fsync); group writes that
    belong together in `Store.transaction` to pay it once.

Thread safety
    One connection per `Store`, opened with ``check_same_thread=False`` and guarded by one
    re-entrant lock. `Store.transaction` holds the lock for its whole block, so a call from
    another thread waits instead of slipping into someone else's transaction (and committing
    or rolling back with it). Keep transaction blocks short and never ``await`` inside one: a
    coroutine of the same thread would re-enter the lock, so the store refuses calls from
    another asyncio task while a transaction is open. Several `Store` objects or processes on
    one file are safe too: every write transaction starts with ``BEGIN IMMEDIATE``, so SQLite
    serializes writers and the budget check-and-reserve cannot interleave; a writer waits for
    another at most ``timeout_s``.

Budget ledger
    `reserve` before publishing, `settle` on ack, `release` on reject or expiry. Spent means
    reserved (outstanding) + settled; a reservation that would take spent past the budget
    raises `BudgetExceeded` and writes nothing. A reservation written before a crash is still
    counted after it, so an action whose fate is unknown is paid for until it is resolved.
    `charge` is the one write that ignores the budget: it records a cost that was spent anyway
    (a device applied an action after its round expired and its reservation was released), so
    the ledger tells the truth even when that truth is an overspend.

Nothing here unpickles: specs and metadata are JSON, arrays are ``.npy`` blobs written and read
with ``allow_pickle=False``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, Self

from connectors.store import export as export_io
from connectors.store import schema
from connectors.store.connection import SqliteDatabase
from connectors.store.errors import BudgetExceeded, IllegalTransition, StoreError
from connectors.store.rows import (
    LEDGER_COLUMNS,
    ORACLE_COLUMNS,
    READING_COLUMNS,
    ROUND_COLUMNS,
    DeadLetterRow,
    LedgerRow,
    LedgerTotals,
    OracleRow,
    ReadingRow,
    RoundRow,
    Snapshot,
    round_row,
)
from connectors.store.values import (
    MAX_INT64,  # noqa: F401  (re-exported; __all__ comes with the table modules)
    dumps,
    integer,
    json_object,
    number,
    text,
    timestamp,
)

if (
    TYPE_CHECKING
):  # numpy is imported where snapshots need it, so `import connectors.store` is light
    import numpy as np

RoundStatus = Literal["proposed", "published", "acked", "rejected", "closed", "expired"]
LedgerState = Literal["reserved", "settled", "released"]
ExportFormat = Literal["csv", "parquet"]

ROUND_STATUSES: Final = schema.ROUND_STATUSES
OPEN_STATUSES: Final = ("proposed", "published", "acked")
# Status changes a round may make. "proposed -> acked" is allowed because an agent that crashed
# between publishing and recording the publication may hear the ack of that first attempt.
ROUND_TRANSITIONS: Final[Mapping[str, frozenset[str]]] = {
    "proposed": frozenset({"published", "acked", "rejected", "expired"}),
    "published": frozenset({"acked", "rejected", "expired", "closed"}),
    "acked": frozenset({"closed"}),
    "rejected": frozenset(),
    "closed": frozenset(),
    "expired": frozenset(),
}
ACTION_KINDS: Final = ("hard", "soft")
EXPORT_TABLES: Final = ("rounds", "readings", "oracle", "ledger")
_NPY_MAGIC: Final = b"\x93NUMPY"


class Store:
    """The embedded durable store. See the module docstring for durability and threading."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = 10.0,
        keep_snapshots: int = 2,
        keep_dead_letters: int = 1000,
        dead_letter_payload_limit: int = 65_536,
    ) -> None:
        """Open (creating and migrating as needed) the store at `path`.

        ``":memory:"`` gives a private in-memory store (no durability; for tests of callers).

        Raises:
            StoreError: the file is not a database, not a cbo-agent store, written by newer
                code, or WAL mode cannot be enabled on it.
        """
        self.keep_snapshots = integer("keep_snapshots", keep_snapshots, lo=1)
        self.keep_dead_letters = integer("keep_dead_letters", keep_dead_letters, lo=1)
        self.dead_letter_payload_limit = integer(
            "dead_letter_payload_limit", dead_letter_payload_limit
        )
        self._db = SqliteDatabase(path, timeout_s)
        self.path: Path | str = self._db.path

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent). Everything returned before is already durable."""
        self._db.close()

    @property
    def closed(self) -> bool:
        return self._db.closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}{', closed' if self.closed else ''})"

    @property
    def schema_version(self) -> int:
        return self._db.schema_version()

    # ---- transactions ----------------------------------------------------------------------

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """Group writes into one atomic commit, durable when the outermost block exits.

        Nested blocks join the outer transaction as savepoints: an exception escaping an inner
        block undoes that block's writes only; one escaping the outer block undoes all. Other
        threads' calls wait until the outermost block exits. Do not ``await`` inside.
        """
        return self._db.transaction()

    def _writing(self, what: str) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One atomic write (a savepoint inside an open transaction); database errors named."""
        return self._db.writing(what)

    def _reading(
        self, what: str, consistent: bool = False
    ) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """Reads under the lock; `consistent` wraps several SELECTs in one read transaction."""
        return self._db.reading(what, consistent)

    # ---- experiments -----------------------------------------------------------------------

    def upsert_experiment(
        self, name: str, spec: Mapping[str, Any], at: float | None = None
    ) -> None:
        """Create the experiment or replace its spec (a JSON-serializable mapping)."""
        text("experiment", name)
        spec_json = json_object(spec, f"spec of experiment {name!r}")
        when = timestamp("at", time.time() if at is None else at)
        with self._writing(f"upsert_experiment({name!r})") as conn:
            conn.execute(
                "INSERT INTO experiments (name, spec, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, "
                "updated_at = excluded.updated_at",
                (name, spec_json, when),
            )

    def experiment_names(self) -> list[str]:
        with self._reading("experiment_names") as conn:
            return [r[0] for r in conn.execute("SELECT name FROM experiments ORDER BY name")]

    def experiment_spec(self, name: str) -> dict[str, Any] | None:
        with self._reading("experiment_spec") as conn:
            row = conn.execute("SELECT spec FROM experiments WHERE name = ?", (name,)).fetchone()
        return None if row is None else json.loads(row[0])

    def _require_experiment(self, conn: sqlite3.Connection, experiment: str) -> None:
        if conn.execute("SELECT 1 FROM experiments WHERE name = ?", (experiment,)).fetchone():
            return
        raise StoreError(f"unknown experiment {experiment!r} (upsert_experiment it first)")

    # ---- rounds ----------------------------------------------------------------------------

    def add_round(
        self,
        experiment: str,
        round: int,
        action_id: str,
        intervention: Mapping[str, float],
        target_set: Sequence[str],
        cost: float,
        kind: str,
        at: float,
        expires_at: float | None = None,
    ) -> bool:
        """Record a proposed action as round `round` (status "proposed", attempt 0).

        `expires_at` is the action's expiry as published (None: the action carries none).
        Returns False, writing nothing, if this round already holds this `action_id` (a retry).

        Raises:
            StoreError: unknown experiment, the round holds another action, or `action_id` is
                already used by another round; invalid values.
        """
        text("experiment", experiment)
        round = integer("round", round)
        text("action_id", action_id)
        if not isinstance(intervention, Mapping):
            raise StoreError(f"intervention must be a mapping, got {type(intervention).__name__}")
        values = {
            text("intervention node", k): number(f"intervention[{k!r}]", v)
            for k, v in intervention.items()
        }
        if isinstance(target_set, str):
            raise StoreError(f"target_set must be a list of node names, got {target_set!r}")
        targets = [text("target_set entry", t) for t in target_set]
        cost = number("cost", cost, nonneg=True)
        if kind not in ACTION_KINDS:
            raise StoreError(f"kind must be one of {ACTION_KINDS}, got {kind!r}")
        at = timestamp("at", at)
        expires = None if expires_at is None else timestamp("expires_at", expires_at)
        where = f"add_round({experiment!r}, round {round})"
        with self._writing(where) as conn:
            self._require_experiment(conn, experiment)
            held = self._round_action(conn, experiment, round)
            if held == action_id:
                return False
            if held is not None:
                raise StoreError(f"{where}: the round already holds action {held!r}")
            other = conn.execute(
                "SELECT experiment, round FROM rounds WHERE action_id = ?", (action_id,)
            ).fetchone()
            if other is not None:
                raise StoreError(f"{where}: action_id {action_id!r} already used by {other}")
            conn.execute(
                "INSERT INTO rounds (experiment, round, action_id, intervention, target_set, "
                "cost, kind, status, attempt, reason, proposed_at, status_at, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'proposed', 0, NULL, ?, ?, ?)",
                (
                    experiment,
                    round,
                    action_id,
                    dumps(values),
                    dumps(targets),
                    cost,
                    kind,
                    at,
                    at,
                    expires,
                ),
            )
        return True

    def set_applied(self, experiment: str, round: int, applied: Mapping[str, float]) -> None:
        """Record what a device reported it applied for the round (an ack's `applied`).

        Raises:
            StoreError: unknown round, or values that are not finite numbers.
        """
        round = integer("round", round)
        if not isinstance(applied, Mapping):
            raise StoreError(f"applied must be a mapping, got {type(applied).__name__}")
        values = {text("applied node", k): number(f"applied[{k!r}]", v) for k, v in applied.items()}
        with self._writing(f"set_applied({experiment!r}, round {round})") as conn:
            self._require_round(conn, experiment, round)
            conn.execute(
                "UPDATE rounds SET applied = ? WHERE experiment = ? AND round = ?",
                (dumps(values), experiment, round),
            )

    def set_expires_at(self, experiment: str, round: int, expires_at: float) -> bool:
        """Move the round's action expiry later (before publishing it with that expiry).

        Returns False (nothing written) if it is already `expires_at`.

        Raises:
            StoreError: unknown round, or an earlier expiry than the stored one (a device may
                hold the action with the stored expiry, and the agent keeps its promise to wait).
        """
        round = integer("round", round)
        expires = timestamp("expires_at", expires_at)
        with self._writing(f"set_expires_at({experiment!r}, round {round})") as conn:
            self._require_round(conn, experiment, round)
            (held,) = conn.execute(
                "SELECT expires_at FROM rounds WHERE experiment = ? AND round = ?",
                (experiment, round),
            ).fetchone()
            if held == expires:
                return False
            if held is not None and expires < held:
                raise StoreError(
                    f"set_expires_at({experiment!r}, round {round}): {expires!r} is earlier "
                    f"than the published expiry {held!r}"
                )
            conn.execute(
                "UPDATE rounds SET expires_at = ? WHERE experiment = ? AND round = ?",
                (expires, experiment, round),
            )
        return True

    def set_round_status(
        self, experiment: str, round: int, status: str, at: float, reason: str | None = None
    ) -> bool:
        """Move a round to `status`. Returns False (nothing written) if it is already there.

        `reason` says why and belongs to this change: a later change without one clears it.

        Raises:
            IllegalTransition: the move is not in ROUND_TRANSITIONS (e.g. closed -> acked).
            StoreError: unknown round or status.
        """
        if status not in ROUND_STATUSES:
            raise StoreError(f"unknown round status {status!r}; one of {ROUND_STATUSES}")
        round = integer("round", round)
        at = timestamp("at", at)
        if reason is not None and not isinstance(reason, str):
            raise StoreError(f"reason must be a string or None, got {type(reason).__name__}")
        with self._writing(f"set_round_status({experiment!r}, round {round})") as conn:
            current = self._round_status(conn, experiment, round)
            if current == status:
                return False
            if status not in ROUND_TRANSITIONS[current]:
                raise IllegalTransition("status", experiment, round, current, status)
            conn.execute(
                "UPDATE rounds SET status = ?, status_at = ?, reason = ? "
                "WHERE experiment = ? AND round = ?",
                (status, at, reason, experiment, round),
            )
        return True

    def bump_attempt(self, experiment: str, round: int) -> int:
        """Count one more publication of the round's action and return the new attempt number.

        Call it before every publication, the first included (which makes attempt 1).

        Raises:
            IllegalTransition: the round is acked or finished, so it is not published again.
        """
        round = integer("round", round)
        with self._writing(f"bump_attempt({experiment!r}, round {round})") as conn:
            current = self._round_status(conn, experiment, round)
            if current not in ("proposed", "published"):
                raise IllegalTransition("attempt", experiment, round, current, "re-published")
            conn.execute(
                "UPDATE rounds SET attempt = attempt + 1 WHERE experiment = ? AND round = ?",
                (experiment, round),
            )
            row = conn.execute(
                "SELECT attempt FROM rounds WHERE experiment = ? AND round = ?",
                (experiment, round),
            ).fetchone()
        return int(row[0])

    def rounds(self, experiment: str) -> list[RoundRow]:
        """Every round of the experiment, by round number."""
        return self._select_rounds(experiment, ROUND_STATUSES)

    def open_rounds(self, experiment: str) -> list[RoundRow]:
        """Rounds not closed, rejected or expired (proposed, published, acked), by round number."""
        return self._select_rounds(experiment, OPEN_STATUSES)

    def get_round(self, experiment: str, round: int) -> RoundRow | None:
        with self._reading("get_round") as conn:
            row = conn.execute(
                f"SELECT {ROUND_COLUMNS} FROM rounds WHERE experiment = ? AND round = ?",
                (experiment, round),
            ).fetchone()
        return None if row is None else round_row(row)

    def _select_rounds(self, experiment: str, statuses: Sequence[str]) -> list[RoundRow]:
        marks = ", ".join("?" * len(statuses))
        with self._reading("rounds") as conn:
            rows = conn.execute(
                f"SELECT {ROUND_COLUMNS} FROM rounds WHERE experiment = ? "
                f"AND status IN ({marks}) ORDER BY round",
                (experiment, *statuses),
            ).fetchall()
        return [round_row(r) for r in rows]

    def _round_action(self, conn: sqlite3.Connection, experiment: str, round: int) -> str | None:
        row = conn.execute(
            "SELECT action_id FROM rounds WHERE experiment = ? AND round = ?", (experiment, round)
        ).fetchone()
        return None if row is None else row[0]

    def _round_status(self, conn: sqlite3.Connection, experiment: str, round: int) -> str:
        row = conn.execute(
            "SELECT status FROM rounds WHERE experiment = ? AND round = ?", (experiment, round)
        ).fetchone()
        if row is None:
            raise StoreError(f"unknown round {round} of experiment {experiment!r}")
        return str(row[0])

    def _require_round(self, conn: sqlite3.Connection, experiment: str, round: int) -> str:
        """The round's action_id; StoreError if the round is unknown."""
        action_id = self._round_action(conn, experiment, round)
        if action_id is None:
            raise StoreError(f"unknown round {round} of experiment {experiment!r}")
        return action_id

    # ---- readings --------------------------------------------------------------------------

    def add_reading(
        self,
        experiment: str,
        round: int,
        node: str,
        value: float,
        seq: int,
        device_id: str,
        received_at: float,
        measured_at: float | None = None,
    ) -> bool:
        """Store one reading. False (nothing written) if (experiment, device_id, node, seq) is
        already stored, whatever its other fields.

        Raises:
            StoreError: unknown round (readings name a round the store knows), non-finite value.
        """
        round = integer("round", round)
        text("node", node)
        value = number("value", value)
        seq = integer("seq", seq)
        text("device_id", device_id)
        received_at = timestamp("received_at", received_at)
        measured = None if measured_at is None else timestamp("measured_at", measured_at)
        with self._writing(f"add_reading({experiment!r}, round {round}, {node!r})") as conn:
            self._require_round(conn, experiment, round)
            cursor = conn.execute(
                "INSERT INTO readings (experiment, round, node, value, seq, device_id, "
                "measured_at, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (experiment, device_id, node, seq) DO NOTHING",
                (experiment, round, node, value, seq, device_id, measured, received_at),
            )
            return cursor.rowcount == 1

    def readings(
        self, experiment: str, after_id: int = 0, limit: int | None = None
    ) -> list[ReadingRow]:
        """Readings with id > `after_id`, in arrival order (at most `limit` of them)."""
        after_id = integer("after_id", after_id)
        cap = -1 if limit is None else integer("limit", limit)
        with self._reading("readings") as conn:
            rows = conn.execute(
                f"SELECT {READING_COLUMNS} FROM readings WHERE experiment = ? AND id > ? "
                "ORDER BY id LIMIT ?",
                (experiment, after_id, cap),
            ).fetchall()
        return [ReadingRow(*r) for r in rows]

    def last_reading_id(self, experiment: str) -> int:
        """The id of the experiment's newest reading, 0 if it has none."""
        with self._reading("last_reading_id") as conn:
            row = conn.execute(
                "SELECT max(id) FROM readings WHERE experiment = ?", (experiment,)
            ).fetchone()
        return int(row[0] or 0)

    # ---- oracle ----------------------------------------------------------------------------

    def add_oracle(
        self,
        experiment: str,
        round: int,
        action_id: str,
        expected_reward: float,
        optimum: float,
        at: float,
    ) -> bool:
        """Store a simulator's E[y|action] and optimum for a round; the first one per round wins.

        Returns False (nothing written) if the round already has its oracle values.

        Raises:
            StoreError: unknown round, or `action_id` is not the round's action.
        """
        round = integer("round", round)
        expected_reward = number("expected_reward", expected_reward)
        optimum = number("optimum", optimum)
        at = timestamp("at", at)
        where = f"add_oracle({experiment!r}, round {round})"
        with self._writing(where) as conn:
            held = self._require_round(conn, experiment, round)
            if held != action_id:
                raise StoreError(f"{where}: action_id {action_id!r} is not the round's {held!r}")
            cursor = conn.execute(
                "INSERT INTO oracle (experiment, round, action_id, expected_reward, optimum, at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (experiment, round) DO NOTHING",
                (experiment, round, action_id, expected_reward, optimum, at),
            )
            return cursor.rowcount == 1

    def oracles(self, experiment: str) -> list[OracleRow]:
        with self._reading("oracles") as conn:
            rows = conn.execute(
                f"SELECT {ORACLE_COLUMNS} FROM oracle WHERE experiment = ? ORDER BY round",
                (experiment,),
            ).fetchall()
        return [OracleRow(*r) for r in rows]

    # ---- budget ledger ---------------------------------------------------------------------

    def reserve(
        self,
        experiment: str,
        round: int,
        amount: float,
        budget_total: float | None,
        at: float,
    ) -> bool:
        """Reserve `amount` of the budget for a round, before its action is published.

        The check and the insert are one transaction, so concurrent reservers (threads,
        processes) never jointly overspend. `budget_total` None means no limit (still recorded).
        Returns False (nothing written) if the round already holds this same reservation.

        Raises:
            BudgetExceeded: settled + reserved + amount > budget_total; nothing is written.
            IllegalTransition: the round's entry is settled, released or of another amount.
            StoreError: unknown round; negative or non-finite amount.
        """
        round = integer("round", round)
        amount = number("amount", amount, nonneg=True)
        limit = None if budget_total is None else number("budget_total", budget_total, nonneg=True)
        at = timestamp("at", at)
        with self._writing(f"reserve({experiment!r}, round {round})") as conn:
            held = self._ledger_entry(conn, experiment, round)
            if held is not None:
                if held == ("reserved", amount):
                    return False
                state, had = held
                raise IllegalTransition(
                    "ledger", experiment, round, f"{state} {had!r}", f"reserved {amount!r}"
                )
            self._require_round(conn, experiment, round)
            if limit is not None:
                spent = self._spent(conn, experiment)
                if math.fsum((*spent, amount)) > limit:
                    raise BudgetExceeded(experiment, round, amount, math.fsum(spent), limit)
            conn.execute(
                "INSERT INTO ledger (experiment, round, amount, state, budget_total, reserved_at) "
                "VALUES (?, ?, ?, 'reserved', ?, ?)",
                (experiment, round, amount, limit, at),
            )
        return True

    def settle(self, experiment: str, round: int, at: float) -> bool:
        """Turn the round's reservation into a settled cost (on ack). False if already settled.

        Raises:
            IllegalTransition: no reservation, or it was released.
        """
        return self._ledger_move(experiment, round, "settled", at)

    def release(self, experiment: str, round: int, at: float) -> bool:
        """Give the round's reservation back (on reject or expiry). False if already released.

        Raises:
            IllegalTransition: no reservation, or it was settled.
        """
        return self._ledger_move(experiment, round, "released", at)

    def charge(self, experiment: str, round: int, at: float) -> bool:
        """Settle the round's cost whatever the budget: the action was applied after all.

        For a round whose action a device applied after the agent had given up on it (expired,
        reservation released): its amount counts as spent again, even past `budget_total` — the
        ledger records what happened. A still-reserved entry is settled as by `settle`. Returns
        False (nothing written) if the entry is already settled.

        Raises:
            IllegalTransition: the round has no ledger entry.
        """
        round = integer("round", round)
        at = timestamp("at", at)
        with self._writing(f"charge({experiment!r}, round {round})") as conn:
            held = self._ledger_entry(conn, experiment, round)
            if held is None:
                raise IllegalTransition("ledger", experiment, round, "unreserved", "charged")
            if held[0] == "settled":
                return False
            conn.execute(
                "UPDATE ledger SET state = 'settled', settled_at = ? "
                "WHERE experiment = ? AND round = ?",
                (at, experiment, round),
            )
        return True

    def _ledger_move(self, experiment: str, round: int, to: LedgerState, at: float) -> bool:
        round = integer("round", round)
        at = timestamp("at", at)
        verb = "settle" if to == "settled" else "release"
        with self._writing(f"{verb}({experiment!r}, round {round})") as conn:
            held = self._ledger_entry(conn, experiment, round)
            state = "unreserved" if held is None else held[0]
            if state == to:
                return False
            if state != "reserved":
                raise IllegalTransition("ledger", experiment, round, state, to)
            column = "settled_at" if to == "settled" else "released_at"
            conn.execute(
                f"UPDATE ledger SET state = ?, {column} = ? WHERE experiment = ? AND round = ?",
                (to, at, experiment, round),
            )
        return True

    def ledger(self, experiment: str) -> LedgerTotals:
        """Totals of the experiment's ledger (exactly rounded sums); `.spent` counts the budget."""
        with self._reading("ledger") as conn:
            rows = conn.execute(
                "SELECT state, amount FROM ledger WHERE experiment = ?", (experiment,)
            ).fetchall()
        by_state: dict[str, list[float]] = {s: [] for s in schema.LEDGER_STATES}
        for state, amount in rows:
            by_state[state].append(amount)
        return LedgerTotals(*(math.fsum(by_state[s]) for s in schema.LEDGER_STATES))

    def ledger_entries(self, experiment: str) -> list[LedgerRow]:
        with self._reading("ledger_entries") as conn:
            rows = conn.execute(
                f"SELECT {LEDGER_COLUMNS} FROM ledger WHERE experiment = ? ORDER BY round",
                (experiment,),
            ).fetchall()
        return [LedgerRow(*r) for r in rows]

    def _ledger_entry(
        self, conn: sqlite3.Connection, experiment: str, round: int
    ) -> tuple[str, float] | None:
        row = conn.execute(
            "SELECT state, amount FROM ledger WHERE experiment = ? AND round = ?",
            (experiment, round),
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def _spent(self, conn: sqlite3.Connection, experiment: str) -> list[float]:
        rows = conn.execute(
            "SELECT amount FROM ledger WHERE experiment = ? AND state IN ('reserved', 'settled')",
            (experiment,),
        )
        return [r[0] for r in rows]

    # ---- snapshots -------------------------------------------------------------------------

    def save_snapshot(
        self,
        experiment: str,
        upto_reading_id: int,
        arrays: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
        at: float | None = None,
    ) -> int:
        """Store model state that includes every reading with id <= `upto_reading_id`.

        Arrays are kept bit for bit as ``.npy`` (no pickle: object dtypes are refused); `meta`
        must be JSON-serializable. Only the newest `keep_snapshots` per experiment are kept.
        Returns the snapshot's id.
        """
        upto = integer("upto_reading_id", upto_reading_id)
        blobs = {text("array name", k): _npy_bytes(experiment, k, v) for k, v in arrays.items()}
        meta_text = json_object(meta, f"snapshot meta of experiment {experiment!r}")
        when = timestamp("at", time.time() if at is None else at)
        with self._writing(f"save_snapshot({experiment!r})") as conn:
            self._require_experiment(conn, experiment)
            newest = conn.execute("SELECT coalesce(max(id), 0) FROM readings").fetchone()[0]
            if upto > newest:
                raise StoreError(
                    f"snapshot of {experiment!r}: upto_reading_id {upto} is past the newest "
                    f"reading id {newest}"
                )
            cursor = conn.execute(
                "INSERT INTO snapshots (experiment, upto_reading_id, meta, created_at) "
                "VALUES (?, ?, ?, ?)",
                (experiment, upto, meta_text, when),
            )
            snapshot_id = int(cursor.lastrowid or 0)
            conn.executemany(
                "INSERT INTO snapshot_arrays (snapshot_id, name, npy) VALUES (?, ?, ?)",
                [(snapshot_id, name, blob) for name, blob in blobs.items()],
            )
            conn.execute(
                "DELETE FROM snapshots WHERE experiment = ? AND id NOT IN "
                "(SELECT id FROM snapshots WHERE experiment = ? ORDER BY id DESC LIMIT ?)",
                (experiment, experiment, self.keep_snapshots),
            )
        return snapshot_id

    def latest_snapshot(self, experiment: str) -> Snapshot | None:
        """The newest snapshot of the experiment with its arrays, or None.

        Raises:
            StoreError: a stored array is not a plain ``.npy`` (it will not be unpickled).
        """
        with self._reading("latest_snapshot", consistent=True) as conn:
            row = conn.execute(
                "SELECT id, upto_reading_id, meta, created_at FROM snapshots "
                "WHERE experiment = ? ORDER BY id DESC LIMIT 1",
                (experiment,),
            ).fetchone()
            if row is None:
                return None
            blobs = conn.execute(
                "SELECT name, npy FROM snapshot_arrays WHERE snapshot_id = ? ORDER BY name",
                (row[0],),
            ).fetchall()
        arrays = {name: _npy_array(experiment, name, blob) for name, blob in blobs}
        return Snapshot(row[0], experiment, row[1], arrays, json.loads(row[2]), row[3])

    # ---- dead letters ----------------------------------------------------------------------

    def add_dead_letter(
        self,
        experiment: str | None,
        topic: str,
        reason: str,
        detail: str,
        payload: bytes | str,
        at: float,
    ) -> int:
        """Keep rejected input for inspection; only the newest `keep_dead_letters` per
        experiment (None is a group of its own) are kept, each payload cut to
        `dead_letter_payload_limit` bytes. Returns the row id."""
        if experiment is not None:
            text("experiment", experiment)
        data = payload.encode("utf-8", "replace") if isinstance(payload, str) else bytes(payload)
        limit = self.dead_letter_payload_limit
        for name, value in (("topic", topic), ("reason", reason), ("detail", detail)):
            if not isinstance(value, str):
                raise StoreError(f"dead letter {name} must be a string, got {type(value).__name__}")
        at = timestamp("at", at)
        with self._writing(f"add_dead_letter({experiment!r})") as conn:
            cursor = conn.execute(
                "INSERT INTO dead_letters (experiment, topic, reason, detail, payload, "
                "payload_size, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (experiment, topic, reason, detail, data[:limit], len(data), at),
            )
            conn.execute(
                "DELETE FROM dead_letters WHERE experiment IS ? AND id <= (SELECT id FROM "
                "dead_letters WHERE experiment IS ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (experiment, experiment, self.keep_dead_letters),
            )
            return int(cursor.lastrowid or 0)

    def dead_letters(self, experiment: str | None) -> list[DeadLetterRow]:
        """Kept dead letters of the experiment (None: those without one), oldest first."""
        with self._reading("dead_letters") as conn:
            rows = conn.execute(
                "SELECT id, experiment, topic, reason, detail, payload, payload_size, at "
                "FROM dead_letters WHERE experiment IS ? ORDER BY id",
                (experiment,),
            ).fetchall()
        return [DeadLetterRow(*r) for r in rows]

    # ---- export ----------------------------------------------------------------------------

    def export(
        self, experiment: str, directory: str | Path, fmt: ExportFormat = "csv"
    ) -> list[Path]:
        """Write the experiment's rounds, readings, oracle values and ledger, one file each.

        Files are ``<directory>/<experiment>_<table>.<fmt>``, read in one consistent snapshot
        and each written atomically (temporary file, then rename). Returns their paths in the
        order of EXPORT_TABLES.

        Raises:
            StoreError: unknown experiment or format; Parquet without pyarrow (use CSV).
        """
        if fmt not in ("csv", "parquet"):
            raise StoreError(f"export format must be 'csv' or 'parquet', got {fmt!r}")
        if fmt == "parquet":
            try:
                export_io.require_pyarrow()
            except export_io.ParquetUnavailable as exc:
                raise StoreError(str(exc)) from exc
        if Path(experiment).name != experiment or experiment in (".", ".."):
            raise StoreError(f"experiment name {experiment!r} cannot name an export file")
        with self._reading(f"export({experiment!r})", consistent=True) as conn:
            self._require_experiment(conn, experiment)
            data = {
                name: conn.execute(_EXPORT_QUERIES[name][1], (experiment,)).fetchall()
                for name in EXPORT_TABLES
            }
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        write = export_io.write_csv if fmt == "csv" else export_io.write_parquet
        paths = []
        for name in EXPORT_TABLES:
            path = out / f"{experiment}_{name}.{fmt}"
            write(path, _EXPORT_QUERIES[name][0], data[name])
            paths.append(path)
        return paths


# ---- row codecs and export queries -----------------------------------------------------------


def _columns(spec: str) -> list[tuple[str, export_io.ColumnKind]]:
    out: list[tuple[str, export_io.ColumnKind]] = []
    for item in spec.split(","):
        name, kind = item.split(":")
        out.append((name.strip(), kind.strip()))  # type: ignore[arg-type]
    return out


def _export_query(
    table: str, spec: str, order: str
) -> tuple[list[tuple[str, export_io.ColumnKind]], str]:
    columns = _columns(spec)
    names = ", ".join(name for name, _ in columns)
    return columns, f"SELECT {names} FROM {table} WHERE experiment = ? ORDER BY {order}"


_EXPORT_QUERIES: Final = {
    "rounds": _export_query(
        "rounds",
        "experiment:str, round:int, action_id:str, kind:str, cost:float, status:str, "
        "attempt:int, reason:str, proposed_at:float, status_at:float, intervention:str, "
        "target_set:str, applied:str, expires_at:float",
        "round",
    ),
    "readings": _export_query(
        "readings",
        "id:int, experiment:str, round:int, node:str, value:float, seq:int, device_id:str, "
        "measured_at:float, received_at:float",
        "id",
    ),
    "oracle": _export_query(
        "oracle",
        "experiment:str, round:int, action_id:str, expected_reward:float, optimum:float, at:float",
        "round",
    ),
    "ledger": _export_query(
        "ledger",
        "experiment:str, round:int, amount:float, state:str, budget_total:float, "
        "reserved_at:float, settled_at:float, released_at:float",
        "round",
    ),
}


def _npy_bytes(experiment: str, name: str, value: object) -> bytes:
    import numpy as np

    array = np.asarray(value)
    if array.dtype.hasobject:
        raise StoreError(
            f"snapshot array {name!r} of experiment {experiment!r} has dtype {array.dtype} "
            "holding Python objects; only plain numeric arrays are stored (no pickle)"
        )
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _npy_array(experiment: str, name: str, blob: bytes) -> np.ndarray:
    import numpy as np

    if not bytes(blob[: len(_NPY_MAGIC)]) == _NPY_MAGIC:
        raise StoreError(f"snapshot array {name!r} of experiment {experiment!r} is not .npy data")
    try:
        array = np.lib.format.read_array(io.BytesIO(blob), allow_pickle=False)
    except ValueError as exc:  # an object array: numpy refuses to unpickle it
        raise StoreError(
            f"snapshot array {name!r} of experiment {experiment!r} cannot be loaded without "
            f"unpickling, refused: {exc}"
        ) from exc
    return array if array.flags.writeable else array.copy(order="K")
