"""The durable store on both backends (SQLite, PostgreSQL): round trips, duplicates, the budget
ledger under threads, processes and kill -9, atomic transactions, migrations (and openers racing
to run them), snapshots without pickle, bounded dead letters and export."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import csv
import importlib.util
import json
import math
import pickle
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.store import (
    EXPERIMENT_STATES,
    EXPORT_TABLES,
    ROUND_STATUSES,
    ROUND_TRANSITIONS,
    BudgetExceeded,
    IllegalTransition,
    NewReading,
    PostgresLocation,
    RoundStatus,
    SqliteLocation,
    Store,
    StoreError,
    parse_store_location,
    postgres_schema,
    schema,
    sqlite_schema,
)
from connectors.store.ledger import LEDGER_STATES
from tests.stores import RawDatabase, StoreChild

REPO = Path(__file__).resolve().parents[1]
EXP = "toy-chain"
SPEC = {"nodes": ["X", "Y"], "budget": {"total": 10.0}, "note": "ünïcode"}


@pytest.fixture
def db(store_target: str) -> str:
    """The test's store, once per backend: an SQLite path or a scratch PostgreSQL URL."""
    return store_target


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Path:
    """An SQLite store file, for what only SQLite has (PRAGMAs, a file to corrupt)."""
    return tmp_path / "store.db"


def migrations_of(db: str) -> object:
    """The schema module whose MIGRATIONS the store at `db` runs."""
    return postgres_schema if db.startswith("postgresql:") else sqlite_schema


@pytest.fixture
def store(db: Path) -> Iterator[Store]:
    with Store(db) as opened:
        opened.upsert_experiment(EXP, SPEC)
        yield opened


def add_rounds(store: Store, n: int, experiment: str = EXP, cost: float = 1.0) -> None:
    for r in range(n):
        store.add_round(experiment, r, f"{experiment}-a{r}", {"X": r / 2}, ["X"], cost, "hard", r)


# ---- locations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "kind", "where"),
    [
        ("agent.sqlite", SqliteLocation, Path("agent.sqlite")),
        ("/var/lib/cbo/agent.sqlite", SqliteLocation, Path("/var/lib/cbo/agent.sqlite")),
        ("notes:v2.sqlite", SqliteLocation, Path("notes:v2.sqlite")),  # a colon, no URL
        (":memory:", SqliteLocation, ":memory:"),
        ("sqlite:///var/lib/cbo/agent.sqlite", SqliteLocation, Path("/var/lib/cbo/agent.sqlite")),
        ("sqlite:////var/lib/agent.sqlite", SqliteLocation, Path("/var/lib/agent.sqlite")),
        ("sqlite:data/agent.sqlite", SqliteLocation, Path("data/agent.sqlite")),
        ("sqlite::memory:", SqliteLocation, ":memory:"),
        ("postgresql://cbo@db:5432/fleet", PostgresLocation, "postgresql://cbo@db:5432/fleet"),
        (
            "postgres://db/fleet?sslmode=require",
            PostgresLocation,
            "postgres://db/fleet?sslmode=require",
        ),
    ],
)
def test_a_store_is_named_by_a_path_or_a_url(target: str, kind: type, where: object) -> None:
    location = parse_store_location(target)
    assert isinstance(location, kind)
    assert (location.path if isinstance(location, SqliteLocation) else location.conninfo) == where


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("mysql://root:hunter2@db/x", "unknown store scheme 'mysql' in 'mysql://root:***@db/x'"),
        ("sqlite://db-host/agent.sqlite", "a local file, not on host 'db-host'"),
        ("sqlite:///", "name a file"),
        ("postgresql:fleet", "write postgresql://user@host:port/database"),
        ("postgresql://cbo:hunter2@db:port/fleet", "'postgresql://cbo:***@db:port/fleet'"),
        ("", "store must be a path"),
    ],
)
def test_a_bad_store_name_is_one_line_without_its_password(target: str, message: str) -> None:
    with pytest.raises(StoreError, match=re.escape(message)) as refused:
        parse_store_location(target)
    assert "hunter2" not in str(refused.value) and "\n" not in str(refused.value)


def test_a_postgres_password_is_masked_wherever_the_store_is_shown() -> None:
    location = parse_store_location("postgresql://cbo:hunter2@db:5432/fleet?sslmode=require")
    assert isinstance(location, PostgresLocation)
    assert location.display == "postgresql://cbo:***@db:5432/fleet?sslmode=require"


# ---- round trips ----------------------------------------------------------------------------


def test_every_kind_of_row_round_trips_through_a_reopen(db: str) -> None:
    with Store(db) as store:
        store.upsert_experiment(EXP, SPEC)
        store.upsert_experiment("other", {})
        assert store.add_round(EXP, 0, "a0", {"X": 0.75, "Z": -1.25}, ["X", "Z"], 2.5, "soft", 1.0)
        assert store.set_round_status(EXP, 0, "published", 2.0)
        assert store.bump_attempt(EXP, 0) == 1
        assert store.bump_attempt(EXP, 0) == 2
        assert store.reserve(EXP, 0, 2.5, 10.0, 1.5)
        assert store.add_reading(EXP, 0, "Y", 3.4187, 1042, "sensor-7", 3.0, measured_at=2.9)
        assert store.add_reading(EXP, 0, "X", -0.0, 0, "sensor-7", 3.1)
        assert store.add_oracle(EXP, 0, "a0", 3.35, 4.1, 3.2)
        sid = store.save_snapshot(EXP, 2, {"L": np.eye(2)}, {"n": 2, "nodes": ["X", "Y"]}, at=4.0)
        dl = store.add_dead_letter(EXP, "cbo/toy-chain/reading", "invalid", "bad", b"{\xff", 5.0)

    with Store(db) as store:
        assert store.experiment_names() == ["other", EXP]
        assert store.experiment_spec(EXP) == SPEC and store.experiment_spec("nope") is None
        (row,) = store.rounds(EXP)
        assert row == store.get_round(EXP, 0)
        assert (row.round, row.action_id, row.kind, row.cost) == (0, "a0", "soft", 2.5)
        assert row.intervention == {"X": 0.75, "Z": -1.25} and row.target_set == ["X", "Z"]
        assert (row.status, row.attempt, row.proposed_at, row.status_at) == ("published", 2, 1, 2)
        first, second = store.readings(EXP)
        assert (first.node, first.value, first.seq, first.device_id) == (
            "Y",
            3.4187,
            1042,
            "sensor-7",
        )
        assert (first.received_at, first.measured_at) == (3.0, 2.9)
        # SQLite keeps integral REALs as integers on disk, so -0.0 may read back as 0.0 (equal).
        assert second.measured_at is None and second.value == 0.0
        assert first.id < second.id and store.last_reading_id(EXP) == second.id
        assert store.readings(EXP, after_id=first.id) == [second]
        assert store.readings(EXP, limit=1) == [first] and store.readings("other") == []
        (oracle,) = store.oracles(EXP)
        assert (oracle.action_id, oracle.expected_reward, oracle.optimum, oracle.at) == (
            "a0", 3.35, 4.1, 3.2,
        )  # fmt: skip
        (entry,) = store.ledger_entries(EXP)
        assert (entry.amount, entry.state, entry.budget_total, entry.reserved_at) == (
            2.5, "reserved", 10.0, 1.5,
        )  # fmt: skip
        totals = store.ledger(EXP)
        assert (totals.reserved, totals.settled, totals.released, totals.spent) == (2.5, 0, 0, 2.5)
        snap = store.latest_snapshot(EXP)
        assert snap is not None and (snap.id, snap.upto_reading_id, snap.created_at) == (sid, 2, 4)
        assert snap.meta == {"n": 2, "nodes": ["X", "Y"]}
        assert np.array_equal(snap.arrays["L"], np.eye(2))
        assert store.latest_snapshot("other") is None
        (letter,) = store.dead_letters(EXP)
        assert (letter.id, letter.topic, letter.reason, letter.detail) == (
            dl, "cbo/toy-chain/reading", "invalid", "bad",
        )  # fmt: skip
        assert (letter.payload, letter.payload_size, letter.at) == (b"{\xff", 2, 5.0)
        assert store.schema_version == schema.schema_version()


