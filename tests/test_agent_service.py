"""The agent service end to end through a real Mosquitto: simulator device, rounds, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from pathlib import Path

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import LogCapture

from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection
from agent.experiment import Experiment
from agent.runtime import AgentService
from connectors.mqtt import BrokerConfig, MqttConnection
from connectors.schemas import Reading, encode
from connectors.store import Store
from connectors.topics import Topics
from core.spec import load_spec
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment
from tests.test_agent_join import ack

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WAIT_S = 60.0


def fast_spec(name: str, rounds: int, **schedule):
    spec = load_spec(EXAMPLES / "toygraph.yaml")
    return spec.model_copy(
        update={
            "name": name,
            "policy": spec.policy.model_copy(update={"name": "random", "settings": {}}),
            "schedule": spec.schedule.model_copy(
                update={
                    "max_rounds": rounds,
                    "ack_timeout_s": 2.0,
                    "round_timeout_s": 2.0,
                    **schedule,
                }
            ),
        }
    )


def agent_config(broker_url: str, store: Path) -> AgentConfig:
    return AgentConfig(
        agent_id="test-agent",
        broker=BrokerSection(url=broker_url),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(store)),
    )


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.integration
async def test_service_runs_rounds_through_mosquitto(mosquitto, tmp_path):
    spec = fast_spec("svc", rounds=6, pipeline=2)
    env = make_environment("toygraph")
    device = SimulatorDevice(
        env,
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="svc", delay_s=0.01, jitter_s=0.02, duplicate_rate=0.3, seed=1),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    events = []
    service = AgentService(
        agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec], on_event=events.append
    )
    scraped: dict = {}

    async def scrape_while_running() -> None:
        while service.metrics_server is None or not service.experiments:
            await asyncio.sleep(0.05)
        for _ in range(400):  # a few rounds: the regret estimate needs two observations
            if sum(e.kind == "closed" for e in events) >= 4:
                break
            await asyncio.sleep(0.05)
        scraped.update(await asyncio.to_thread(scrape, service.metrics_server.url))
        ready = urllib.request.urlopen(f"{service.metrics_server.url}/readyz", timeout=5)
        scraped["ready"] = ready.status

    try:
        await asyncio.wait_for(asyncio.gather(service.run(), scrape_while_running()), WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task

    closed = [e for e in events if e.kind == "closed"]
    assert len(closed) == 6 and all(e.detail == "complete" for e in closed)
    exp = service.experiments["svc"]
    assert exp.finished and "max_rounds" in exp.finished_reason
    assert exp.regret.has_oracle and exp.regret.cumulative >= -1e-9
    # every node of every round learned once despite duplicated deliveries; a node set by
    # do() in a round does not learn from it
    expected = [
        6 - sum(1 for r in exp.rounds.values() if f"do_{node}" in r.intervention)
        for node in ("X0", "X1", "Y")
    ]
    assert exp.model.gp.num_observations.tolist() == expected
    with Store(tmp_path / "agent.sqlite") as store:
        assert len(store.readings("svc")) == 18
        assert {r.status for r in store.rounds("svc")} == {"closed"}
        assert len(store.oracles("svc")) == 6
    assert scraped["ready"] == 200
    label = (("experiment", "svc"),)
    assert scraped[("cbo_rounds_total", label)] >= 1
    assert ("cbo_cumulative_regret", label) in scraped
    assert scraped[("cbo_regret_model_estimate", label)] >= 0
    assert (
        scraped[
            (
                "cbo_messages_total",
                (
                    ("experiment", "svc"),
                    ("kind", "reading"),
                    ("outcome", "accepted"),
                    ("reason", ""),
                ),
            )
        ]
        >= 3
    )


@pytest.mark.integration
async def test_bad_input_is_rejected_and_the_agent_keeps_going(mosquitto, tmp_path):
    spec = fast_spec("bad", rounds=3)
    env = make_environment("toygraph")
    device = SimulatorDevice(
        env,
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="bad", delay_s=0.2, seed=2),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    service = AgentService(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    topics = Topics()
    letters: list[bytes] = []

    async def vandal() -> None:
        async with MqttConnection(BrokerConfig.from_url(mosquitto.url)) as mqtt:
            await mqtt.subscribe(topics.deadletter("bad"))
            while not service.experiments or not service.link.connected:
                await asyncio.sleep(0.05)
            garbage = [
                b"not json",
                b"[]",
                b'{"schema":"cbo.reading","version":9}',
                b"x" * 70000,
                encode(
                    Reading(
                        experiment="bad",
                        round=99,
                        node="X0",
                        value=1.0,
                        seq=1,
                        device_id="sim-bad",
                        at=0.0,
                    )
                ),
                encode(
                    Reading(
                        experiment="bad",
                        round=0,
                        node="nope",
                        value=1.0,
                        seq=2,
                        device_id="sim-bad",
                        at=0.0,
                    )
                ),
            ]
            for payload in garbage:
                await mqtt.publish(topics.reading("bad", "sim-bad"), payload)  # the device (no ACL)
            async for message in mqtt.messages():
                letters.append(message.payload)
                if len(letters) == len(garbage):
                    return

    try:
        await asyncio.wait_for(asyncio.gather(service.run(), vandal()), WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task
    exp = service.experiments["bad"]
    assert sum(1 for r in exp.rounds.values() if r.status == "closed") == 3
    reasons = sorted(letter.split(b'"reason":"')[1].split(b'"')[0].decode() for letter in letters)
    assert reasons == sorted(
        [
            "malformed_json",
            "not_an_object",
            "unsupported_version",
            "oversized",
            "unknown_round",
            "unknown_node",
        ]
    )


@pytest.mark.integration
async def test_each_driver_binds_its_experiment_to_what_it_logs(mosquitto, tmp_path):
    """What a driver logs without naming the experiment (lingering for late readings, here)
    carries it all the same, through structlog's context variables; the agent's own events do
    not."""
    spec = fast_spec("linger", rounds=1)
    with Store(tmp_path / "agent.sqlite") as store:  # finished, its round closed unread
        exp = Experiment(spec, store)
        live = exp.propose()
        exp.mark_published(live.number)
        exp.on_ack(ack(exp, live.number))
        exp.due(live.acked_at + spec.schedule.round_timeout_s)
        assert exp.missing_readings() == {0: ["X0", "X1", "Y"]}
    captured = LogCapture()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, captured])
    service = AgentService(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    await asyncio.wait_for(service.run(), WAIT_S)
    events = {e["event"]: e for e in captured.entries}
    assert events["experiment.lingering"]["experiment"] == "linger"
    assert events["experiment.lingering"]["missing"] == {0: ["X0", "X1", "Y"]}
    assert "experiment" not in events["agent.started"]
    assert "experiment" not in events["agent.stopped"]


@pytest.mark.integration
@pytest.mark.parametrize("freeze_gc", [True, False])
async def test_what_lives_at_the_start_is_kept_out_of_full_collections(
    mosquitto, tmp_path, freeze_gc
):
    """A full collection scans every container object of the interpreter while every thread
    waits (torch and BoTorch alone: about 250,000): the service freezes what lives once it
    started (`agent.runtime.freeze_long_lived`) and unfreezes it when it stops."""
    import gc

    assert gc.get_freeze_count() == 0
    service = AgentService(
        agent_config(mosquitto.url, tmp_path / "agent.sqlite"),
        [fast_spec("frozen", rounds=1000, round_timeout_s=60.0, ack_timeout_s=60.0)],
        freeze_gc=freeze_gc,
    )
    task = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(WAIT_S):
            while not service.link.connected:
                await asyncio.sleep(0.02)
        frozen_while_serving = gc.get_freeze_count()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if freeze_gc:
        assert frozen_while_serving > 100_000  # the interpreter's modules, torch's among them
    else:
        assert frozen_while_serving == 0
    assert gc.get_freeze_count() == 0  # unfrozen at the stop: cycles among them can go again
