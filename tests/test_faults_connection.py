"""Connection cuts and the live audit: the agent's link severed while the broker stays up.

`cbo-agent bench chaos` puts a TCP proxy (`bench.harness.tcp_proxy.TcpProxy`) between the agent and
Mosquitto and resets the agent's connection at it (both ways, then refusing new connections for a
moment) while the broker and the simulator device keep running. Everything is on 127.0.0.1.

"Readings in the model" comes from the running agent: its /metrics (`cbo_observations` per node),
compared with the rows the store's readings complete (`bench.harness.check.LiveAudit`). The
in-process test below shows that comparison fails when a stored reading never reached the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import agent.runtime as runtime
from agent.experiment import Experiment
from agent.runtime import Link
from bench.chaos import ChaosOptions, run_chaos
from bench.harness.check import audit_once, live_checks, stored_rows
from bench.harness.procs import DeviceOptions
from bench.harness.tcp_proxy import TcpProxy
from connectors.metrics import AgentMetrics, MetricsServer
from connectors.mosquitto import find_mosquitto
from connectors.mqtt import ConnectionLostError
from connectors.store import Store
from tests.test_agent_join import ack, chain_spec, reading


# ------------------------------------------------------------------------------- the proxy
@pytest.fixture
def echo_port() -> Iterator[int]:
    """A loopback TCP echo server (the proxy's upstream)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def echo(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(1024):
                conn.sendall(data)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    server.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(5)
    return sock


def is_reset(port: int) -> bool:
    """A connection reset at once (on loopback the reset may beat connect's return)."""
    try:
        with connect(port) as sock:
            sock.recv(16)
    except ConnectionResetError:
        return True
    return False


def test_the_proxy_forwards_resets_and_refuses_for_a_moment(echo_port: int) -> None:
    with TcpProxy(echo_port) as proxy:
        client = connect(proxy.port)
        client.sendall(b"ping")
        assert client.recv(16) == b"ping"
        assert proxy.wait_for_connection(5.0) and proxy.connections == 1

        assert proxy.cut(refuse_s=30.0) == 1
        with pytest.raises(ConnectionResetError):  # a reset, not a polite end of stream
            client.recv(16)
        assert is_reset(proxy.port)  # accepted by the kernel, then reset at once
        assert (proxy.cuts, proxy.severed, proxy.refused) == (1, 1, 1)

        assert proxy.cut() == 0  # nothing open: not counted as a cut
        again = connect(proxy.port)  # the refusal window ends with the next cut's
        again.sendall(b"pong")
        assert again.recv(16) == b"pong"
        assert (proxy.cuts, proxy.accepted) == (1, 2)
        for sock in (client, again):
            sock.close()


# ------------------------------------------------------------------------------- the live audit
def run_round(exp: Experiment, seq: int, skip: tuple[str, ...] = ()) -> int:
    live = exp.propose()
    assert live is not None
    exp.mark_published(live.number)
    exp.on_ack(ack(exp, live.number))
    values = {"A": 0.5, "B": 0.2, "C": 0.4}
    exp.on_readings(
        reading(exp, live.number, node, value, seq + i)
        for i, (node, value) in enumerate(values.items())
        if node not in skip
    )
    return live.number


def test_the_live_audit_fails_when_a_stored_reading_never_reached_the_model(
    tmp_path: Path,
) -> None:
    spec = chain_spec("hard")  # B learns nothing from rounds that set it
    path = tmp_path / "agent.sqlite"
    metrics = AgentMetrics()
    with Store(path) as store, MetricsServer(metrics.registry, lambda: (True, "ok")) as server:
        exp = Experiment(spec, store, metrics=metrics, seed=1)
        for n in range(8):  # round 3 misses A: its B waits for a parent that never comes
            run_round(exp, seq=10 * n, skip=("A",) if n == 3 else ())
        rows = stored_rows(spec, store)
        learns_b = [n for n, live in exp.rounds.items() if "u" not in live.intervention and n != 3]
        assert 0 < len(learns_b) < 7, "the seed should set B in some rounds, not in all"
        assert rows.rows == {"A": 7, "B": len(learns_b), "C": 8}
        assert rows.waiting == {"B": 8 - len(learns_b)}  # set by the action, or A missing

        audit = audit_once(server.url, spec, path)
        assert audit.exported and audit.agrees, audit
        assert audit.live.observations == rows.rows
        assert audit.readings_in_model == audit.readings_accepted == 8 * 3 - 1
        assert all(check.ok for check in live_checks(audit)), live_checks(audit)

        # An agent that stores a reading and then drops it (never teaches its model):
        live = exp.propose()
        assert live is not None
        with store.transaction():
            store.add_reading(spec.name, live.number, "A", 0.3, 999, "dev", 0.0)
        dropped = audit_once(server.url, spec, path)
        assert not dropped.agrees
        assert dropped.live.observations["A"] == dropped.store.rows["A"] - 1
        assert dropped.readings_in_model == dropped.readings_accepted - 1
        assert not live_checks(dropped)[0].ok


# ------------------------------------------------------------------------------- cuts, for real
@pytest.mark.integration
@pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed")
def test_cutting_the_agents_connection_loses_nothing_and_rounds_go_on(tmp_path: Path) -> None:
    """3 cuts of the agent's connection (reset both ways, refused up to 1 s), no kills, no broker
    restarts, 12 rounds: the agent reconnects each time and runs to the end of its budget."""
    options = ChaosOptions(
        kills=0,
        broker_restarts=0,
        connection_cuts=3,
        rounds=12,
        seed=5,
        device=DeviceOptions(delay_s=0.1, jitter_s=0.2, drop_rate=0.0, duplicate_rate=0.2),
        max_downtime_s=1.0,
        time_limit_s=150.0,
        forge=False,  # tests/test_faults.py runs the adversaries
        flood=0,
    )
    result = run_chaos(options, tmp_path)
    numbers = result.numbers
    report = "\n".join(result.log) + f"\n{numbers}"
    assert numbers["connection_cuts"] == 3, report
    assert numbers["kills"] == 0 and numbers["agent_lives"] == 1, report
    assert numbers["agent_sessions"] >= 1 + 3, report  # a new session after every cut
    assert numbers["agent_finished"], report
    assert numbers["live_audits"] >= 1, report
    assert numbers["readings_accepted"] == numbers["readings_in_model"] > 0, report
    assert numbers["budget_spent"] <= numbers["budget"], report
    assert numbers["budget_applied"] <= numbers["budget"], report
    assert numbers["actions_applied_twice"] == 0, report
    assert numbers["readings_lost"] == 0, report
    # rounds kept completing after the last reconnect, up to what the budget pays for
    assert numbers["rounds_completed"] > max(numbers["rounds_closed_at_cuts"]), report
    assert numbers["rounds_completed"] >= options.rounds - 1 - numbers["rounds_expired"], report
    failed = [f"{c.name}: {c.detail}" for c in result.verdict.checks if not c.ok]
    assert not failed, report


class SlowPubacks:
    """A live connection whose first publishes time out (a broker busy saving a flood)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.published: list[str] = []

    async def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False):
        if self.failures:
            self.failures -= 1
            raise ConnectionLostError(f"publish to {topic!r} failed: timed out")
        self.published.append(topic)


async def test_a_publish_that_times_out_on_a_live_link_is_retried_there(monkeypatch) -> None:
    """A slow PUBACK used to detach the link while its session lived on: every later publish
    waited for a connection that never came, and the agent went silent (found by the chaos
    benchmark's flood). The link stays attached and the publish goes out."""
    monkeypatch.setattr(runtime, "PUBLISH_RETRY_S", 0.01)
    link, connection = Link(), SlowPubacks(failures=2)
    link.attach(connection)  # type: ignore[arg-type]
    await asyncio.wait_for(link.publish("cbo/x/d/action", b"{}"), 5.0)
    assert connection.published == ["cbo/x/d/action"] and link.connected
    await asyncio.wait_for(link.publish("cbo/x/d/action", b"{}"), 5.0)  # and the next one too
    assert len(connection.published) == 2
