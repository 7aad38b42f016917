"""Shared fixtures: real brokers started per test (never the machine's broker on port 1883), and
a store on each backend (PostgreSQL: a scratch database of this session's own, emptied before
each test, or one of the test's own; never a database someone else uses)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from connectors.store import Store
from tests.brokers import MosquittoBroker, MosquittoOptions, find_mosquitto
from tests.stores import empty_store, postgres_unavailable, scratch_database


@pytest.fixture(autouse=True)
def _default_structlog() -> Iterator[None]:
    """Undo a test's `configure_logging` (the CLI sets level "warning" in-process): a filtering
    wrapper left behind would drop the info events that later tests read with `capture_logs`."""
    yield
    structlog.reset_defaults()


def _require_mosquitto() -> None:
    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed (Debian: apt-get install mosquitto)")


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A plain Mosquitto on a free 127.0.0.1 port, stopped after the test."""
    _require_mosquitto()
    with MosquittoBroker(tmp_path / "mosquitto") as broker:
        yield broker


@pytest.fixture
def mosquitto_factory(tmp_path: Path) -> Iterator[Callable[..., MosquittoBroker]]:
    """Start Mosquittos with the options a test asks for; all are stopped after the test."""
    _require_mosquitto()
    started: list[MosquittoBroker] = []

    def start(options: MosquittoOptions | None = None) -> MosquittoBroker:
        broker = MosquittoBroker(tmp_path / f"mosquitto-{len(started)}", options)
        broker.start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture(scope="session")
def _postgres_session_database() -> Iterator[str]:
    """One scratch database for the session's PostgreSQL tests, migrated once; dropped at the
    end. (A database per test would cost half a second each: CREATE, migrate, DROP.)"""
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with scratch_database() as url:
        Store(url).close()
        yield url


@pytest.fixture
def postgres_target(_postgres_session_database: str) -> str:
    """A PostgreSQL store for the test: the session's database, emptied of every row first
    (for a database no test has touched, use `fresh_postgres_target`)."""
    empty_store(_postgres_session_database)
    return _postgres_session_database


@pytest.fixture
def fresh_postgres_target() -> Iterator[str]:
    """A new, empty PostgreSQL database of the test's own (created and dropped around it), for
    tests of migrations and of what an unmigrated database holds."""
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with scratch_database() as url:
        yield url


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)]


@pytest.fixture(params=BACKENDS)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test's store lives, once per backend: an SQLite file in tmp_path, then an empty
    PostgreSQL store (`postgres_target`). Every test is skipped, saying why, only when no
    PostgreSQL server can be reached or started."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return str(request.getfixturevalue("postgres_target"))


@pytest.fixture(params=BACKENDS)
def fresh_store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """As `store_target`, but a database nothing has migrated yet on either backend."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return str(request.getfixturevalue("fresh_postgres_target"))
