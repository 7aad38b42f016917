"""The durable store of cbo-agent: what the agent writes before it acknowledges or publishes.

A store holds experiments (their specs, the control plane's desired state and the lease of the
replica that runs each), rounds (one per proposed action, with its status and publication
attempts), readings (deduplicated by experiment, device, node and sequence number), oracle
values, the budget ledger, snapshots of model state, and a bounded list of dead letters.
`Store.export` writes an experiment's history as CSV or Parquet.

Backends
    `Store(target)` opens SQLite (a bare path, ``sqlite:///path``: one file, embedded, the
    default) or PostgreSQL (``postgresql://...``: one database shared by a fleet of replicas);
    `location` parses the target, `database.open_database` picks the backend. Both hold the same
    tables at the same schema version, migrated forward on open, and `Store` behaves the same
    on either; where they differ (threads, durability) the backend's module says so:
    `sqlite.SqliteDatabase`, `postgres.PostgresDatabase`.

Durability
    SQLite: WAL journal with ``synchronous=FULL``: a commit returns only after the WAL has been
    fsynced, so everything a method wrote outside an explicit transaction — and everything in
    a `Store.transaction` block, when the block exits — survives a crash of the process *and* a
    power loss or kernel panic. With ``synchronous=NORMAL`` WAL mode syncs only at checkpoints:
    still consistent, but the last commits before a power loss may roll back, and the agent may
    already have published an action or spent budget on their strength. The price on this
    kind of machine is a fraction of a millisecond per commit (one fsync); group writes that
    belong together in `Store.transaction` to pay it once. PostgreSQL: a commit returns after
    the server's COMMIT (with ``synchronous_commit = on``, its WAL flush).

Thread safety
    A thread's `Store.transaction` is its own: a call from another thread never slips into it
    (and never commits or rolls back with it). On SQLite the one connection is guarded by one
    re-entrant lock held for the whole block, so other threads wait; on PostgreSQL each thread
    has its own pooled connection, and waits only to write an experiment the other thread's
    open transaction has written. Keep transaction blocks short and never ``await`` inside one:
    a coroutine of the same thread would re-enter it, so the store refuses calls from another
    asyncio task while a transaction is open. Several `Store` objects or processes on one store
    are safe too: the writers of one experiment are serialized (SQLite: ``BEGIN IMMEDIATE``;
    PostgreSQL: an advisory lock per experiment), so the budget check-and-reserve cannot
    interleave; a writer waits for another at most ``timeout_s``.

Budget ledger
    `reserve` before publishing, `settle` on ack, `release` on reject or expiry. Spent means
    reserved (outstanding) + settled; a reservation that would take spent past the budget
    raises `BudgetExceeded` and writes nothing. A reservation written before a crash is still
    counted after it, so an action whose fate is unknown is paid for until it is resolved.
    `charge` is the one write that ignores the budget: it records a cost that was spent anyway
    (a device applied an action after its round expired and its reservation was released), so
    the ledger tells the truth even when that truth is an overspend.

Control plane, leases and fencing (fleets)
    `submit` an experiment's spec, `pause`, `resume` or `stop` it, read `experiments` and
    `experiment_status`: a paused or stopped experiment gets no new reservation (`NotRunning`).
    A replica takes an experiment's lease with `acquire_lease` (owner, epoch, expiry on the
    database's clock), keeps it with `renew_lease` (its heartbeat) and gives it up with
    `release_lease`; it writes through ``store.fenced(experiment, epoch)``, a view whose every
    write of that experiment is refused (`FencedError`, nothing written) once another replica
    holds a newer epoch. See `leases` for what clock skew does and does not do.

Nothing here unpickles: specs and metadata are JSON, arrays are ``.npy`` blobs written and read
with ``allow_pickle=False``.

Layout
    `Store` (here) checks each argument (`values`) and runs one function of a table module inside
    ``Database.writing`` or ``.reading`` (`database`: the contract; `sqlite` and `postgres`: the
    backends, each with its DDL in `sqlite_schema` / `postgres_schema`, versions in `schema`).
    The table modules — `experiments` (and the control plane), `leases`, `rounds` (with the
    one `RoundStatus`), `readings` (and oracle values), `ledger`, `snapshots`, `dead_letters`,
    `export` — are functions over a connection, written in SQL that both backends run (`sql`);
    they return the dataclasses of `rows` and raise the errors of `errors`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from connectors.store import dead_letters as dead_letter_table
from connectors.store import experiments as experiment_table
from connectors.store import export as export_files
from connectors.store import leases as lease_table
from connectors.store import ledger as ledger_table
from connectors.store import readings as reading_table
from connectors.store import rounds as round_table
from connectors.store import snapshots as snapshot_table
from connectors.store import visited_states as states_table
from connectors.store.database import Database, open_database
from connectors.store.errors import (
    BudgetExceeded,
    FencedError,
    IllegalTransition,
    NotRunning,
    StoreError,
)
from connectors.store.experiments import EXPERIMENT_STATES, ExperimentState
from connectors.store.export import EXPORT_TABLES, ExportFormat
from connectors.store.ledger import LedgerState
from connectors.store.location import (
    PostgresLocation,
    SqliteLocation,
    StoreLocation,
    parse_store_location,
)
from connectors.store.readings import NewReading
from connectors.store.rounds import (
    ACTION_KINDS,
    OPEN_STATUSES,
    ROUND_STATUSES,
    ROUND_TRANSITIONS,
    RoundStatus,
)
from connectors.store.rows import (
    DeadLetterRow,
    ExperimentRow,
    ExperimentStatus,
    Lease,
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
    array_columns,
    integer,
    json_object,
    node_names,
    node_values,
    number,
    text,
    timestamp,
)
from connectors.store.visited_states import StatesRow

# numpy is imported where snapshots need it, so `import connectors.store` stays light.
if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ACTION_KINDS",
    "EXPERIMENT_STATES",
    "EXPORT_TABLES",
    "MAX_INT64",
    "OPEN_STATUSES",
    "ROUND_STATUSES",
    "ROUND_TRANSITIONS",
    "BudgetExceeded",
    "DeadLetterRow",
    "ExperimentRow",
    "ExperimentState",
    "ExperimentStatus",
    "ExportFormat",
    "FencedError",
    "FencedStore",
    "IllegalTransition",
    "Lease",
    "LedgerRow",
    "LedgerState",
    "LedgerTotals",
    "NewReading",
    "NotRunning",
    "OracleRow",
    "PostgresLocation",
    "ReadingRow",
    "RoundRow",
    "RoundStatus",
    "Snapshot",
    "SqliteLocation",
    "StatesRow",
    "Store",
    "StoreError",
    "StoreLocation",
    "parse_store_location",
]


class Store:
    """The durable store, on SQLite or PostgreSQL. See the module docstring for durability,
    threading, and the fleet's leases and fencing."""

    _fence: tuple[str, int] | None = None  # (experiment, epoch) of a `fenced` view

    def __init__(
        self,
        target: str | Path,
        *,
        timeout_s: float = 10.0,
        keep_snapshots: int = 2,
        keep_dead_letters: int = 1000,
        dead_letter_payload_limit: int = 65_536,
    ) -> None:
        """Open (creating and migrating as needed) the store `target` names: a path or
        ``sqlite:///path`` (SQLite), or ``postgresql://...`` (`location` has every form).

        ``":memory:"`` gives a private in-memory SQLite store (no durability; for tests of
        callers).

        Raises:
            StoreError: `target` names no store; the file is not a database, not a cbo-agent
                store, written by newer code, or WAL mode cannot be enabled on it; the
                PostgreSQL server cannot be reached or holds another program's tables.
        """
        self.keep_snapshots = integer("keep_snapshots", keep_snapshots, lo=1)
        self.keep_dead_letters = integer("keep_dead_letters", keep_dead_letters, lo=1)
        self.dead_letter_payload_limit = integer(
            "dead_letter_payload_limit", dead_letter_payload_limit
        )
        self.location: StoreLocation = parse_store_location(target)
        self._db: Database = open_database(self.location, number("timeout_s", timeout_s))
        # The SQLite file (or ":memory:"), or the PostgreSQL URL with its password masked.
        self.path: Path | str = (
            Path(self.location.path)
            if isinstance(self.location, SqliteLocation) and self.location.path != ":memory:"
            else self.location.display
        )

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

    def size_bytes(self) -> int:
        """Bytes the store's tables and indexes take on disk."""
        return self._db.size_bytes()

    # ---- transactions ----------------------------------------------------------------------

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """Group writes into one atomic commit, durable when the outermost block exits.

        Nested blocks join the outer transaction as savepoints: an exception escaping an inner
        block undoes that block's writes only; one escaping the outer block undoes all. Other
        threads' calls never join it (on SQLite they wait until the outermost block exits).
        Write one experiment per transaction, and do not ``await`` inside.
        """
        return self._db.transaction()

    @contextlib.contextmanager
    def _writing(self, what: str, experiment: str | None = None) -> Iterator[Connection]:
        """One atomic write (a savepoint inside an open transaction); database errors named.

        Naming the `experiment` written takes its write lock first and, in a `fenced` view,
        refuses the write (`FencedError`) unless the view's epoch is still the experiment's.
        """
        with self._db.writing(what) as conn:
            if experiment is not None:
                self._db.lock_experiment(conn, experiment)
                if self._fence is not None:
                    self._check_fence(conn, experiment)
            yield conn

    def _check_fence(self, conn: Connection, experiment: str) -> None:
        assert self._fence is not None
        fenced, epoch = self._fence
        if experiment != fenced:
            raise StoreError(
                f"a store fenced for experiment {fenced!r} (epoch {epoch}) cannot write "
                f"experiment {experiment!r}"
            )
        lease_table.check_epoch(conn, experiment, epoch)

    def _reading(
        self, what: str, consistent: bool = False
    ) -> contextlib.AbstractContextManager[Connection]:
        """Reads; `consistent` wraps several SELECTs in one read transaction."""
        return self._db.reading(what, consistent)

    # ---- experiments -----------------------------------------------------------------------

    def upsert_experiment(
        self, name: str, spec: Mapping[str, Any], at: float | None = None
    ) -> None:
        """Create the experiment or replace its spec (a JSON-serializable mapping)."""
        text("experiment", name)
        spec_json = json_object(spec, f"spec of experiment {name!r}")
        when = timestamp("at", time.time() if at is None else at)
        with self._writing(f"upsert_experiment({name!r})", name) as conn:
            experiment_table.upsert(conn, name, spec_json, when)

    def experiment_names(self) -> list[str]:
        with self._reading("experiment_names") as conn:
            return experiment_table.names(conn)

    def experiment_spec(self, name: str) -> dict[str, Any] | None:
        with self._reading("experiment_spec") as conn:
            return experiment_table.spec(conn, name)

    # ---- control plane ---------------------------------------------------------------------

    def submit(self, name: str, spec: Mapping[str, Any], at: float | None = None) -> bool:
        """Add an experiment for the fleet to run (desired state running, no owner yet).

        Returns False (nothing written) if it exists with this very spec: submitting twice is
        harmless.

        Raises:
            StoreError: it exists with another spec (stop it, submit under a new name).
        """
        text("experiment", name)
        spec_json = json_object(spec, f"spec of experiment {name!r}")
        when = timestamp("at", time.time() if at is None else at)
        with self._writing(f"submit({name!r})", name) as conn:
            return experiment_table.submit(conn, name, spec_json, when)

    def experiments(self) -> list[ExperimentRow]:
        """Every experiment's desired state and lease, by name."""
        with self._reading("experiments") as conn:
            return experiment_table.rows(conn, self._db.clock(conn))

    def experiment_status(self, name: str) -> ExperimentStatus:
        """The experiment's desired state and lease, with its rounds, readings and spending.

        Raises:
            StoreError: unknown experiment.
        """
        with self._reading("experiment_status", consistent=True) as conn:
            row = experiment_table.row(conn, name, self._db.clock(conn))
            rounds, open_rounds = round_table.counts(conn, name, OPEN_STATUSES)
            return ExperimentStatus(
                row,
                rounds,
                open_rounds,
                reading_table.count(conn, name),
                ledger_table.totals(conn, name).spent,
            )

    def experiment_state(self, name: str) -> ExperimentState:
        """The experiment's desired state (running, paused, stopped): one indexed read, cheap
        enough to check before every publication.

        Raises:
            StoreError: unknown experiment.
        """
        with self._reading("experiment_state") as conn:
            return experiment_table.state_of(conn, name)

    def pause(self, name: str, at: float | None = None) -> bool:
        """No new round of the experiment gets budget until `resume`; rounds in flight go on
        and late feedback is still stored. False if it is paused already.

        Raises:
            StoreError: unknown or stopped experiment.
        """
        return self._set_state("pause", name, "paused", at)

    def resume(self, name: str, at: float | None = None) -> bool:
        """Run a paused experiment again. False if it is running already.

        Raises:
            StoreError: unknown or stopped experiment.
        """
        return self._set_state("resume", name, "running", at)

    def stop(self, name: str, at: float | None = None) -> bool:
        """Stop the experiment for good: no round of it gets budget again (`NotRunning`), no
        replica acquires it; its history stays. False if it is stopped already.

        Raises:
            StoreError: unknown experiment.
        """
        return self._set_state("stop", name, "stopped", at)

    def _set_state(self, verb: str, name: str, to: ExperimentState, at: float | None) -> bool:
        text("experiment", name)
        when = timestamp("at", time.time() if at is None else at)
        with self._writing(f"{verb}({name!r})", name) as conn:
            return experiment_table.set_state(conn, name, to, when)

    # ---- leases and fencing ----------------------------------------------------------------

    def acquire_lease(self, experiment: str, owner: str, ttl_s: float) -> Lease | None:
        """Take the experiment's lease for `ttl_s` seconds of the database's clock, if it is
        unowned, expired, or `owner`'s own; the epoch goes up by one. None if another owner's
        lease is live or the experiment is stopped.

        Raises:
            StoreError: unknown experiment; a `ttl_s` that is not a positive number.
        """
        text("owner", owner)
        ttl = _ttl(ttl_s)
        with self._writing(f"acquire_lease({experiment!r})", experiment) as conn:
            return lease_table.acquire(conn, experiment, owner, ttl, self._db.clock(conn))

    def renew_lease(self, experiment: str, owner: str, epoch: int, ttl_s: float) -> Lease:
        """Extend `owner`'s lease to `ttl_s` from now (the database's clock); the returned
        lease carries the desired state, so the heartbeat also hears pause and stop.

        Raises:
            FencedError: the lease was lost (another owner or epoch holds it).
            StoreError: unknown experiment; a bad `ttl_s`.
        """
        text("owner", owner)
        epoch = integer("epoch", epoch)
        ttl = _ttl(ttl_s)
        with self._writing(f"renew_lease({experiment!r})", experiment) as conn:
            return lease_table.renew(conn, experiment, owner, epoch, ttl, self._db.clock(conn))

    def release_lease(self, experiment: str, owner: str, epoch: int) -> bool:
        """Give the lease up so another replica may take the experiment at once. False
        (nothing written) if it is not `owner`'s of this epoch any more."""
        text("owner", owner)
        epoch = integer("epoch", epoch)
        with self._writing(f"release_lease({experiment!r})", experiment) as conn:
            return lease_table.release(conn, experiment, owner, epoch)

    def claimable(self, limit: int | None = None) -> list[str]:
        """Experiments a replica may `acquire_lease` now: not stopped, unowned or expired by the
        database's clock; those waiting longest first. Another replica may take one first:
        `acquire_lease` decides."""
        cap = None if limit is None else integer("limit", limit)
        with self._reading("claimable") as conn:
            return lease_table.claimable(conn, self._db.clock(conn), cap)

    def fenced(self, experiment: str, epoch: int) -> FencedStore:
        """A view of this store whose writes of `experiment` carry `epoch`.

        It has every method of `Store` with the same arguments, so the code that runs an
        experiment takes it in place of the store and passes its epoch nowhere else. Each write
        of the experiment checks, in its own transaction and under the experiment's write
        lock, that `epoch` is still the experiment's, and raises `FencedError` (nothing
        written) once another replica has acquired it. Writes of another experiment are
        refused; reads and dead letters without an experiment pass through. The view shares
        this store's connections: closing it leaves the store open.
        """
        return FencedStore(self, text("experiment", experiment), integer("epoch", epoch))

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
        with self._writing(where, experiment) as conn:
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
        with self._writing(f"set_applied({experiment!r}, round {round})", experiment) as conn:
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
        with self._writing(where, experiment) as conn:
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
        with self._writing(f"set_round_status({experiment!r}, round {round})", experiment) as conn:
            return round_table.set_status(conn, experiment, round, RoundStatus(status), at, reason)

    def bump_attempt(self, experiment: str, round: int) -> int:
        """Count one more publication of the round's action and return the new attempt number.

        Call it before every publication, the first included (which makes attempt 1).

        Raises:
            IllegalTransition: the round is acked or finished, so it is not published again.
        """
        round = integer("round", round)
        with self._writing(f"bump_attempt({experiment!r}, round {round})", experiment) as conn:
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
        variance: float | None = None,
        replications: int | None = None,
        array: Any = None,
    ) -> bool:
        """Store one reading. False (nothing written) if (experiment, device_id, node, seq) is
        already stored, whatever its other fields. A mean over replications may carry the
        variance of the mean and their count (multi-fidelity trials). An array reading passes
        its `array` (numpy, float32 or float64, finite) and, as `value`, its mean.

        Raises:
            StoreError: unknown round (readings name a round the store knows), non-finite value,
                an array that is not float32/float64 or holds a non-finite element.
        """
        row = _checked_reading(
            NewReading(
                round,
                node,
                value,
                seq,
                device_id,
                received_at,
                measured_at,
                variance,
                replications,
                array,
            )
        )
        with self._writing(
            f"add_reading({experiment!r}, round {row.round}, {row.node!r})", experiment
        ) as conn:
            return reading_table.add(conn, experiment, *row.arguments())

    def add_readings(self, experiment: str, readings: Sequence[NewReading]) -> bool:
        """Store a batch of readings with one statement, all or none: True if every one was new
        and is stored; False, nothing written, if any of them is already stored or two of them
        share a key — then `add_reading` each, in order, to learn which are new (a batch of new
        readings, the common case, costs one INSERT for all of them and one check of their
        rounds, where `add_reading` costs four statements each).

        Raises:
            StoreError: as `add_reading`, for any of them (all are checked before any write).
        """
        rows = [_checked_reading(reading) for reading in readings]
        if not rows:
            return True
        what = f"add_readings({experiment!r}, {len(rows)} readings)"
        try:
            # its own transaction, a savepoint if nested (PostgreSQL's nested writes have none)
            with self.transaction(), self._writing(what, experiment) as conn:
                if reading_table.add_many(conn, experiment, rows) != len(rows):
                    raise _NotAllNew  # undoes the batch's writes only
        except _NotAllNew:
            return False
        return True

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

    def add_states(
        self, experiment: str, round: int, device_id: str, states: Any, received_at: float
    ) -> bool:
        """Store the states (numpy, (T, agents, obs), float32 or float64, finite) a device's
        controller visited in the round's episode; False (nothing written) if the round already
        has a trace from this device.

        Raises:
            StoreError: unknown round, or an array that is not float32/float64 or not finite.
        """
        round = integer("round", round)
        device_id = text("device_id", device_id)
        when = timestamp("received_at", received_at)
        packed = array_columns(states)
        with self._writing(f"add_states({experiment!r}, round {round})", experiment) as conn:
            return states_table.add(conn, experiment, round, device_id, packed, when)

    def visited_states(self, experiment: str) -> list[StatesRow]:
        """The experiment's stored traces of visited states, in arrival order."""
        with self._reading("visited_states") as conn:
            return states_table.select(conn, experiment)

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
        with self._writing(where, experiment) as conn:
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

        The check and the insert are one transaction under the experiment's write lock, so
        concurrent reservers (threads, processes, replicas) never jointly overspend.
        `budget_total` None means no limit (still recorded). Returns False (nothing written)
        if the round already holds this same reservation.

        Raises:
            BudgetExceeded: settled + reserved + amount > budget_total; nothing is written.
            NotRunning: the experiment is paused or stopped (`pause`, `stop`); nothing written.
            IllegalTransition: the round's entry is settled, released or of another amount.
            StoreError: unknown round; negative or non-finite amount.
        """
        round = integer("round", round)
        amount = number("amount", amount, nonneg=True)
        limit = None if budget_total is None else number("budget_total", budget_total, nonneg=True)
        at = timestamp("at", at)
        with self._writing(f"reserve({experiment!r}, round {round})", experiment) as conn:
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
        with self._writing(f"charge({experiment!r}, round {round})", experiment) as conn:
            return ledger_table.charge(conn, experiment, round, at)

    def settle_used(self, experiment: str, round: int, used: float, at: float) -> bool:
        """Settle only `used` of the round's reservation and release the rest: a multi-fidelity
        trial that ran q' < q replications costs what it used. From reserved or settled (the
        ack came first); False (nothing written) if the entry already holds `used`.

        Raises:
            IllegalTransition: no entry, a released one, or `used` above what was reserved.
            StoreError: negative or non-finite `used`.
        """
        round = integer("round", round)
        used = number("used", used, nonneg=True)
        at = timestamp("at", at)
        with self._writing(f"settle_used({experiment!r}, round {round})", experiment) as conn:
            return ledger_table.settle_used(conn, experiment, round, used, at)

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
        with self._writing(f"{verb}({experiment!r}, round {round})", experiment) as conn:
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
        with self._writing(f"save_snapshot({experiment!r})", experiment) as conn:
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
        with self._writing(f"add_dead_letter({experiment!r})", experiment) as conn:
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
        """Write the experiment's rounds, readings, oracle values, ledger and visited states, one
        file each.

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


