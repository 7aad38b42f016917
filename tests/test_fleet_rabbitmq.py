"""MQTT conformance of a fleet replica with a second broker implementation: RabbitMQ's MQTT
plugin. A replica subscribes and unsubscribes per experiment as it takes and drops leases, and
needs nothing beyond MQTT 3.1.1; this runs one replica, one device and the control topic
through RabbitMQ and checks the experiment runs to its round limit.

RabbitMQ is shared on the development machines and its MQTT plugin's default listener (1883) is
the port the machine's Mosquitto holds, so the test does not enable the plugin itself: it runs
against ``CBO_TEST_RABBITMQ_MQTT_URL`` (e.g. ``mqtt://guest:guest@127.0.0.1:1884`` after
``rabbitmq-plugins enable rabbitmq_mqtt`` with ``mqtt.listeners.tcp.default = 1884``), or
against a RabbitMQ whose ``rabbitmqctl status`` lists an MQTT listener; else it is skipped, and
says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
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

WAIT_S = 60.0


def rabbitmq_mqtt_url() -> str | None:
    """The URL of a RabbitMQ MQTT listener, or None (then `why_not` says why)."""
    configured = os.environ.get("CBO_TEST_RABBITMQ_MQTT_URL")
    if configured:
        return configured
    tool = shutil.which("rabbitmqctl")
    if tool is None:
        return None
    try:
        status = subprocess.run(
            [tool, "status"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"Interface: (\S+), port: (\d+), protocol: mqtt\b", status)
    return None if found is None else f"mqtt://guest:guest@{found[1]}:{found[2]}"


def why_not() -> str:
    if shutil.which("rabbitmq-server") is None:
        return "RabbitMQ is not installed (apt-get install rabbitmq-server)"
    return (
        "RabbitMQ runs without an MQTT listener; not enabled here because the plugin's default "
        "port 1883 is the machine's Mosquitto: enable rabbitmq_mqtt on another port and set "
        "CBO_TEST_RABBITMQ_MQTT_URL"
    )


@pytest.mark.integration
async def test_a_replica_runs_an_experiment_through_rabbitmq(tmp_path: Path) -> None:
    url = rabbitmq_mqtt_url()
    if url is None:
        pytest.skip(why_not())
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
