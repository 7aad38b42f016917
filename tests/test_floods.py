"""Floods against a real Mosquitto configured as shipped (deploy/mosquitto/mosquitto.conf's
queue and in-flight limits): invalid input is acknowledged at once, so a flood beside a live
device loses none of its readings; a sender over its rate is cut off, not the others; memory
stays bounded.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from structlog.testing import capture_logs

from agent.runtime import AgentService
from connectors.store import Store
from tests.brokers import MosquittoOptions, shipped_limits
from tests.test_faults_input import config_for, device_for, rejected_counts, spec_for, topics

FLOOD = 20_000
WAIT_S = 120.0


def flood(port: int, topic: str, payloads: list[bytes], done: threading.Event) -> None:
    """Publish every payload at QoS 1 as fast as the broker takes them (paho's own thread)."""
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2, client_id=f"flooder-{os.getpid()}", protocol=paho.MQTTv5
    )
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [client.publish(topic, payload, qos=1) for payload in payloads]
        for info in infos:
            info.wait_for_publish(timeout=60)
    finally:
        client.loop_stop()
        client.disconnect()
        done.set()


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.integration
async def test_20000_invalid_messages_beside_a_live_device_lose_none_of_its_readings(
    mosquitto_factory, tmp_path: Path
) -> None:
    broker = mosquitto_factory(MosquittoOptions(extra_lines=shipped_limits()))
    spec = spec_for("flooded", rounds=12)
    store_path = tmp_path / "agent.sqlite"
    service = AgentService(config_for(broker.url, store_path), [spec])
    garbage = [
        b'{"schema": "cbo.reading", "version": 2, "value": ' + str(i).encode() for i in range(FLOOD)
    ]
    flooded = threading.Event()
    marks: dict[str, float] = {}

    async def flooder() -> None:
        while (
            "flooded" not in service.experiments or 1 not in service.experiments["flooded"].rounds
        ):
            await asyncio.sleep(0.01)
        marks["rss_before"] = rss_mb()
        marks["start"] = time.monotonic()
        thread = threading.Thread(
            target=flood, args=(broker.port, topics.reading("flooded"), garbage, flooded)
        )
        thread.start()
        await asyncio.to_thread(thread.join)
        marks["published"] = time.monotonic()
        while rejected_counts(service, "flooded").get("malformed_json", 0) < FLOOD:
            assert time.monotonic() - marks["start"] < WAIT_S, rejected_counts(service, "flooded")
            await asyncio.sleep(0.05)
        marks["handled"] = time.monotonic()
        marks["rss_after"] = rss_mb()

    with capture_logs() as logs:
        async with device_for(broker.url, "flooded", delay_s=0.3):
            await asyncio.wait_for(asyncio.gather(service.run(), flooder()), WAIT_S)
    # every flood message was received, counted and acknowledged; the broker dropped nothing
    assert rejected_counts(service, "flooded")["malformed_json"] == FLOOD
    assert "dropped" not in broker.log_tail(10_000), broker.log_tail()
    # every reading the device published is stored, with its value
    published = {
        (e["round"], e["node"], e["seq"]): e["value"]
        for e in logs
        if e["event"] == "device.reading_published"
    }
    with Store(store_path) as store:
        stored = {(r.round, r.node, r.seq): r.value for r in store.readings("flooded")}
        assert [r.status for r in store.rounds("flooded")] == ["closed"] * 12
    assert len(published) == 12 * len(spec.nodes)
    assert stored == published
    print(
        f"flood of {FLOOD}: published in {marks['published'] - marks['start']:.2f} s, "
        f"all handled after {marks['handled'] - marks['start']:.2f} s; "
        f"RSS {marks['rss_before']:.0f} -> {marks['rss_after']:.0f} MB"
    )
