"""Bad input never stops the agent: every rejection reason, dead-letter rate limiting, floods.

tests/test_agent_service.py::test_bad_input_is_rejected_and_the_agent_keeps_going covers
malformed_json, not_an_object, unsupported_version, oversized, unknown_round and unknown_node
through a broker; tests/test_connectors_schemas.py fuzzes the decoder. These tests cover the
other reasons, the rate limit on dead letters, and the flood limit of the inboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

import agent.runtime as runtime
from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection
from agent.experiment import Experiment, RoundStatus
from agent.runtime import AgentService
from connectors.mqtt import BrokerConfig, IncomingMessage, MqttConnection
from connectors.schemas import Ack, Reading, encode
from connectors.store import Store
from connectors.topics import Topics
from core.spec import ExperimentSpec, load_spec
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment
from tests.brokers import MosquittoOptions
from tests.test_agent_join import ack, reading, world

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WAIT_S = 60.0
topics = Topics()


def spec_for(name: str, rounds: int, **schedule: float) -> ExperimentSpec:
    spec = load_spec(EXAMPLES / "dropwave.yaml")
    nodes = [
        node.model_copy(update={"valid_range": (-0.05, 1.05)}) if node.name == "Y" else node
        for node in spec.nodes
    ]
    return spec.model_copy(
        update={
            "name": name,
            "nodes": nodes,
            "policy": spec.policy.model_copy(update={"name": "random", "settings": {}}),
            "schedule": spec.schedule.model_copy(
                update={"max_rounds": rounds, "ack_timeout_s": 2.0, "round_timeout_s": 3.0}
                | schedule
            ),
        }
    )


def config_for(url: str, store: Path) -> AgentConfig:
    return AgentConfig(
        agent_id="input-agent",
        broker=BrokerSection(url=url),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(store)),
    )


def rejected_counts(service: AgentService, experiment: str) -> dict[str, float]:
    text = generate_latest(service.metrics.registry).decode()
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cbo_messages_total"
        and sample.labels.get("experiment") == experiment
        and sample.labels.get("outcome") == "rejected"
    }


def a_reading(experiment: str, round_: int, node: str, value: float, seq: int) -> Reading:
    """A reading as the experiment's own device (the default `sim-{experiment}`) would send it:
    these tests publish on its topic (their broker has no ACL) to reach the checks after the
    sender's (tests/test_trust.py covers those)."""
    return Reading(
        experiment=experiment,
        round=round_,
        node=node,
        value=value,
        seq=seq,
        device_id=f"sim-{experiment}",
        at=time.time(),
    )


def device_topic(experiment: str) -> str:
    """The reading topic of the experiment's default device."""
    return topics.reading(experiment, f"sim-{experiment}")


@contextlib.asynccontextmanager
async def device_for(url: str, experiment: str, **settings):
    device = SimulatorDevice(
        make_environment("dropwave"),
        BrokerConfig.from_url(url),
        DeviceSettings(experiment=experiment, seed=1, **settings),
    )
    task = asyncio.create_task(device.run())
    try:
        await asyncio.wait_for(device.ready.wait(), WAIT_S)
        yield device
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# ------------------------------------------------------------------- reasons through a broker
@pytest.mark.integration
async def test_every_other_rejection_reason_and_the_dead_letter_rate_limit(
    mosquitto, tmp_path: Path
) -> None:
    spec = spec_for("vandalized", rounds=3)
    store_path = tmp_path / "agent.sqlite"
    service = AgentService(config_for(mosquitto.url, store_path), [spec])
    good = json.loads(encode(a_reading("vandalized", 0, "Y", 0.5, 1)))
    garbage = {
        "experiment_mismatch": encode(a_reading("elsewhere", 0, "Y", 0.5, 2)),
        "invalid": json.dumps(good | {"value": "NaN"}).encode().replace(b'"NaN"', b"NaN"),
        "unknown_schema": b'{"schema": "cbo.nope", "version": 1}',
        "wrong_schema": encode(
            Ack(
                experiment="vandalized",
                round=0,
                action_id="a" * 32,
                device_id="vandal",
                status="applied",
                applied={},
                at=time.time(),
            )
        ),
        "out_of_range": encode(a_reading("vandalized", 0, "Y", 5.0, 3)),
    }
    burst = 120  # malformed payloads at once: counted each, dead-lettered at most ~50 a second

    async def vandal() -> None:
        while "vandalized" not in service.experiments or 0 not in (
            service.experiments["vandalized"].rounds
        ):
            await asyncio.sleep(0.01)
        async with MqttConnection(BrokerConfig.from_url(mosquitto.url)) as mqtt:
            for payload in garbage.values():
                await mqtt.publish(device_topic("vandalized"), payload)
            for i in range(burst):
                await mqtt.publish(device_topic("vandalized"), b"{" + str(i).encode())

    async with device_for(mosquitto.url, "vandalized", delay_s=0.5):
        await asyncio.wait_for(asyncio.gather(service.run(), vandal()), WAIT_S)

    counts = rejected_counts(service, "vandalized")
    assert {reason: counts.get(reason) for reason in garbage} == dict.fromkeys(garbage, 1.0)
    assert counts["malformed_json"] == burst
    with Store(store_path) as store:
        letters = store.dead_letters("vandalized")
        assert {letter.reason for letter in letters} >= set(garbage)
        assert len(letters) < len(garbage) + burst  # the rest were counted and logged only
        # and nothing the vandal sent cost the experiment anything it had accepted
        assert [r.status for r in store.rounds("vandalized")] == ["closed"] * 3
        assert {(r.round, r.node) for r in store.readings("vandalized")} == {
            (n, node) for n in range(3) for node in ("X0", "Y")
        }
        assert {r.device_id for r in store.readings("vandalized")} == {"sim-vandalized"}


