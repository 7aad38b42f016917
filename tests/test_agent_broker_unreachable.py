"""A broker that never answers: said once (then now and then), /readyz names it and why, and
`broker.connect_timeout_s` ends the service with one `agent.fatal` event and exit code 1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection
from agent.runtime import AgentService, BrokerUnavailable
from core.spec import load_spec
from tests.brokers import free_port

ROOT = Path(__file__).resolve().parent.parent


def _spec():
    spec = load_spec(ROOT / "examples" / "toygraph.yaml")
    return spec.model_copy(
        update={"policy": spec.policy.model_copy(update={"name": "random", "settings": {}})}
    )


def _config(tmp_path: Path, port: int, **broker: object) -> AgentConfig:
    return AgentConfig(
        broker=BrokerSection(url=f"127.0.0.1:{port}", **broker),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(tmp_path / "agent.sqlite")),
    )


def _readyz(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_readyz_names_the_broker_that_cannot_be_reached_and_why(tmp_path):
    port = free_port()
    service = AgentService(_config(tmp_path, port), [_spec()])
    task = asyncio.create_task(service.run())
    try:
        deadline = time.monotonic() + 20
        while "refused" not in service.readiness()[1] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert service.metrics_server is not None
        status, body = await asyncio.to_thread(_readyz, service.metrics_server.url)
        assert status == 503
        assert f"broker_connected (mqtt://127.0.0.1:{port}: " in body and "refused" in body
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_connect_timeout_gives_up_and_the_outage_is_warned_once(tmp_path):
    config = _config(tmp_path, free_port(), connect_timeout_s=1.5)
    service = AgentService(config, [_spec()])
    started = time.monotonic()
    with capture_logs() as events, pytest.raises(BrokerUnavailable) as raised:
        await asyncio.wait_for(service.run(), 30)
    assert 1.5 <= time.monotonic() - started < 15
    assert raised.value.url == f"mqtt://127.0.0.1:{config.broker.address.port}"
    attempts = [e for e in events if e["event"] == "mqtt.reconnect_scheduled"]
    warned = [e for e in attempts if e["log_level"] == "warning"]
    assert len(attempts) >= 2 and len(warned) == 1  # said once; the retries at debug level
    assert "refused" in warned[0]["error"]


def test_run_exits_1_with_one_fatal_event_when_no_broker_answers(tmp_path):
    spec = ROOT / "examples" / "toygraph.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "agent.cli", "--log-format", "json", "run", str(spec),
         "--broker", f"127.0.0.1:{free_port()}", "--connect-timeout", "1",
         "--store", str(tmp_path / "agent.sqlite"), "--metrics-port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines()]
    (fatal,) = [e for e in events if e["event"] == "agent.fatal"]
    assert fatal["reason"] == "broker_unreachable" and fatal["level"] == "error"
    assert "no broker session with mqtt://127.0.0.1:" in fatal["detail"]
    warnings = [e for e in events if e["level"] == "warning"]
    assert [e["event"] for e in warnings] == ["mqtt.reconnect_scheduled"]


def test_sigusr1_prints_every_threads_stack_and_the_service_goes_on(tmp_path):
    """An operator's (or a test harness's) way to see where a service that hangs is waiting."""
    spec = ROOT / "examples" / "toygraph.yaml"
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--log-format", "json", "run", str(spec),
         "--broker", f"127.0.0.1:{free_port()}", "--store", str(tmp_path / "agent.sqlite"),
         "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 90
        assert agent.stdout is not None
        while time.monotonic() < deadline:  # retrying the broker: started and waiting
            line = agent.stdout.readline()
            lines.append(line)
            if "mqtt.reconnect_scheduled" in line:
                break
        else:
            pytest.fail("the agent never tried the broker:\n" + "".join(lines))
        agent.send_signal(signal.SIGUSR1)
        while time.monotonic() < deadline:
            line = agent.stdout.readline()
            lines.append(line)
            if line.startswith("Current thread") or "most recent call first" in line:
                break
        else:
            pytest.fail("no stack after SIGUSR1:\n" + "".join(lines))
        time.sleep(0.5)
        assert agent.poll() is None, "the service stopped after SIGUSR1"
    finally:
        agent.kill()
        agent.wait(timeout=30)
