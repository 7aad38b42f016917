"""MQTT conformance of a fleet replica with a second broker implementation: RabbitMQ's MQTT
plugin. A replica subscribes and unsubscribes per experiment as it takes and drops leases, and
needs nothing beyond MQTT 3.1.1; this runs one replica, one device and the control topic
through RabbitMQ and checks the experiment runs to its round limit.

The test starts a RabbitMQ node of its own (`tests.brokers.rabbitmq_mqtt_broker`: its own node
name, ports, directories and cookie, the MQTT plugin on a free loopback port) and stops it after;
a RabbitMQ already running on the machine is left alone. ``CBO_TEST_RABBITMQ_MQTT_URL`` (e.g.
``mqtt://guest:guest@127.0.0.1:1884``) runs it against an existing listener instead. Skipped,
saying so, only where rabbitmq-server is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection
from agent.control import submit
from agent.fleet import FleetService, FleetSettings
from agent.paths import example_spec
from connectors.mqtt import BrokerConfig
from connectors.store import Store
from core.spec import parse_spec
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment
from tests.brokers import find_rabbitmq_server, rabbitmq_mqtt_broker

WAIT_S = 60.0


@pytest.fixture
def rabbitmq_url(tmp_path: Path) -> Iterator[str]:
    configured = os.environ.get("CBO_TEST_RABBITMQ_MQTT_URL")
    if configured:
        yield configured
        return
    if find_rabbitmq_server() is None:
        pytest.skip("RabbitMQ is not installed (apt-get install rabbitmq-server)")
    with rabbitmq_mqtt_broker(tmp_path / "rabbitmq") as url:
        yield url


@pytest.mark.integration
async def test_a_replica_runs_an_experiment_through_rabbitmq(
    rabbitmq_url: str, tmp_path: Path
) -> None:
    url = rabbitmq_url
    config = AgentConfig(
        agent_id="rabbit-replica",
        broker=BrokerSection(url=url, protocol="3.1.1"),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(tmp_path / "fleet.sqlite")),
    )
    store = Store(config.store.path)
    spec = yaml.safe_load(example_spec("toygraph").read_text())
    spec |= {"name": "rabbit", "policy": {"name": "random", "settings": {}}}
    spec["schedule"] = {"max_rounds": 5, "ack_timeout_s": 2.0, "round_timeout_s": 5.0}
    submit(store, [parse_spec(spec, "rabbit")])
    device = SimulatorDevice(
        make_environment("toygraph", 0),
        BrokerConfig.from_url(url, protocol="3.1.1"),
        DeviceSettings(experiment="rabbit", delay_s=0.05),
    )
    service = FleetService(config, FleetSettings(capacity=2, lease_ttl_s=5.0), store=store)
    tasks = [asyncio.create_task(device.run()), asyncio.create_task(service.run())]
    try:
        async with asyncio.timeout(WAIT_S):
            while store.experiment_state("rabbit") != "stopped":  # finished: stopped by its owner
                await asyncio.sleep(0.2)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert [r.round for r in store.rounds("rabbit")] == list(range(5))
    assert ("rabbit", "finished") in [(name, why) for name, why, _ in service.dropped]
    store.close()