def test_readings_of_a_round_the_device_refused_are_stale() -> None:
    exp, store, _, _ = world(1, seed=4)
    refused = ack(exp, 0).model_copy(update={"status": "rejected", "reason": "out of range"})
    exp.on_ack(refused)
    assert exp.rounds[0].status is RoundStatus.REJECTED
    (verdict,) = exp.on_readings([reading(exp, 0, "A", 0.5, 1)])
    assert (verdict.outcome, verdict.reason) == ("rejected", "stale_round")
    assert store.readings(exp.name) == []


def test_foreign_topics_and_unknown_experiments_are_rejected_and_acknowledged(
    tmp_path: Path,
) -> None:
    """The agent subscribes to its experiments' topics only; should a broker deliver anything
    else, it is rejected (logged), acknowledged so it is not redelivered, and nothing stops."""

    class Connection:
        def __init__(self) -> None:
            self.acked: list[int] = []

        def ack(self, message: IncomingMessage) -> bool:
            self.acked.append(message.mid)
            return True

    service = AgentService(config_for("mqtt://127.0.0.1:1", tmp_path / "a.sqlite"), [])
    connection = Connection()
    with capture_logs() as events:
        for mid, topic in enumerate(["somewhere/else", "cbo/nobody/d/reading", "cbo/x/d/action"]):
            message = IncomingMessage(topic, b"{}", 1, False, mid, time.time())
            service._route(message, connection)  # type: ignore[arg-type]
    reasons = [e["reason"] for e in events if e["event"] == "message.rejected"]
    assert reasons == ["foreign_topic", "unknown_experiment", "unknown_experiment"]
    assert connection.acked == [0, 1, 2]


