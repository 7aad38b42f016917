"""The control plane over MQTT: a fleet replica (in this process, SQLite store, real Mosquitto)
answers `cbo.control` requests on {prefix}/control/request — submit, list, pause, status, a
mistake — and ignores a stale one; the experiment submitted is taken by the replica."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection
from agent.fleet import FleetService, FleetSettings
from agent.paths import example_spec
from connectors.mqtt import BrokerConfig, MqttConnection
from connectors.schemas import ControlReply, ControlRequest, decode, encode
from connectors.store import Store
from connectors.topics import Topics

WAIT_S = 30.0
topics = Topics()


@pytest.mark.integration
async def test_control_requests_over_mqtt(mosquitto: Any, tmp_path: Path) -> None:
    config = AgentConfig(
        agent_id="replica-a",
        broker=BrokerSection(url=mosquitto.url),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(tmp_path / "fleet.sqlite")),
    )
    store = Store(config.store.path)
    service = FleetService(config, FleetSettings(capacity=4, lease_ttl_s=3.0), store=store)
    replica = asyncio.create_task(service.run())
    spec = yaml.safe_load(example_spec("toygraph").read_text()) | {"name": "over-mqtt"}
    replies: asyncio.Queue[ControlReply] = asyncio.Queue()
    try:
        async with MqttConnection(BrokerConfig.from_url(mosquitto.url)) as operator:
            await operator.subscribe(f"{topics.prefix}/control/reply/+")

            async def read() -> None:
                async for message in operator.messages():
                    await replies.put(decode(message.payload, ControlReply))

            reader = asyncio.create_task(read())

            async def ask(verb: str, at: float | None = None, **fields: Any) -> ControlReply:
                request = ControlRequest(
                    request_id=uuid.uuid4().hex,
                    verb=verb,
                    at=time.time() if at is None else at,
                    **fields,
                )
                await operator.publish(topics.control_request(), encode(request))
                reply = await asyncio.wait_for(replies.get(), WAIT_S)
                assert reply.request_id == request.request_id and reply.replica == "replica-a"
                return reply

            async with asyncio.timeout(WAIT_S):  # the replica subscribes to the control topic
                while service.metrics_server is None or not _ready(service.metrics_server.url):
                    await asyncio.sleep(0.1)
            submitted = await ask("submit", spec=spec)
            assert submitted.ok and submitted.result == [
                {"experiment": "over-mqtt", "submitted": True}
            ]
            again = await ask("submit", spec=spec)
            assert again.ok and again.result[0]["submitted"] is False
            bad = await ask("submit", spec=spec | {"nodes": []})
            assert not bad.ok and "nodes" in bad.error and "\n" not in bad.error
            assert (await ask("pause", experiment="over-mqtt")).result["changed"] is True
            status = await ask("status", experiment="over-mqtt")
            assert status.ok and status.result["state"] == "paused"
            listed = await ask("list")
            assert [row["experiment"] for row in listed.result] == ["over-mqtt"]
            unknown = await ask("stop", experiment="nosuch")
            assert not unknown.ok and unknown.error.startswith("no experiment 'nosuch'")
            stale = ControlRequest(
                request_id="stale", verb="stop", experiment="over-mqtt", at=time.time() - 3600
            )
            await operator.publish(topics.control_request(), encode(stale))
            assert (await ask("status", experiment="over-mqtt")).result["state"] == "paused"
            assert replies.empty()  # the stale request got no answer and changed nothing
            async with asyncio.timeout(WAIT_S):
                while "over-mqtt" not in service.held:
                    await asyncio.sleep(0.1)
            assert service.held["over-mqtt"].paused
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
    finally:
        replica.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await replica
        store.close()
    with Store(config.store.path) as after:
        (row,) = after.experiments()
        assert (row.name, row.state, row.owner) == ("over-mqtt", "paused", None)  # released


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


def test_a_request_is_json_with_the_envelope() -> None:
    request = ControlRequest(request_id="r1", verb="pause", experiment="e1", at=1.0)
    document = json.loads(encode(request))
    assert document == {
        "schema": "cbo.control",
        "version": 1,
        "request_id": "r1",
        "verb": "pause",
        "experiment": "e1",
        "spec": None,
        "at": 1.0,
    }