def test_sqlite_runs_in_wal_with_full_sync_and_foreign_keys(sqlite_db: Path) -> None:
    with Store(sqlite_db) as store:
        conn = store._db.live()  # type: ignore[attr-defined]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0


@pytest.mark.integration
def test_postgres_never_commits_a_transaction_a_failed_statement_aborted(
    postgres_target: str,
) -> None:
    """A write inside a PostgreSQL transaction has no savepoint of its own: a statement the
    server refuses aborts the transaction, and its block raises instead of committing."""
    with Store(postgres_target) as store:
        store.upsert_experiment(EXP, SPEC)
        with pytest.raises(StoreError, match="rolled back: a statement in it failed"):  # noqa: SIM117
            with store.transaction():
                add_rounds(store, 1)
                with (
                    pytest.raises(StoreError, match="division by zero"),
                    store._writing("x") as conn,
                ):
                    conn.execute("SELECT 1 / 0")
        assert store.rounds(EXP) == []
        add_rounds(store, 1)  # and the store goes on
        assert len(store.rounds(EXP)) == 1


@pytest.mark.integration
def test_postgres_waits_bounded_and_commits_synchronously(postgres_target: str) -> None:
    with Store(postgres_target, timeout_s=3.0) as store, store._reading("settings") as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('lock_timeout', "
                "'idle_in_transaction_session_timeout', 'synchronous_commit')"
            ).fetchall()
        )
    assert settings == {
        "lock_timeout": "3000",  # a writer waits for another at most timeout_s
        "idle_in_transaction_session_timeout": "1500",  # a frozen holder loses its locks
        "synchronous_commit": "on",  # a commit returns once the WAL is flushed
    }


def test_upsert_replaces_a_spec(store: Store) -> None:
    store.upsert_experiment(EXP, {"v": 2})
    assert store.experiment_spec(EXP) == {"v": 2} and store.experiment_names() == [EXP]


# ---- duplicates and bad input ---------------------------------------------------------------


def test_duplicate_readings_are_rejected_and_write_nothing(store: Store) -> None:
    add_rounds(store, 2)
    assert store.add_reading(EXP, 0, "Y", 1.0, 7, "s1", 1.0)
    # Same (experiment, device, node, seq): dropped whatever the other fields say.
    assert not store.add_reading(EXP, 1, "Y", 99.0, 7, "s1", 2.0)
    assert [(r.round, r.value) for r in store.readings(EXP)] == [(0, 1.0)]
    # Any other identity is a new reading.
    assert store.add_reading(EXP, 0, "Y", 1.0, 8, "s1", 1.0)
    assert store.add_reading(EXP, 0, "Y", 1.0, 7, "s2", 1.0)
    assert store.add_reading(EXP, 0, "X", 1.0, 7, "s1", 1.0)
    store.upsert_experiment("e2", {})
    add_rounds(store, 1, "e2")
    assert store.add_reading("e2", 0, "Y", 1.0, 7, "s1", 1.0)
    assert len(store.readings(EXP)) == 4 and len(store.readings("e2")) == 1


class _CountingConnection:
    """A connection that counts the statements the table modules run through it."""

    def __init__(self, conn: object, counts: Counter[str]) -> None:
        self._conn, self._counts = conn, counts

    def execute(self, *args: object) -> object:
        self._counts["execute"] += 1
        return self._conn.execute(*args)  # type: ignore[attr-defined]

    def executemany(self, *args: object) -> object:
        self._counts["executemany"] += 1
        return self._conn.executemany(*args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)


