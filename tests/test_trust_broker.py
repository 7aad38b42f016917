"""Device identity against a real Mosquitto: the shipped ACL (deploy/mosquitto/acl, per-device
logins made by deploy/mosquitto/make-passwd.sh) and, for brokers without per-device ACLs, HMAC
signatures.

A forging device with a valid login of its own sends acks, readings and oracle values for the
real device's rounds: on its own topics the agent refuses them (counted, dead-lettered), on the
real device's topics the broker drops them. What the store holds afterwards is compared value by
value with what the real device published.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection, load_config
from agent.runtime import AgentService
from connectors.mqtt import BrokerConfig, MqttConnection
from connectors.schemas import Ack, Action, MessageModel, Oracle, Reading, encode
from connectors.signing import sign
from connectors.store import Store
from connectors.topics import Topics
from core.spec import ExperimentSpec
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment
from tests.test_security import (
    WAIT_S,
    SecureBroker,
    agent_environment,
    fast_spec,
    running,
    secure_broker,  # noqa: F401  (a fixture)
    try_publish,
)

topics = Topics()
KEY = "f00dfeedf00dfeedf00dfeedf00dfeed"  # a test key


def untrusted_counts(service: AgentService, experiment: str) -> dict[tuple[str, str], float]:
    text = generate_latest(service.metrics.registry).decode()
    return {
        (sample.labels["kind"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cbo_untrusted_messages_total"
        and sample.labels["experiment"] == experiment
        and sample.value
    }


def with_devices(spec: ExperimentSpec, *devices: dict) -> ExperimentSpec:
    """`spec` with `devices`, validated as a spec file would be."""
    return ExperimentSpec.model_validate(spec.model_dump(by_alias=True) | {"devices": devices})


def published(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == f"device.{kind}_published"]


async def wait_for_round(service: AgentService, name: str, number: int) -> str:
    """The action id of round `number` once the agent has proposed it."""
    while name not in service.experiments or number not in service.experiments[name].rounds:
        await asyncio.sleep(0.01)
    return service.experiments[name].rounds[number].action.action_id


def forged_messages(experiment: str, action_id: str, claimed: str) -> dict[str, MessageModel]:
    at = time.time()
    return {
        "ack": Ack(
            experiment=experiment,
            round=0,
            action_id=action_id,
            device_id=claimed,
            status="rejected",
            reason="forged",
            applied={},
            at=at,
        ),
        "reading": Reading(
            experiment=experiment, round=0, node="Y", value=0.999, seq=1, device_id=claimed, at=at
        ),
        "oracle": Oracle(
            experiment=experiment,
            round=0,
            action_id=action_id,
            expected_reward=-1e300,
            optimum=1.0,
            device_id=claimed,
            at=at,
        ),
    }


@pytest.mark.integration
async def test_forgeries_from_other_logins_are_refused_and_change_nothing(
    secure_broker: SecureBroker,  # noqa: F811
    tmp_path: Path,
) -> None:
    broker = secure_broker
    spec = with_devices(
        fast_spec("acl", rounds=2),
        {"id": "sim-acl", "actuator": True, "nodes": ["X0", "Y"], "oracle": True},
        {"id": "forger"},  # declared, allowed nothing: a sensor gone rogue
    )
    store_path = tmp_path / "agent.sqlite"
    service = AgentService(load_config(environ=agent_environment(broker, store_path)), [spec])
    device = SimulatorDevice(
        make_environment("dropwave"),
        broker.config("sim-acl", client_id="sim-acl"),
        DeviceSettings(experiment="acl", seed=1, delay_s=0.5),
    )
    sent: dict[str, int] = {}

    async def forge() -> None:
        action_id = await wait_for_round(service, "acl", 0)
        while not service.link.connected:
            await asyncio.sleep(0.01)
        # on its own topics: as itself, and claiming the real device's id
        for user, claimed, expected in (
            ("forger", "forger", ("not_actuator", "node_not_bound", "not_oracle")),
            ("forger", "sim-acl", ("device_mismatch",) * 3),
            ("stranger", "stranger", ("unknown_device",) * 3),  # a login in no spec
        ):
            config = broker.config(user, client_id=f"{user}-{claimed}")
            for (kind, message), reason in zip(
                forged_messages("acl", action_id, claimed).items(), expected, strict=True
            ):
                topic = topics.device_topic("acl", user, kind)  # type: ignore[arg-type]
                assert await try_publish(config, topic, encode(message)) == "published"
                sent[f"{kind}:{reason}"] = sent.get(f"{kind}:{reason}", 0) + 1
        # on the real device's topics: the broker drops them (the ACL's %u patterns)
        for kind, message in forged_messages("acl", action_id, "sim-acl").items():
            topic = topics.device_topic("acl", "sim-acl", kind)  # type: ignore[arg-type]
            await try_publish(broker.config("forger", client_id="forger-x"), topic, encode(message))

    with capture_logs() as events:
        async with running(device.run()):
            await asyncio.wait_for(device.ready.wait(), WAIT_S)
            await asyncio.wait_for(asyncio.gather(service.run(), forge()), WAIT_S)

    counts = untrusted_counts(service, "acl")
    assert counts == {tuple(key.split(":")): float(n) for key, n in sent.items()}
    assert sum(counts.values()) == 9
    with Store(store_path) as store:
        rounds = store.rounds("acl")
        assert [r.status for r in rounds] == ["closed", "closed"]
        # every stored value is the real device's, value for value
        stored = {(r.round, r.node): (r.value, r.device_id, r.seq) for r in store.readings("acl")}
        real = {
            (e["round"], e["node"]): (e["value"], "sim-acl", e["seq"])
            for e in published(events, "reading")
        }
        assert stored == real and len(stored) == 4  # X0 and Y of two rounds
        oracles = {o.round: o.expected_reward for o in store.oracles("acl")}
        assert oracles == {e["round"]: e["expected_reward"] for e in published(events, "oracle")}
        assert store.ledger("acl").spent == pytest.approx(sum(r.cost for r in rounds))
        letters = {(letter.reason, letter.topic) for letter in store.dead_letters("acl")}
    assert {reason for reason, _ in letters} == {key.split(":")[1] for key in sent}
    assert not any("/sim-acl/" in topic for _, topic in letters)  # the broker kept those out
    assert service.experiments["acl"].regret.cumulative >= -1e-9  # no forged −1e300


def plain_config(url: str, store: Path, **settings: str) -> AgentConfig:
    return AgentConfig(
        agent_id="signed-agent",
        broker=BrokerSection(url=url),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(store)),
        **settings,
    )


@pytest.mark.integration
async def test_signed_devices_on_a_broker_without_acls(mosquitto, tmp_path: Path) -> None:
    """Anyone may publish anywhere on this broker: the keys say who sent what."""
    spec = fast_spec("signed", rounds=2)  # default device: sim-signed
    store_path = tmp_path / "agent.sqlite"
    service = AgentService(
        plain_config(mosquitto.url, store_path, device_keys=f"sim-signed {KEY}"), [spec]
    )
    device = SimulatorDevice(
        make_environment("dropwave"),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="signed", seed=2, delay_s=0.5, key=KEY),
    )
    topic = topics.reading("signed", "sim-signed")

    async def forge() -> None:
        await wait_for_round(service, "signed", 0)
        while not service.link.connected:
            await asyncio.sleep(0.01)
        forged = encode(forged_messages("signed", "x" * 32, "sim-signed")["reading"])
        action = encode(Action.issue("signed", 0, {"a0": 0.5, "a1": 0.5}, "soft"))
        guess = b"a guessed key, 32 bytes long.."
        async with MqttConnection(BrokerConfig.from_url(mosquitto.url)) as mqtt:
            await mqtt.publish(topic, forged)  # unsigned
            await mqtt.publish(topic, sign(forged, "sim-signed", guess))
            # and actions to the device: it takes only those signed with its key
            action_topic = topics.action("signed", "sim-signed")
            await mqtt.publish(action_topic, action)
            await mqtt.publish(action_topic, sign(action, "sim-signed", guess))

    with capture_logs() as events:
        async with running(device.run()):
            await asyncio.wait_for(device.ready.wait(), WAIT_S)
            await asyncio.wait_for(asyncio.gather(service.run(), forge()), WAIT_S)

    assert untrusted_counts(service, "signed") == {
        ("reading", "unsigned"): 1.0,
        ("reading", "bad_signature"): 1.0,
    }
    # the agent signed its actions; the device applied those, and refused the two forged ones
    assert device.applied == 2
    refused = [e["reason"] for e in events if e["event"] == "device.action_invalid"]
    assert sorted(refused) == ["bad_signature", "unsigned"]
    with Store(store_path) as store:
        assert [r.status for r in store.rounds("signed")] == ["closed", "closed"]
        stored = {(r.round, r.node): r.value for r in store.readings("signed")}
    assert stored == {(e["round"], e["node"]): e["value"] for e in published(events, "reading")}
    assert not any(KEY in str(event) for event in events)  # the key is never logged