class FencedStore(Store):
    """`Store.fenced`'s view: the store it was made from, with every write of one experiment
    fenced by a lease epoch."""

    def __init__(self, store: Store, experiment: str, epoch: int) -> None:  # no super(): a view
        self.__dict__.update(vars(store))
        self._fence = (experiment, epoch)

    @property
    def experiment(self) -> str:
        assert self._fence is not None
        return self._fence[0]

    @property
    def epoch(self) -> int:
        assert self._fence is not None
        return self._fence[1]

    def close(self) -> None:
        """Nothing: the store this view was made from owns the connections."""

    def __repr__(self) -> str:
        return f"FencedStore({str(self.path)!r}, {self.experiment!r}, epoch {self.epoch})"


class _NotAllNew(Exception):
    """`add_readings`: a reading of the batch was stored already; the batch is rolled back."""


def _checked_reading(reading: NewReading) -> NewReading:
    """The reading as the store keeps it (its array packed: dtype, shape, bytes), or
    StoreError naming the bad field."""
    round = integer("round", reading.round)
    node = text("node", reading.node)
    value = number("value", reading.value)
    seq = integer("seq", reading.seq)
    device_id = text("device_id", reading.device_id)
    received_at = timestamp("received_at", reading.received_at)
    measured, variance, count = reading.measured_at, reading.variance, reading.replications
    measured = None if measured is None else timestamp("measured_at", measured)
    variance = None if variance is None else number("variance", variance, nonneg=True)
    count = None if count is None else integer("replications", count)
    if count is not None and count < 1:
        raise StoreError(f"replications must be at least 1, got {count}")
    packed = None if reading.array is None else array_columns(reading.array)
    return NewReading(
        round, node, value, seq, device_id, received_at, measured, variance, count, packed
    )


def _ttl(ttl_s: float) -> float:
    """A lease TTL: a positive number of seconds."""
    ttl = number("ttl_s", ttl_s)
    if ttl <= 0:
        raise StoreError(f"ttl_s must be > 0, got {ttl!r}")
    return ttl