# -------------------------------------------------------------------------------------- floods
@pytest.mark.integration
async def test_a_flood_is_rejected_then_redelivered_and_the_agent_keeps_going(
    mosquitto_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small inbox and a policy that thinks for 1.5 s at round 1: the readings that do not
    fit are rejected as a flood and left unacknowledged, so the broker delivers them again on
    the next connection (a broker restart here); every one of them is handled in the end.

    The flood comes while the driver thinks, and the inbox holds 20 of the 30: the 10 left over
    come again in one burst on the new connection (the reader routes everything already
    received in one go), and fit then. An
    inbox smaller than what comes again would reject part of it once more, to be delivered on
    the connection after that."""
    broker = mosquitto_factory(MosquittoOptions(persistence_dir=tmp_path / "mosquitto-data"))
    monkeypatch.setattr(runtime, "INBOX_LIMIT", 20)
    slow = Experiment.propose
    thinking = threading.Event()

    def thoughtful(self: Experiment, **kwargs):
        if self.next_round == 1:
            thinking.set()
            time.sleep(1.5)  # in the policy's worker thread: the event loop keeps routing
        return slow(self, **kwargs)

    monkeypatch.setattr(Experiment, "propose", thoughtful)
    spec = spec_for("flooded", rounds=3)
    service = AgentService(config_for(broker.url, tmp_path / "agent.sqlite"), [spec])
    flood = 30

    async def flooder() -> None:
        exp = None
        while exp is None or exp.rounds.get(0) is None or not exp.rounds[0].readings:
            exp = service.experiments.get("flooded")
            await asyncio.sleep(0.01)
        # while the driver thinks (nothing drains the inbox): 20 fit, 10 are a flood
        assert await asyncio.to_thread(thinking.wait, WAIT_S), "round 1 never proposed"
        async with MqttConnection(BrokerConfig.from_url(broker.url)) as mqtt:
            for seq in range(flood):  # round 0's X0 again: duplicates, once handled
                await mqtt.publish(
                    device_topic("flooded"), encode(a_reading("flooded", 0, "X0", 3.0, seq))
                )
        deadline = time.monotonic() + 10
        while not rejected_counts(service, "flooded").get("flood"):
            assert time.monotonic() < deadline, "no flood"
            await asyncio.sleep(0.02)
        # once the driver is back (round 1 acked: the inbox was drained and acknowledged) ...
        while exp.rounds.get(1) is None or exp.rounds[1].status is not RoundStatus.ACKED:
            assert time.monotonic() < deadline, "round 1 never acked"
            await asyncio.sleep(0.02)
        await asyncio.to_thread(broker.restart)  # ... a new connection: unacked input comes again

    async with device_for(broker.url, "flooded", delay_s=1.0):
        await asyncio.wait_for(asyncio.gather(service.run(), flooder()), WAIT_S)
    assert rejected_counts(service, "flooded")["flood"] >= 1
    assert service.handled[("flooded", "reading", "duplicate")] == flood
    with Store(tmp_path / "agent.sqlite") as store:
        assert [r.status for r in store.rounds("flooded")] == ["closed"] * 3


# -------------------------------------------------------------- a huge but finite reading
@pytest.mark.integration
async def test_a_huge_finite_reading_is_rejected_and_the_agent_keeps_going(
    mosquitto, tmp_path: Path
) -> None:
    spec = spec_for("huge", rounds=2)  # X0 declares no valid_range (as in examples/)
    service = AgentService(config_for(mosquitto.url, tmp_path / "agent.sqlite"), [spec])

    async def vandal() -> None:
        while "huge" not in service.experiments or 0 not in service.experiments["huge"].rounds:
            await asyncio.sleep(0.01)
        async with MqttConnection(BrokerConfig.from_url(mosquitto.url)) as mqtt:
            await mqtt.publish(device_topic("huge"), encode(a_reading("huge", 0, "X0", 1e200, 1)))

    async with device_for(mosquitto.url, "huge", delay_s=0.5):
        await asyncio.wait_for(asyncio.gather(service.run(), vandal()), WAIT_S)
    assert [r.status for r in Store(tmp_path / "agent.sqlite").rounds("huge")] == ["closed"] * 2


def test_a_stored_reading_the_model_cannot_take_does_not_stop_recovery(tmp_path: Path) -> None:
    spec = spec_for("poison", rounds=10)
    with Store(tmp_path / "agent.sqlite") as store:
        exp = Experiment(spec, store)
        for number in range(3):
            live = exp.propose()
            exp.mark_published(live.number)
            exp.on_ack(
                Ack(
                    experiment="poison",
                    round=number,
                    action_id=live.action.action_id,
                    device_id="d",
                    status="applied",
                    applied=live.intervention,
                    at=0.0,
                )
            )
        exp.on_readings(
            [
                a_reading("poison", n, node, 0.5, 10 * n + i)
                for n in (0, 1)
                for i, node in [(0, "X0"), (1, "Y")]
            ]
        )
        store.add_reading("poison", 2, "X0", 1e200, 99, "vandal", time.time())  # as _admit does
    with Store(tmp_path / "agent.sqlite") as store:
        restarted = Experiment(spec, store)  # must come up, rejecting or quarantining the value
        assert restarted.next_round == 3
        assert restarted.rounds[2].readings == {}  # the implausible value stays out of the model
        assert [len(restarted.model.gp.member_data(j)[1]) for j in range(2)] == [2, 2]
