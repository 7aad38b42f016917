"""Shared fixtures: real brokers started per test (never the machine's broker on port 1883)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from tests.brokers import MosquittoBroker, MosquittoOptions, find_mosquitto


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
