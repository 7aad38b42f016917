"""Shared fixtures: real brokers started per test (never the machine's broker on port 1883), and
a store on each backend (a scratch PostgreSQL database per test, never a shared one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from tests.brokers import MosquittoBroker, MosquittoOptions, find_mosquitto
from tests.stores import postgres_unavailable, scratch_database


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


@pytest.fixture
def postgres_target() -> Iterator[str]:
    """A scratch PostgreSQL database's URL, created for the test and dropped after it; the test
    is skipped, saying why, only when no PostgreSQL server can be reached or started."""
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with scratch_database() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test's store lives, once per backend: an SQLite file in tmp_path, then a scratch
    PostgreSQL database (`postgres_target`)."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return str(request.getfixturevalue("postgres_target"))