def count_statements(store: Store, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Statements (execute, executemany) the store's writes run from now on, either backend."""
    counts: Counter[str] = Counter()
    db = store._db
    writing = db.writing

    @contextlib.contextmanager
    def counted(what: str) -> Iterator[object]:
        with writing(what) as conn:
            yield _CountingConnection(conn, counts)

    monkeypatch.setattr(db, "writing", counted)
    return counts


def batch_of(rounds: range, nodes: str = "XY", seq0: int = 0) -> list[NewReading]:
    return [
        NewReading(r, node, r + k / 4, seq0 + len(nodes) * r + k, "dev", 100.0 + r, 99.0 + r)
        for r in rounds
        for k, node in enumerate(nodes)
    ]


def test_a_batch_of_readings_costs_the_same_statements_at_any_size(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ingest path's store cost: one check of the batch's rounds and one INSERT for all of
    its readings, however many (add_reading pays statements per reading)."""
    add_rounds(store, 300)
    counts = count_statements(store, monkeypatch)
    assert store.add_readings(EXP, batch_of(range(0, 1)))
    small = dict(counts)
    counts.clear()
    assert store.add_readings(EXP, batch_of(range(1, 300)))  # 598 readings, 299 rounds
    assert dict(counts) == small and counts["executemany"] == 1 and counts["execute"] <= 2
    store.add_round(EXP, 300, "a300", {}, [], 1.0, "hard", 1.0)
    counts.clear()
    for row in batch_of(range(300, 301), seq0=10_000):
        store.add_reading(EXP, row.round, row.node, row.value, row.seq, row.device_id, 1.0)
    assert sum(counts.values()) >= 2 * 2  # a round check and an insert per reading
    rows = store.readings(EXP)
    expected = [
        (b.round, b.node, b.value, b.seq, b.received_at, b.measured_at)
        for b in batch_of(range(300))
    ]
    assert [
        (r.round, r.node, r.value, r.seq, r.received_at, r.measured_at) for r in rows[:600]
    ] == expected
    assert [r.id for r in rows] == sorted(r.id for r in rows)  # arrival order, as sent


def test_a_batch_holding_a_stored_reading_writes_nothing_and_says_so(store: Store) -> None:
    add_rounds(store, 3)
    assert store.add_reading(EXP, 0, "Y", 1.0, 7, "s1", 1.0)
    repeat = [NewReading(1, "Y", 2.0, 8, "s1", 2.0), NewReading(2, "Y", 3.0, 7, "s1", 2.0)]
    with store.transaction():
        store.set_round_status(EXP, 2, "published", 1.0)  # kept: only the batch is undone
        assert not store.add_readings(EXP, repeat)  # seq 7 of s1's Y is stored
    twice = [NewReading(1, "Y", 2.0, 9, "s1", 2.0)] * 2
    assert not store.add_readings(EXP, twice)  # two readings of the batch share a key
    assert [r.seq for r in store.readings(EXP)] == [7]
    assert store.get_round(EXP, 2).status == "published"
    with pytest.raises(StoreError, match=f"unknown round 9 of experiment '{EXP}'"):
        store.add_readings(EXP, [NewReading(1, "Y", 2.0, 10, "s1", 2.0), *batch_of(range(9, 10))])
    with pytest.raises(StoreError, match="value must be finite"):
        store.add_readings(
            EXP,
            [NewReading(1, "Y", 2.0, 11, "s1", 2.0), NewReading(1, "X", math.nan, 12, "s1", 2.0)],
        )
    assert [r.seq for r in store.readings(EXP)] == [7] and store.add_readings(EXP, [])
    arrays = [NewReading(1, "Y", 0.5, 13, "s1", 2.0, array=np.array([0.25, 0.75]))]
    assert store.add_readings(EXP, arrays)
    assert store.readings(EXP)[-1].array().tolist() == [0.25, 0.75]


def test_round_and_oracle_retries_are_idempotent_and_conflicts_raise(store: Store) -> None:
    assert store.add_round(EXP, 0, "a0", {}, [], 0.0, "hard", 1.0)
    assert not store.add_round(EXP, 0, "a0", {}, [], 0.0, "hard", 9.0)
    with pytest.raises(StoreError, match=r"round 0.*already holds action 'a0'"):
        store.add_round(EXP, 0, "b0", {}, [], 0.0, "hard", 1.0)
    with pytest.raises(StoreError, match="action_id 'a0' already used"):
        store.add_round(EXP, 1, "a0", {}, [], 0.0, "hard", 1.0)
    assert store.add_oracle(EXP, 0, "a0", 1.0, 2.0, 1.0)
    assert not store.add_oracle(EXP, 0, "a0", 5.0, 6.0, 2.0)
    assert [(o.expected_reward, o.optimum) for o in store.oracles(EXP)] == [(1.0, 2.0)]
    with pytest.raises(StoreError, match="'zz' is not the round's 'a0'"):
        store.add_oracle(EXP, 0, "zz", 1.0, 2.0, 1.0)


def test_unknown_names_and_bad_values_raise_errors_that_name_them(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown experiment 'ghost'"):
        store.add_round("ghost", 0, "a0", {}, [], 0.0, "hard", 1.0)
    add_rounds(store, 1)
    with pytest.raises(StoreError, match=f"unknown round 5 of experiment '{EXP}'"):
        store.add_reading(EXP, 5, "Y", 1.0, 0, "s", 1.0)
    with pytest.raises(StoreError, match="value must be finite"):
        store.add_reading(EXP, 0, "Y", math.nan, 0, "s", 1.0)
    with pytest.raises(StoreError, match="seq must be in"):
        store.add_reading(EXP, 0, "Y", 1.0, -1, "s", 1.0)
    with pytest.raises(StoreError, match="round must be an integer"):
        store.add_reading(EXP, True, "Y", 1.0, 0, "s", 1.0)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="kind must be one of"):
        store.add_round(EXP, 1, "a1", {}, [], 0.0, "gentle", 1.0)
    with pytest.raises(StoreError, match=r"intervention\['X'\] must be finite"):
        store.add_round(EXP, 1, "a1", {"X": math.inf}, ["X"], 0.0, "hard", 1.0)
    with pytest.raises(StoreError, match="cost must be >= 0"):
        store.add_round(EXP, 1, "a1", {}, [], -1.0, "hard", 1.0)
    with pytest.raises(StoreError, match="not JSON-serializable"):
        store.upsert_experiment("bad", {"x": math.nan})
    assert store.experiment_names() == [EXP] and len(store.rounds(EXP)) == 1
    assert store.readings(EXP) == []


# ---- rounds ---------------------------------------------------------------------------------


def test_round_status_follows_its_state_machine(store: Store) -> None:
    add_rounds(store, 4)
    assert store.set_round_status(EXP, 0, "published", 1.0)
    assert not store.set_round_status(EXP, 0, "published", 2.0)  # a repeat is a no-op
    assert store.get_round(EXP, 0).status_at == 1.0  # type: ignore[union-attr]
    assert store.set_round_status(EXP, 0, "acked", 3.0)
    assert store.set_round_status(EXP, 0, "closed", 4.0)
    with pytest.raises(IllegalTransition, match=f"round 0 of experiment '{EXP}'.*'closed'"):
        store.set_round_status(EXP, 0, "acked", 5.0)
    with pytest.raises(IllegalTransition):
        store.bump_attempt(EXP, 0)
    assert store.set_round_status(EXP, 1, "acked", 1.0)  # the ack of a crash-lost publication
    assert store.set_round_status(EXP, 2, "rejected", 1.0, reason="X3 below limit")
    assert store.get_round(EXP, 2).reason == "X3 below limit"  # type: ignore[union-attr]
    with pytest.raises(IllegalTransition):
        store.set_round_status(EXP, 2, "published", 2.0)
    with pytest.raises(IllegalTransition):
        store.set_round_status(EXP, 3, "closed", 2.0)  # never published
    with pytest.raises(StoreError, match="unknown round status 'done'"):
        store.set_round_status(EXP, 3, "done", 2.0)
    with pytest.raises(StoreError, match="unknown round 9"):
        store.set_round_status(EXP, 9, "published", 2.0)
    assert [(r.round, r.status) for r in store.open_rounds(EXP)] == [(1, "acked"), (3, "proposed")]
    # Late readings for a closed round still count.
    assert store.add_reading(EXP, 0, "Y", 1.0, 0, "s", 9.0)


def test_round_ledger_and_experiment_states_are_the_ones_the_schema_allows(store: Store) -> None:
    # One list each for the project; the schema's CHECK constraints froze them (migrations 1, 3).
    assert ROUND_STATUSES == tuple(RoundStatus) == schema.ROUND_STATUSES
    assert set(ROUND_TRANSITIONS) == set(RoundStatus)
    assert LEDGER_STATES == schema.LEDGER_STATES
    assert EXPERIMENT_STATES == schema.EXPERIMENT_STATES
    add_rounds(store, 1)
    assert store.set_round_status(EXP, 0, RoundStatus.PUBLISHED, 1.0)
    assert RoundStatus(store.get_round(EXP, 0).status) is RoundStatus.PUBLISHED  # type: ignore[union-attr]


# ---- ledger ---------------------------------------------------------------------------------


def test_ledger_reserve_settle_release(store: Store) -> None:
    add_rounds(store, 5)
    assert store.reserve(EXP, 0, 4.0, 10.0, 1.0)
    assert store.reserve(EXP, 1, 5.0, 10.0, 1.0)
    with pytest.raises(BudgetExceeded, match=f"'{EXP}'.*round 2 needs 2.0.*9.0 of 10.0") as info:
        store.reserve(EXP, 2, 2.0, 10.0, 1.0)
    assert (info.value.spent, info.value.budget_total) == (9.0, 10.0)
    assert store.ledger_entries(EXP)[-1].round == 1  # the refusal wrote nothing
    assert not store.reserve(EXP, 0, 4.0, 10.0, 2.0)  # same reservation again: no-op
    with pytest.raises(IllegalTransition):
        store.reserve(EXP, 0, 3.0, 10.0, 2.0)
    assert store.settle(EXP, 0, 3.0) and not store.settle(EXP, 0, 4.0)
    assert store.release(EXP, 1, 3.0) and not store.release(EXP, 1, 4.0)
    with pytest.raises(IllegalTransition, match="'settled' to 'released'"):
        store.release(EXP, 0, 5.0)
    with pytest.raises(IllegalTransition, match="'released' to 'settled'"):
        store.settle(EXP, 1, 5.0)
    with pytest.raises(IllegalTransition, match="'unreserved' to 'settled'"):
        store.settle(EXP, 3, 5.0)
    with pytest.raises(IllegalTransition):
        store.reserve(EXP, 1, 5.0, 10.0, 5.0)  # a released round is not reserved again
    assert store.reserve(EXP, 2, 6.0, 10.0, 6.0)  # the released 5.0 is free again
    totals = store.ledger(EXP)
    assert (totals.reserved, totals.settled, totals.released, totals.spent) == (6, 4, 5, 10)
    assert store.reserve(EXP, 3, 1e9, None, 7.0)  # no limit: recorded all the same
    with pytest.raises(StoreError, match="unknown round 7"):
        store.reserve(EXP, 7, 1.0, None, 7.0)
    with pytest.raises(StoreError, match="amount must be finite"):
        store.reserve(EXP, 4, math.inf, None, 7.0)


def test_ledger_sums_are_exactly_rounded(store: Store) -> None:
    add_rounds(store, 11)
    for r in range(10):  # 0.1 added ten times naively is 0.9999999999999999
        store.reserve(EXP, r, 0.1, 1.0, 0.0)
    assert store.ledger(EXP).spent == 1.0
    with pytest.raises(BudgetExceeded):
        store.reserve(EXP, 10, 1e-12, 1.0, 0.0)


@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "store-per-thread"])
def test_concurrent_reservers_never_overspend(db: str, shared: bool) -> None:
    threads_n, rounds_each, budget = 8, 6, 10.0
    with Store(db) as setup:
        setup.upsert_experiment(EXP, {})
        add_rounds(setup, threads_n * rounds_each)
    stores = [Store(db)] * threads_n if shared else [Store(db) for _ in range(threads_n)]
    barrier = threading.Barrier(threads_n)
    outcomes: list[str] = []
    lock = threading.Lock()

    def reserver(k: int) -> None:
        barrier.wait()
        for i in range(rounds_each):
            try:
                stores[k].reserve(EXP, k * rounds_each + i, 1.0, budget, time.time())
                result = "ok"
            except BudgetExceeded:
                result = "refused"
            with lock:
                outcomes.append(result)

    workers = [threading.Thread(target=reserver, args=(k,)) for k in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    for s in set(stores):
        s.close()
    assert len(outcomes) == threads_n * rounds_each
    with Store(db) as store:
        assert outcomes.count("ok") == 10 == len(store.ledger_entries(EXP))
        assert store.ledger(EXP).spent == budget


# ---- kill -9 --------------------------------------------------------------------------------

RESERVE_THEN_WAIT = """
import sys, time
from connectors.store import Store
store = Store(sys.argv[1])
store.upsert_experiment("toy-chain", {})
with store.transaction():
    store.add_round("toy-chain", 0, "a0", {"X": 1.0}, ["X"], 7.0, "hard", 1.0)
    store.reserve("toy-chain", 0, 7.0, 10.0, 1.0)
print("@ reserved", flush=True)
time.sleep(60)  # killed here, before publishing and before any ack could settle
"""

STREAM_WRITES = """
import sys
from connectors.store import Store
store = Store(sys.argv[1])
store.upsert_experiment("toy-chain", {})
for i in range(1_000_000):
    with store.transaction():
        store.add_round("toy-chain", i, f"a{i}", {"X": i * 0.5}, ["X"], 1.0, "hard", float(i))
        store.reserve("toy-chain", i, 1.0, None, float(i))
        store.add_reading("toy-chain", i, "Y", i + 0.25, i, "tx", float(i))
    print("@ t", i, flush=True)
    store.add_reading("toy-chain", i, "Y", -i - 0.5, i, "solo", float(i))
    print("@ s", i, flush=True)
"""


# A batch per transaction, as the agent's ingest writes them: a round and its 8 readings in one
# INSERT (`add_readings`), then printed once committed.
BATCH_WRITES = """
import sys
from connectors.store import NewReading, Store
store = Store(sys.argv[1])
store.upsert_experiment("toy-chain", {})
for i in range(1_000_000):
    with store.transaction():
        store.add_round("toy-chain", i, f"a{i}", {"X": 0.5}, ["X"], 1.0, "hard", float(i))
        batch = [NewReading(i, n, i + k / 8, i, "dev", float(i)) for k, n in enumerate("ABCDEFGH")]
        assert store.add_readings("toy-chain", batch)
    print("@ b", i, flush=True)
"""


# Two processes reserve rounds of the same experiments at once, each its own half of the
# rounds, in the same order: every experiment's budget runs out while both are reserving.
RESERVE_RACE = """
import sys
from connectors.store import BudgetExceeded, Store
store, half = Store(sys.argv[1]), int(sys.argv[2])
print("@ ready", flush=True)
input()  # both start together
for r in range(8):
    for e in range(10):
        try:
            store.reserve(f"e{e}", 2 * r + half, 0.5, 3.0, 1.0)
            print("@ ok", e, flush=True)
        except BudgetExceeded:
            print("@ refused", e, flush=True)
"""


def test_two_processes_reserving_at_once_never_overspend(db: str, tmp_path: Path) -> None:
    with Store(db) as setup:
        for e in range(10):
            setup.upsert_experiment(f"e{e}", {})
            add_rounds(setup, 16, f"e{e}")
    children = [StoreChild(RESERVE_RACE, db, tmp_path / f"child{k}.err", str(k)) for k in (0, 1)]
    assert [child.next_line() for child in children] == ["ready", "ready"]
    for child in children:
        child.send("go")
    outcomes = [line.split() for child in children for line in child.finish()]
    assert len(outcomes) == 160
    with Store(db) as store:
        for e in range(10):  # 6 reservations of 0.5 make each budget of 3
            assert [o for o, exp in outcomes if exp == str(e)].count("ok") == 6
            assert store.ledger(f"e{e}").spent == 3.0


def test_a_reservation_survives_sigkill_between_reserve_and_settle(db: str, tmp_path: Path) -> None:
    child = StoreChild(RESERVE_THEN_WAIT, db, tmp_path / "child.err")
    try:
        assert child.next_line() == "reserved"
    finally:
        child.kill9()
    with Store(db) as store:
        assert store.ledger(EXP).reserved == 7.0
        assert [(r.round, r.status) for r in store.open_rounds(EXP)] == [(0, "proposed")]
        store.add_round(EXP, 1, "a1", {}, [], 4.0, "hard", 2.0)
        with pytest.raises(BudgetExceeded):  # 7 still counts: 7 + 4 > 10
            store.reserve(EXP, 1, 4.0, 10.0, 2.0)
        store.settle(EXP, 0, 3.0)  # the re-published action is acked after the restart
        assert store.ledger(EXP).settled == 7.0 and store.ledger(EXP).spent == 7.0


@pytest.mark.parametrize("delay_ms", [0, 3, 11])
def test_sigkill_mid_stream_keeps_every_write_that_returned(
    db: str, tmp_path: Path, delay_ms: int
) -> None:
    child = StoreChild(STREAM_WRITES, db, tmp_path / "child.err")
    printed: list[str] = []
    try:
        while len(printed) < 400:
            printed.append(child.next_line())
        time.sleep(delay_ms / 1000)
    finally:
        printed += child.kill9()
    committed = {kind: {int(i) for k, i in map(str.split, printed) if k == kind} for kind in "ts"}

    with RawDatabase(db) as raw:
        if not raw.postgres:
            assert raw.execute("PRAGMA integrity_check") == [("ok",)]
            assert raw.execute("PRAGMA foreign_key_check") == []
    with Store(db) as store:
        rounds = {r.round: r for r in store.rounds(EXP)}
        ledger = {e.round: e.amount for e in store.ledger_entries(EXP)}
        tx = {r.round: r.value for r in store.readings(EXP) if r.device_id == "tx"}
        solo = {r.round: r.value for r in store.readings(EXP) if r.device_id == "solo"}
    assert committed["t"] <= rounds.keys() and committed["s"] <= solo.keys()
    # Each transaction is all or nothing: round, reservation and reading together.
    assert rounds.keys() == ledger.keys() == tx.keys()
    assert all(tx[i] == i + 0.25 and rounds[i].intervention == {"X": i * 0.5} for i in tx)
    assert all(solo[i] == -i - 0.5 for i in solo)
    # At most the write in flight at the kill is there without having been printed.
    assert len(rounds.keys() - committed["t"]) <= 1 and len(solo.keys() - committed["s"]) <= 1


@pytest.mark.parametrize("delay_ms", [0, 7])
def test_sigkill_keeps_every_batch_of_readings_that_returned_whole(
    db: str, tmp_path: Path, delay_ms: int
) -> None:
    """What the agent acknowledges to the broker after `add_readings` and the commit is there
    after a kill -9, every reading of it; a batch in flight is there whole or not at all."""
    child = StoreChild(BATCH_WRITES, db, tmp_path / "child.err")
    printed: list[str] = []
    try:
        while len(printed) < 60:
            printed.append(child.next_line())
        time.sleep(delay_ms / 1000)
    finally:
        printed += child.kill9()
    committed = {int(i) for _, i in map(str.split, printed)}
    with Store(db) as store:
        per_round: dict[int, list[float]] = {}
        for row in store.readings(EXP):
            per_round.setdefault(row.round, []).append(row.value)
        rounds = {r.round for r in store.rounds(EXP)}
    assert committed <= per_round.keys() and per_round.keys() == rounds
    assert all(values == [r + k / 8 for k in range(8)] for r, values in per_round.items())
    assert len(per_round.keys() - committed) <= 1


# ---- transactions and threads ---------------------------------------------------------------


def test_a_transaction_is_atomic(db: str, store: Store) -> None:
    add_rounds(store, 1)
    with pytest.raises(RuntimeError, match="boom"), store.transaction():
        store.add_round(EXP, 1, "a1", {}, [], 1.0, "hard", 1.0)
        store.reserve(EXP, 1, 1.0, 10.0, 1.0)
        store.add_reading(EXP, 1, "Y", 1.0, 0, "s", 1.0)
        store.set_round_status(EXP, 0, "published", 1.0)
        raise RuntimeError("boom")
    assert [r.round for r in store.rounds(EXP)] == [0] and store.rounds(EXP)[0].status == "proposed"
    assert store.ledger_entries(EXP) == [] and store.readings(EXP) == []

    with Store(db) as other, store.transaction():
        store.add_round(EXP, 1, "a1", {}, [], 1.0, "hard", 1.0)
        with store.transaction():  # joins the outer one
            store.add_reading(EXP, 1, "Y", 1.0, 0, "s", 1.0)
        with pytest.raises(BudgetExceeded), store.transaction():
            store.add_reading(EXP, 1, "Y", 2.0, 1, "s", 1.0)
            store.reserve(EXP, 1, 11.0, 10.0, 1.0)  # undoes this inner block only
        assert other.rounds(EXP)[-1].round == 0  # nothing visible outside before the commit
    assert [r.seq for r in store.readings(EXP)] == [0] and len(store.rounds(EXP)) == 2
    with Store(db) as other:
        assert [r.seq for r in other.readings(EXP)] == [0]


def test_other_threads_wait_for_an_open_transaction_instead_of_joining_it(store: Store) -> None:
    add_rounds(store, 2)
    entered, finished = threading.Event(), []

    def writer() -> None:
        entered.wait()
        store.add_reading(EXP, 1, "Y", 1.0, 0, "other-thread", 1.0)
        finished.append(time.monotonic())

    thread = threading.Thread(target=writer)
    thread.start()
    with pytest.raises(RuntimeError), store.transaction():
        store.add_reading(EXP, 0, "Y", 1.0, 0, "this-thread", 1.0)
        entered.set()
        time.sleep(0.2)
        assert not finished
        rolled_back_at = time.monotonic()
        raise RuntimeError("roll back this thread's work only")
    thread.join(timeout=10)
    assert finished and finished[0] >= rolled_back_at
    assert [r.device_id for r in store.readings(EXP)] == ["other-thread"]


async def test_another_task_cannot_slip_into_an_open_transaction(store: Store) -> None:
    add_rounds(store, 1)
    opened = asyncio.Event()

    async def holder() -> None:
        with store.transaction():
            store.add_reading(EXP, 0, "Y", 1.0, 0, "holder", 1.0)
            opened.set()
            await asyncio.sleep(0.05)  # a mistake the store must catch

    task = asyncio.create_task(holder())
    await opened.wait()
    with pytest.raises(StoreError, match="another asyncio task"):
        store.add_reading(EXP, 0, "Y", 1.0, 1, "intruder", 1.0)
    await task
    assert [r.device_id for r in store.readings(EXP)] == ["holder"]


def test_closed_store_raises(db: str) -> None:
    store = Store(db)
    store.close()
    store.close()
    with pytest.raises(StoreError, match="is closed"):
        store.experiment_names()


# ---- migrations -----------------------------------------------------------------------------


def test_an_empty_database_is_migrated_to_the_current_schema(fresh_store_target: str) -> None:
    db = fresh_store_target
    if not db.startswith("postgresql:"):
        Path(db).touch()  # an empty file is an empty SQLite database
    with Store(db) as store:
        assert store.schema_version == schema.schema_version() == len(schema.VERSIONS)
    with RawDatabase(db) as raw:
        tables = raw.tables()
        assert raw.version() == schema.schema_version()
        if raw.postgres:  # one row per version, saying what it added
            rows = raw.execute("SELECT version, description FROM cbo_schema_migrations")
            assert rows == [(v + 1, text) for v, text in enumerate(schema.VERSIONS)]
        else:
            assert raw.execute("PRAGMA application_id") == [(sqlite_schema.APPLICATION_ID,)]
    assert {"experiments", "rounds", "readings", "oracle", "ledger", "snapshots"} <= tables
    assert {"snapshot_arrays", "dead_letters"} <= tables


def test_both_backends_have_one_migration_per_version() -> None:
    assert len(sqlite_schema.MIGRATIONS) == len(postgres_schema.MIGRATIONS)
    assert len(postgres_schema.MIGRATIONS) == schema.schema_version()
    assert set(postgres_schema.STORE_TABLES) == {
        "experiments", "rounds", "readings", "oracle", "ledger", "snapshots",
        "snapshot_arrays", "dead_letters",
    }  # fmt: skip


def test_forward_migrations_run_only_missing_steps_and_atomically(
    fresh_store_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = fresh_store_target
    with Store(db) as store:
        store.upsert_experiment(EXP, SPEC)
    v1 = schema.schema_version()
    backend = migrations_of(db)
    broken = (*backend.MIGRATIONS, ("ALTER TABLE rounds ADD COLUMN note TEXT", "NOT SQL"))
    monkeypatch.setattr(backend, "MIGRATIONS", list(broken))
    with pytest.raises(StoreError, match="syntax error"):
        Store(db)
    with RawDatabase(db) as raw:
        assert raw.version() == v1 and "note" not in raw.columns("rounds")

    fixed = (*backend.MIGRATIONS[:-1], ("ALTER TABLE rounds ADD COLUMN note TEXT",))
    monkeypatch.setattr(backend, "MIGRATIONS", list(fixed))
    with Store(db) as store:
        assert store.schema_version == v1 + 1 and store.experiment_spec(EXP) == SPEC


def test_replicas_opening_a_new_store_at_once_migrate_it_once(fresh_store_target: str) -> None:
    db = fresh_store_target
    openers, errors = 6, []
    barrier = threading.Barrier(openers)

    def open_store() -> None:
        barrier.wait()
        try:
            with Store(db) as store:
                store.upsert_experiment(f"e{threading.get_ident()}", {})
        except Exception as exc:  # collected: an assertion in a thread would be lost
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    with Store(db) as store, RawDatabase(db) as raw:
        assert len(store.experiment_names()) == openers
        assert raw.version() == schema.schema_version()
        if raw.postgres:
            versions = raw.execute("SELECT version FROM cbo_schema_migrations ORDER BY version")
            assert versions == [(v,) for v in range(1, schema.schema_version() + 1)]


def test_a_version_1_store_is_migrated_and_its_rows_read_back(
    fresh_store_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = fresh_store_target
    backend = migrations_of(db)
    with monkeypatch.context() as patch:  # a store at schema version 1, rows as v1 wrote them
        patch.setattr(backend, "MIGRATIONS", backend.MIGRATIONS[:1])
        with Store(db) as old:
            old.upsert_experiment(EXP, SPEC)
            assert old.schema_version == 1
    with RawDatabase(db) as raw:
        for r in range(2):
            raw.execute(
                "INSERT INTO rounds VALUES (?, ?, ?, ?, '[\"X\"]', 1.0, 'hard', 'published', 1, "
                "NULL, 1.0, 1.0)",
                (EXP, r, f"a{r}", f'{{"X": {r / 2}}}'),
            )
        raw.execute(
            "INSERT INTO ledger VALUES (?, 0, 1.0, 'reserved', 10.0, 1.0, NULL, NULL)", (EXP,)
        )
    with Store(db) as store:
        assert store.schema_version == schema.schema_version() == len(schema.VERSIONS)
        first, _ = store.rounds(EXP)
        assert (first.applied, first.expires_at, first.intervention) == (None, None, {"X": 0.0})
        assert (first.status, first.attempt) == ("published", 1)
        store.set_applied(EXP, 1, {"X": 0.25})
        assert store.set_expires_at(EXP, 1, 50.0)
        assert store.get_round(EXP, 1).applied == {"X": 0.25}
        assert store.get_round(EXP, 1).expires_at == 50.0
        assert store.ledger(EXP).reserved == 1.0
        # version 3: an experiment of an older store is running, unowned, at epoch 0
        (control,) = store.experiments()
        assert (control.state, control.owner, control.epoch, control.leased) == (
            "running", None, 0, False,
        )  # fmt: skip


def test_applied_interventions_and_expiries_are_stored(store: Store, tmp_path: Path) -> None:
    assert store.add_round(EXP, 0, "a0", {"X": 2.0}, ["X"], 1.0, "hard", 1.0, expires_at=41.0)
    assert store.get_round(EXP, 0).expires_at == 41.0 and store.get_round(EXP, 0).applied is None
    store.set_applied(EXP, 0, {"X": 1.5})  # the device clamped
    assert not store.set_expires_at(EXP, 0, 41.0)  # the same: nothing written
    assert store.set_expires_at(EXP, 0, 60.0)  # later (a restart renews the window)
    with pytest.raises(StoreError, match=r"earlier than the published expiry 60\.0"):
        store.set_expires_at(EXP, 0, 59.0)  # a device may hold the action until 60
    with pytest.raises(StoreError, match="must be finite"):
        store.set_applied(EXP, 0, {"X": math.nan})
    with pytest.raises(StoreError, match="unknown round 9"):
        store.set_applied(EXP, 9, {"X": 1.0})
    row = store.get_round(EXP, 0)
    assert (row.intervention, row.applied, row.expires_at) == ({"X": 2.0}, {"X": 1.5}, 60.0)
    rounds = store.export(EXP, tmp_path / "out", "csv")[EXPORT_TABLES.index("rounds")]
    with rounds.open(newline="") as handle:
        (exported,) = csv.DictReader(handle)
    assert (exported["applied"], exported["expires_at"]) == ('{"X":1.5}', "60.0")


def test_charge_records_a_cost_spent_after_release_even_past_the_budget(store: Store) -> None:
    add_rounds(store, 3, cost=2.0)
    assert store.reserve(EXP, 0, 2.0, 3.0, 1.0)
    assert store.release(EXP, 0, 2.0)  # the round expired
    assert store.reserve(EXP, 1, 2.0, 3.0, 3.0)  # its budget went to another round
    assert store.settle(EXP, 1, 4.0)
    assert store.charge(EXP, 0, 5.0)  # ... and the device applied round 0 after all
    assert not store.charge(EXP, 0, 6.0)  # once
    totals = store.ledger(EXP)
    assert (totals.settled, totals.released, totals.spent) == (4.0, 0.0, 4.0)  # 4 of 3
    entry = store.ledger_entries(EXP)[0]
    assert (entry.state, entry.released_at, entry.settled_at) == ("settled", 2.0, 5.0)
    with pytest.raises(BudgetExceeded):  # nothing more is reserved
        store.reserve(EXP, 2, 0.0, 3.0, 7.0)
    with pytest.raises(IllegalTransition, match="'unreserved' to 'charged'"):
        store.charge(EXP, 2, 7.0)


def test_newer_or_foreign_stores_are_refused(fresh_store_target: str) -> None:
    db = fresh_store_target
    newer = schema.schema_version() + 1
    Store(db).close()
    with RawDatabase(db) as raw:
        if raw.postgres:
            raw.execute("INSERT INTO cbo_schema_migrations VALUES (?, 'from the future')", (newer,))
        else:
            raw.execute(f"PRAGMA user_version = {newer}")
    with pytest.raises(StoreError, match=f"schema version {newer}, newer than"):
        Store(db)
    with RawDatabase(db) as raw:  # start over, as another program's database
        for table in ("snapshot_arrays", "snapshots", "dead_letters", "readings", "oracle"):
            raw.execute(f"DROP TABLE {table}")
        raw.execute("DROP TABLE visited_states")  # it refers to rounds
        for table in ("ledger", "rounds", "experiments"):
            raw.execute(f"DROP TABLE {table}")
        if raw.postgres:
            raw.execute("DROP TABLE cbo_schema_migrations")
        else:
            raw.execute("PRAGMA user_version = 0")
            raw.execute("PRAGMA application_id = 0")
        raw.execute("CREATE TABLE rounds (golf_score INTEGER)")
    with pytest.raises(StoreError, match="not a cbo-agent store"):
        Store(db)
    with RawDatabase(db) as raw:
        assert raw.columns("rounds") == ["golf_score"]  # refused, not altered


def test_a_corrupt_sqlite_file_is_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"garbage\.db"):
        Store(garbage)


@pytest.mark.integration
def test_an_unreachable_postgres_is_one_line_naming_it(postgres_target: str) -> None:
    from tests.brokers import free_port

    closed = f"postgresql://cbo:secret@127.0.0.1:{free_port()}/nothing"
    with pytest.raises(StoreError) as refused:
        Store(closed, timeout_s=2.0)
    message = str(refused.value)
    assert "\n" not in message and "secret" not in message and "127.0.0.1" in message
    assert message.startswith("cannot open store postgresql://cbo:***@127.0.0.1:")
    missing = postgres_target.rsplit("/", 1)[0] + "/cbo_no_such_database"
    with pytest.raises(StoreError, match='database "cbo_no_such_database" does not exist'):
        Store(missing)


TABLE_MODULES = (
    "experiments",
    "leases",
    "rounds",
    "readings",
    "ledger",
    "snapshots",
    "dead_letters",
    "export",
)
BACKEND_MODULES = {
    "sqlite3",
    "psycopg",
    "psycopg_pool",
    "connectors.store.database",
    "connectors.store.sqlite",
    "connectors.store.sqlite_schema",
    "connectors.store.postgres",
    "connectors.store.postgres_schema",
}
SQLITE_ONLY = ("PRAGMA", "BEGIN IMMEDIATE", "IS ?", "LIMIT -1", "sqlite_", "INSERT OR ", "ROWID")
POSTGRES_ONLY = ("RETURNING", "FOR UPDATE", "FOR SHARE", "FOR NO KEY", "::", "%S", "NOW()")


def test_table_modules_import_no_backend_and_write_sql_both_run() -> None:
    """Both backends share the table modules: what is one database's own stays in its module."""
    for name in TABLE_MODULES:
        tree = ast.parse((REPO / "connectors" / "store" / f"{name}.py").read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        assert not imported & BACKEND_MODULES, (name, imported & BACKEND_MODULES)
        prose = {id(doc) for doc in _docstrings(tree)}  # docstrings may name either's SQL
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
        sql = " ".join(
            n.value.upper()
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in prose
        )
        assert strings and not [w for w in (*SQLITE_ONLY, *POSTGRES_ONLY) if w in sql], name


def _docstrings(tree: ast.Module) -> list[ast.expr]:
    kinds = ast.Module | ast.ClassDef | ast.FunctionDef
    owners = [n for n in ast.walk(tree) if isinstance(n, kinds)]
    return [
        owner.body[0].value
        for owner in owners
        if owner.body
        and isinstance(owner.body[0], ast.Expr)
        and isinstance(owner.body[0].value, ast.Constant)
        and isinstance(owner.body[0].value.value, str)
    ]


def test_opening_an_sqlite_store_loads_no_postgres_driver() -> None:
    script = (
        "import sys; from connectors.store import Store; Store(':memory:').close(); "
        "print([m for m in sys.modules if m.startswith(('psycopg', 'connectors.store.postgres'))])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == "[]"


# ---- snapshots ------------------------------------------------------------------------------


def test_snapshots_round_trip_arrays_bit_for_bit(db: str) -> None:
    rng = np.random.default_rng(3)
    special = rng.standard_normal((5, 4))
    special[0, :3] = [np.nan, np.inf, -0.0]
    arrays = {
        "chol": np.linalg.cholesky(np.cov(rng.standard_normal((6, 20))) + np.eye(6)),
        "special": special,
        "fortran": np.asfortranarray(rng.standard_normal((3, 7))),
        "strided": rng.standard_normal((8, 8))[::2, 1::3],
        "f32": rng.standard_normal(9).astype(np.float32),
        "ints": np.arange(-5, 5, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "complex": np.array([1 + 2j, -3j]),
        "scalar": np.array(2.5),
        "empty": np.zeros((0, 3)),
        "record": np.array([(1, 2.0)], dtype=[("n", "i4"), ("x", "f8")]),
    }
    with Store(db, keep_snapshots=2) as store:
        store.upsert_experiment(EXP, {})
        first = store.save_snapshot(EXP, 0, {"old": np.ones(2)}, {"k": 0})
        second = store.save_snapshot(EXP, 0, arrays, {"k": 1, "hyper": {"ls": [0.5, 1.5]}})
        snap = store.latest_snapshot(EXP)
        assert snap is not None and snap.id == second > first and snap.meta["hyper"]["ls"][1] == 1.5
        assert snap.arrays.keys() == arrays.keys()
        for name, want in arrays.items():
            got = snap.arrays[name]
            assert (got.dtype, got.shape) == (want.dtype, want.shape), name
            assert got.tobytes() == want.tobytes() and got.flags.writeable, name
        assert snap.arrays["fortran"].flags.f_contiguous
        store.save_snapshot(EXP, 0, {}, {"k": 2})
        with RawDatabase(db) as raw:
            kept = [r[0] for r in raw.execute("SELECT meta FROM snapshots ORDER BY id")]
            assert kept == ['{"hyper":{"ls":[0.5,1.5]},"k":1}', '{"k":2}']  # the newest two
            assert raw.execute("SELECT count(*) FROM snapshot_arrays") == [(len(arrays),)]
        with pytest.raises(StoreError, match="past the newest reading id 0"):
            store.save_snapshot(EXP, 5, {}, {})


class _Tripwire:
    """Unpickling this would create a file: proof that something was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_snapshots_refuse_pickled_object_arrays(db: str, tmp_path: Path) -> None:
    tripwire = tmp_path / "unpickled"
    with Store(db) as store, RawDatabase(db) as raw:
        store.upsert_experiment(EXP, {})
        with pytest.raises(StoreError, match=r"'objs'.*dtype object.*no pickle"):
            store.save_snapshot(
                EXP, 0, {"ok": np.ones(2), "objs": np.array([1, "a"], dtype=object)}, {}
            )
        assert store.latest_snapshot(EXP) is None
        # Pickled data planted in the file (a tampered or foreign store) is refused on load.
        evil = np.empty(1, dtype=object)
        evil[0] = _Tripwire(str(tripwire))
        for name, blob in [
            ("npy-with-pickle", _npy_with_pickle(evil)),
            ("raw-pickle", pickle.dumps(_Tripwire(str(tripwire)))),
        ]:
            sid = store.save_snapshot(EXP, 0, {name: np.zeros(1)}, {})
            raw.execute("UPDATE snapshot_arrays SET npy = ? WHERE snapshot_id = ?", (blob, sid))
            with pytest.raises(StoreError, match=f"'{name}'"):
                store.latest_snapshot(EXP)
    assert not tripwire.exists()


def _npy_with_pickle(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


# ---- dead letters ---------------------------------------------------------------------------


def test_dead_letters_keep_the_newest_per_experiment_and_cut_payloads(db: str) -> None:
    with Store(db, keep_dead_letters=3, dead_letter_payload_limit=4) as store:
        for i in range(5):
            store.add_dead_letter(EXP, "cbo/toy-chain/reading", "invalid", f"n{i}", b"012345", i)
        for i in range(2):
            store.add_dead_letter(None, "weird/topic", "malformed_json", f"m{i}", "text", i)
        kept = store.dead_letters(EXP)
        assert [d.detail for d in kept] == ["n2", "n3", "n4"]
        assert {(d.payload, d.payload_size) for d in kept} == {(b"0123", 6)}
        assert [(d.detail, d.payload) for d in store.dead_letters(None)] == [
            ("m0", b"text"), ("m1", b"text"),
        ]  # fmt: skip


# ---- export ---------------------------------------------------------------------------------


def filled(store: Store) -> Store:
    add_rounds(store, 3)
    for r in range(3):
        store.reserve(EXP, r, 1.0, 10.0, r)
        for seq in range(2):
            store.add_reading(EXP, r, "Y", r + seq / 3, r * 2 + seq, "s", r + 0.5)
    store.settle(EXP, 0, 1.0)
    store.add_oracle(EXP, 0, f"{EXP}-a0", 0.1, 0.7, 1.0)
    store.add_states(EXP, 1, "s", VISITED, 1.75)  # a device's trace (T, agents, obs)
    return store


VISITED = np.arange(12, dtype=np.float64).reshape(3, 2, 2) / 7


def test_export_writes_csv_with_headers_and_every_row(store: Store, tmp_path: Path) -> None:
    paths = filled(store).export(EXP, tmp_path / "out", "csv")
    assert [p.name for p in paths] == [f"{EXP}_{t}.csv" for t in EXPORT_TABLES]
    tables = {}
    for table, path in zip(EXPORT_TABLES, paths, strict=True):
        with path.open(newline="") as handle:
            tables[table] = list(csv.DictReader(handle))
    assert [len(tables[t]) for t in EXPORT_TABLES] == [3, 6, 1, 3, 1]
    (trace,) = tables["visited_states"]
    assert list(trace) == [
        "id", "experiment", "round", "device_id", "received_at", "dtype", "shape", "states",
    ]  # fmt: skip
    assert (trace["round"], trace["device_id"], trace["dtype"]) == ("1", "s", "float64")
    shape = json.loads(trace["shape"])
    assert np.array_equal(np.array(json.loads(trace["states"])).reshape(shape), VISITED)
    assert list(tables["readings"][0]) == [
        "id", "experiment", "round", "node", "value", "seq", "device_id", "measured_at",
        "received_at", "array_dtype", "array_shape", "array",
    ]  # fmt: skip
    assert [float(r["value"]) for r in tables["readings"]] == [r.value for r in store.readings(EXP)]
    assert tables["ledger"][0]["state"] == "settled" and tables["ledger"][1]["settled_at"] == ""
    assert tables["rounds"][2]["intervention"] == '{"X":1.0}'
    assert not list((tmp_path / "out").glob("*.tmp"))
    with pytest.raises(StoreError, match="unknown experiment 'ghost'"):
        store.export("ghost", tmp_path / "out", "csv")
    with pytest.raises(StoreError, match="'csv' or 'parquet'"):
        store.export(EXP, tmp_path / "out", "xlsx")  # type: ignore[arg-type]


def test_export_parquet_or_a_clear_error_without_pyarrow(store: Store, tmp_path: Path) -> None:
    filled(store)
    if importlib.util.find_spec("pyarrow") is None:
        with pytest.raises(StoreError, match=r"needs pyarrow.*fmt='csv'"):
            store.export(EXP, tmp_path / "pq", "parquet")
        assert not (tmp_path / "pq").exists()
        return
    import pyarrow.parquet as pq

    paths = store.export(EXP, tmp_path / "pq", "parquet")
    assert [pq.read_table(p).num_rows for p in paths] == [3, 6, 1, 3, 1]
    states = pq.read_table(paths[EXPORT_TABLES.index("visited_states")]).to_pylist()[0]
    assert np.array_equal(np.reshape(states["states"], json.loads(states["shape"])), VISITED)


# ---- property: the ledger against a model ---------------------------------------------------

BUDGET = 5.0
OPS = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "settle", "release", "reopen"]),
        st.integers(0, 5),
        st.sampled_from([0.0, 0.1, 0.2, 0.7, 1.0, 2.5]) | st.floats(0, 6, allow_nan=False),
    ),
    max_size=30,
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_any_interleaving_keeps_the_ledger_consistent_with_a_model(
    sqlite_db: Path, ops: list[tuple[str, int, float]]
) -> None:
    check_ledger_against_a_model(str(sqlite_db), ops)


@pytest.mark.integration
@settings(  # fewer: a PostgreSQL reopen is two connections and a migration check
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_any_interleaving_keeps_the_postgres_ledger_consistent_with_a_model(
    postgres_target: str, ops: list[tuple[str, int, float]]
) -> None:
    check_ledger_against_a_model(postgres_target, ops)


def check_ledger_against_a_model(path: str, ops: list[tuple[str, int, float]]) -> None:
    store = Store(path)
    experiment = f"e{len(store.experiment_names())}"  # a fresh experiment per example
    store.upsert_experiment(experiment, {})
    add_rounds(store, 6, experiment)
    model: dict[int, tuple[str, float]] = {}
    try:
        for op, r, amount in ops:
            if op == "reopen":
                store.close()
                store = Store(path)
                continue
            expected = _model_step(model, op, r, amount)
            if isinstance(expected, type):
                with pytest.raises(expected):
                    _apply(store, experiment, op, r, amount)
            else:
                assert _apply(store, experiment, op, r, amount) is expected
            totals = store.ledger(experiment)
            by_state = {"reserved": totals.reserved, "settled": totals.settled}
            by_state["released"] = totals.released
            for state, total in by_state.items():
                assert total == math.fsum(a for s, a in model.values() if s == state)
            assert totals.spent <= BUDGET
    finally:
        store.close()


def _apply(store: Store, experiment: str, op: str, r: int, amount: float) -> bool:
    if op == "reserve":
        return store.reserve(experiment, r, amount, BUDGET, 1.0)
    return store.settle(experiment, r, 1.0) if op == "settle" else store.release(experiment, r, 1.0)


def _model_step(
    model: dict[int, tuple[str, float]], op: str, r: int, amount: float
) -> bool | type[Exception]:
    """What the store should do (True/False return, or the exception) and update the model."""
    held = model.get(r)
    if op == "reserve":
        if held is not None:
            return False if held == ("reserved", amount) else IllegalTransition
        spent = [a for s, a in model.values() if s != "released"]
        if math.fsum([*spent, amount]) > BUDGET:
            return BudgetExceeded
        model[r] = ("reserved", amount)
        return True
    target = "settled" if op == "settle" else "released"
    if held is None or held[0] not in ("reserved", target):
        return IllegalTransition
    if held[0] == target:
        return False
    model[r] = (target, held[1])
    return True
