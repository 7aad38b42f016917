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

Layout
    `Store` (here) checks each argument (`values`) and runs one function of a table module inside
    `SqliteDatabase.writing` or `.reading` (`connection`: open, PRAGMAs, migrations from
    `schema`, the lock, transactions). The table modules — `experiments`, `rounds` (with the
    one `RoundStatus`), `readings` (and oracle values), `ledger`, `snapshots`, `dead_letters`,
    `export` — are functions over a connection, written in SQL that another backend can share
    (`sql`); they return the dataclasses of `rows` and raise the errors of `errors`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from connectors.store import dead_letters as dead_letter_table
from connectors.store import experiments as experiment_table
from connectors.store import export as export_files
from connectors.store import ledger as ledger_table
from connectors.store import readings as reading_table
from connectors.store import rounds as round_table
from connectors.store import snapshots as snapshot_table
from connectors.store.connection import SqliteDatabase
from connectors.store.errors import BudgetExceeded, IllegalTransition, StoreError
from connectors.store.export import EXPORT_TABLES, ExportFormat
from connectors.store.ledger import LedgerState
from connectors.store.rounds import (
    ACTION_KINDS,
    OPEN_STATUSES,
    ROUND_STATUSES,
    ROUND_TRANSITIONS,
    RoundStatus,
)
from connectors.store.rows import (
    DeadLetterRow,
    LedgerRow,
    LedgerTotals,
    OracleRow,
    ReadingRow,
    RoundRow,
    Snapshot,
)
from connectors.store.sql import Connection
from connectors.store.values import (
    MAX_INT64,
    integer,
    json_object,
    node_names,
    node_values,
    number,
    text,
    timestamp,
)

# numpy is imported where snapshots need it, so `import connectors.store` stays light.
if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ACTION_KINDS",
    "EXPORT_TABLES",
    "MAX_INT64",
    "OPEN_STATUSES",
    "ROUND_STATUSES",
    "ROUND_TRANSITIONS",
    "BudgetExceeded",
    "DeadLetterRow",
    "ExportFormat",
    "IllegalTransition",
    "LedgerRow",
    "LedgerState",
    "LedgerTotals",
    "OracleRow",
    "ReadingRow",
    "RoundRow",
    "RoundStatus",
    "Snapshot",
    "Store",
    "StoreError",
]


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

    def _writing(self, what: str) -> contextlib.AbstractContextManager[Connection]:
        """One atomic write (a savepoint inside an open transaction); database errors named."""
        return self._db.writing(what)

    def _reading(
        self, what: str, consistent: bool = False
    ) -> contextlib.AbstractContextManager[Connection]:
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
            experiment_table.upsert(conn, name, spec_json, when)

    def experiment_names(self) -> list[str]:
        with self._reading("experiment_names") as conn:
            return experiment_table.names(conn)

    def experiment_spec(self, name: str) -> dict[str, Any] | None:
        with self._reading("experiment_spec") as conn:
            return experiment_table.spec(conn, name)

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
        values = node_values("intervention", intervention)
        targets = node_names("target_set", target_set)
        cost = number("cost", cost, nonneg=True)
        if kind not in ACTION_KINDS:
            raise StoreError(f"kind must be one of {ACTION_KINDS}, got {kind!r}")
        at = timestamp("at", at)
        expires = None if expires_at is None else timestamp("expires_at", expires_at)
        where = f"add_round({experiment!r}, round {round})"
        with self._writing(where) as conn:
            return round_table.add(
                conn, where, experiment, round, action_id, values, targets, cost, kind, at, expires
            )

    def set_applied(self, experiment: str, round: int, applied: Mapping[str, float]) -> None:
        """Record what a device reported it applied for the round (an ack's `applied`).

        Raises:
            StoreError: unknown round, or values that are not finite numbers.
        """
        round = integer("round", round)
        values = node_values("applied", applied)
        with self._writing(f"set_applied({experiment!r}, round {round})") as conn:
            round_table.set_applied(conn, experiment, round, values)

    def set_expires_at(self, experiment: str, round: int, expires_at: float) -> bool:
        """Move the round's action expiry later (before publishing it with that expiry).

        Returns False (nothing written) if it is already `expires_at`.

        Raises:
            StoreError: unknown round, or an earlier expiry than the stored one (a device may
                hold the action with the stored expiry, and the agent keeps its promise to wait).
        """
        round = integer("round", round)
        expires = timestamp("expires_at", expires_at)
        where = f"set_expires_at({experiment!r}, round {round})"
        with self._writing(where) as conn:
            return round_table.set_expires_at(conn, where, experiment, round, expires)

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
            return round_table.set_status(conn, experiment, round, RoundStatus(status), at, reason)

    def bump_attempt(self, experiment: str, round: int) -> int:
        """Count one more publication of the round's action and return the new attempt number.

        Call it before every publication, the first included (which makes attempt 1).

        Raises:
            IllegalTransition: the round is acked or finished, so it is not published again.
        """
        round = integer("round", round)
        with self._writing(f"bump_attempt({experiment!r}, round {round})") as conn:
            return round_table.bump_attempt(conn, experiment, round)

    def rounds(self, experiment: str) -> list[RoundRow]:
        """Every round of the experiment, by round number."""
        with self._reading("rounds") as conn:
            return round_table.select(conn, experiment, ROUND_STATUSES)

    def open_rounds(self, experiment: str) -> list[RoundRow]:
        """Rounds not closed, rejected or expired (proposed, published, acked), by round number."""
        with self._reading("rounds") as conn:
            return round_table.select(conn, experiment, OPEN_STATUSES)

    def get_round(self, experiment: str, round: int) -> RoundRow | None:
        with self._reading("get_round") as conn:
            return round_table.get(conn, experiment, round)

    # ---- readings and oracle values ----------------------------------------------------------

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
            return reading_table.add(
                conn, experiment, round, node, value, seq, device_id, received_at, measured
            )

    def readings(
        self, experiment: str, after_id: int = 0, limit: int | None = None
    ) -> list[ReadingRow]:
        """Readings with id > `after_id`, in arrival order (at most `limit` of them)."""
        after_id = integer("after_id", after_id)
        cap = None if limit is None else integer("limit", limit)
        with self._reading("readings") as conn:
            return reading_table.select(conn, experiment, after_id, cap)

    def last_reading_id(self, experiment: str) -> int:
        """The id of the experiment's newest reading, 0 if it has none."""
        with self._reading("last_reading_id") as conn:
            return reading_table.last_id(conn, experiment)

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
            return reading_table.add_oracle(
                conn, where, experiment, round, action_id, expected_reward, optimum, at
            )

    def oracles(self, experiment: str) -> list[OracleRow]:
        with self._reading("oracles") as conn:
            return reading_table.oracles(conn, experiment)

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
            return ledger_table.reserve(conn, experiment, round, amount, limit, at)

    def settle(self, experiment: str, round: int, at: float) -> bool:
        """Turn the round's reservation into a settled cost (on ack). False if already settled.

        Raises:
            IllegalTransition: no reservation, or it was released.
        """
        return self._ledger_move("settle", experiment, round, "settled", at)

    def release(self, experiment: str, round: int, at: float) -> bool:
        """Give the round's reservation back (on reject or expiry). False if already released.

        Raises:
            IllegalTransition: no reservation, or it was settled.
        """
        return self._ledger_move("release", experiment, round, "released", at)

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
            return ledger_table.charge(conn, experiment, round, at)

    def ledger(self, experiment: str) -> LedgerTotals:
        """Totals of the experiment's ledger (exactly rounded sums); `.spent` counts the budget."""
        with self._reading("ledger") as conn:
            return ledger_table.totals(conn, experiment)

    def ledger_entries(self, experiment: str) -> list[LedgerRow]:
        with self._reading("ledger_entries") as conn:
            return ledger_table.entries(conn, experiment)

    def _ledger_move(
        self, verb: str, experiment: str, round: int, to: LedgerState, at: float
    ) -> bool:
        round = integer("round", round)
        at = timestamp("at", at)
        with self._writing(f"{verb}({experiment!r}, round {round})") as conn:
            return ledger_table.move(conn, experiment, round, to, at)

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
        blobs = {
            text("array name", name): snapshot_table.encode_array(experiment, name, value)
            for name, value in arrays.items()
        }
        meta_json = json_object(meta, f"snapshot meta of experiment {experiment!r}")
        when = timestamp("at", time.time() if at is None else at)
        with self._writing(f"save_snapshot({experiment!r})") as conn:
            experiment_table.require(conn, experiment)
            return snapshot_table.save(
                conn, experiment, upto, blobs, meta_json, when, self.keep_snapshots
            )

    def latest_snapshot(self, experiment: str) -> Snapshot | None:
        """The newest snapshot of the experiment with its arrays, or None.

        Raises:
            StoreError: a stored array is not a plain ``.npy`` (it will not be unpickled).
        """
        with self._reading("latest_snapshot", consistent=True) as conn:
            return snapshot_table.latest(conn, experiment)

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
        for name, value in (("topic", topic), ("reason", reason), ("detail", detail)):
            if not isinstance(value, str):
                raise StoreError(f"dead letter {name} must be a string, got {type(value).__name__}")
        at = timestamp("at", at)
        kept = data[: self.dead_letter_payload_limit]
        with self._writing(f"add_dead_letter({experiment!r})") as conn:
            return dead_letter_table.add(
                conn,
                experiment,
                topic,
                reason,
                detail,
                kept,
                len(data),
                at,
                self.keep_dead_letters,
            )

    def dead_letters(self, experiment: str | None) -> list[DeadLetterRow]:
        """Kept dead letters of the experiment (None: those without one), oldest first."""
        with self._reading("dead_letters") as conn:
            return dead_letter_table.select(conn, experiment)

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
        export_files.check(experiment, fmt)
        with self._reading(f"export({experiment!r})", consistent=True) as conn:
            experiment_table.require(conn, experiment)
            tables = export_files.read_tables(conn, experiment)
        return export_files.write_tables(directory, experiment, fmt, tables)
