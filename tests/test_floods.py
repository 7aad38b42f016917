"""Floods against a real Mosquitto configured as shipped (deploy/mosquitto/mosquitto.conf's
queue and in-flight limits): invalid input is acknowledged at once, so a flood beside a live
device loses none of its readings; a sender over its rate is cut off, not the others; memory
stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

import agent.runtime as runtime
from agent.config import InputSection
from agent.runtime import AgentService
from connectors.schemas import Reading, encode
from connectors.store import Store
from core.spec import DeviceSpec
from tests.brokers import MosquittoOptions, free_port, shipped_limits
from tests.test_faults_input import (
    config_for,
    device_for,
    device_topic,
    rejected_counts,
    spec_for,
    topics,
)

ROOT = Path(__file__).resolve().parents[1]
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
    # the device shares this process's event loop with the agent and its flood: generous timers
    spec = spec_for("flooded", rounds=12, ack_timeout_s=15.0, round_timeout_s=20.0)
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
            target=flood, args=(broker.port, device_topic("flooded"), garbage, flooded)
        )
        thread.start()
        await asyncio.to_thread(thread.join)
        marks["published"] = time.monotonic()
        while rejected_counts(service, "flooded").get("malformed_json", 0) < FLOOD:
            assert time.monotonic() - marks["start"] < WAIT_S, rejected_counts(service, "flooded")
            await asyncio.sleep(0.05)
        marks["handled"] = time.monotonic()
        marks["rss_after"] = rss_mb()

    began = time.monotonic()
    with capture_logs() as logs:
        async with device_for(broker.url, "flooded", delay_s=0.3):
            try:
                await asyncio.wait_for(asyncio.gather(service.run(), flooder()), WAIT_S)
            except TimeoutError:  # say where it stood: the flood, the rounds, the log's end
                raise AssertionError(
                    where_it_stood(service, "flooded", began, marks, logs)
                ) from None
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


def where_it_stood(
    service: AgentService, experiment: str, began: float, marks: dict[str, float], logs: list
) -> str:
    """A timed-out flood test's state: the flood's marks (seconds from the start), what was
    rejected, each round's status, and the last events logged."""
    exp = service.experiments.get(experiment)
    rounds = {} if exp is None else {n: live.status.value for n, live in exp.rounds.items()}
    since = {k: round(v - began, 2) for k, v in marks.items() if not k.startswith("rss")}
    events = [e for e in logs if e.get("event") != "message.rejected"]  # not the flood's
    last = [(e.get("event"), e.get("round")) for e in events[-12:]]
    return (
        f"timed out after {WAIT_S} s; flood marks (s) {since}; "
        f"rejected {rejected_counts(service, experiment)}; rounds {rounds}; last events {last}"
    )


def process_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def rejected_malformed(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cbo_messages_total" and sample.labels.get("reason") == "malformed_json"
    )


# A burst the agent falls behind on is held whole for a moment (about 1.5-2 KB a message), and
# the interpreter keeps that high-water mark: 20,000-message bursts after the warm-up moved the
# RSS by up to +58 MB and back down, by how far the agent fell behind the flooder (the
# machine's load), in 7 of 15 runs by more than the bound. Bursts of 5,000 bound that to about
# 10 MB; a leak of issue 16's size (3.5 KB a message) would add 210 MB over the 60,000.
MEMORY_WARMUP = 20_000
MEMORY_BURST = 5_000
MEMORY_BURSTS = 12
MEMORY_BOUND_MB = 30.0


@pytest.mark.slow
@pytest.mark.integration
def test_memory_stays_bounded_under_a_sustained_flood(mosquitto_factory, tmp_path: Path) -> None:
    """`cbo-agent run` as shipped, flooded with invalid QoS 1 messages: after a warm-up burst
    of 20,000 (which sizes the allocator's pools, measured: +9 to +72 MB), twelve bursts of
    5,000 (60,000 messages) grow its resident memory by less than MEMORY_BOUND_MB — nothing is
    kept per message (issue 16 saw 520 -> 757 MB over 67,000, not returned)."""
    broker = mosquitto_factory(MosquittoOptions(extra_lines=shipped_limits()))
    port = free_port()
    spec = tmp_path / "spec.yaml"
    spec.write_text((ROOT / "examples" / "toygraph.yaml").read_text())
    with (tmp_path / "agent.log").open("w") as log_file:
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "--log-format", "json", "run", str(spec),
             "--broker", broker.url, "--store", str(tmp_path / "agent.sqlite"),
             "--metrics-port", str(port), "--keep-serving", "--rounds", "1"],
            stdout=subprocess.DEVNULL, stderr=log_file,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the agent never became ready"
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url + "/readyz", timeout=5) as response,
            ):
                if response.status == 200:
                    break
            time.sleep(0.2)

        def flood_and_wait(count: int, offset: int) -> None:
            payloads = [b"not json " + str(offset + i).encode() for i in range(count)]
            flood(broker.port, device_topic("toygraph"), payloads, threading.Event())
            deadline = time.monotonic() + WAIT_S
            while rejected_malformed(url) < offset + count:
                assert time.monotonic() < deadline, rejected_malformed(url)
                time.sleep(0.2)

        start = process_rss_mb(agent.pid)
        flood_and_wait(MEMORY_WARMUP, 0)  # warm-up: the code paths and the allocator's pools
        before = process_rss_mb(agent.pid)
        after = []
        for burst in range(MEMORY_BURSTS):
            flood_and_wait(MEMORY_BURST, MEMORY_WARMUP + burst * MEMORY_BURST)
            after.append(process_rss_mb(agent.pid))
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(timeout=30)
    print(
        f"agent RSS {start:.1f} MB at start, {before:.1f} after the warm-up of {MEMORY_WARMUP}, "
        f"then {', '.join(f'{mb:.1f}' for mb in after)} after each further burst"
    )
    assert max(after) - before < MEMORY_BOUND_MB, (before, after)


@pytest.mark.integration
async def test_a_sender_over_its_rate_is_cut_off_and_the_live_device_is_not(
    mosquitto_factory, tmp_path: Path
) -> None:
    """A vandal sends 300 well-formed readings at once (of a round that does not exist: each
    costs the driver a look-up; forging a live round is the device-identity tests' subject);
    past its burst they are rejected as rate_limited and acknowledged, while the live device,
    another sender, keeps every reading."""
    broker = mosquitto_factory(MosquittoOptions(extra_lines=shipped_limits()))
    spec = spec_for("limited", rounds=4)
    spec = spec.model_copy(  # the live device, and a vandal with a login of its own bound to X0
        update={
            "devices": [
                *spec.served_by,
                DeviceSpec(id="vandal", nodes=["X0"]),
            ]
        }
    )
    store_path = tmp_path / "agent.sqlite"
    config = config_for(broker.url, store_path).model_copy(
        update={"input": InputSection(sender_rate_per_s=5.0, sender_burst=20)}
    )
    service = AgentService(config, [spec])
    vandalism = 300

    async def vandal() -> None:
        while (
            "limited" not in service.experiments or 0 not in service.experiments["limited"].rounds
        ):
            await asyncio.sleep(0.01)
        payloads = [
            encode(
                Reading(
                    experiment="limited", round=10_000, node="X0", value=0.5, seq=seq,
                    device_id="vandal", at=time.time(),
                )
            )
            for seq in range(vandalism)
        ]  # fmt: skip
        await asyncio.to_thread(
            flood, broker.port, topics.reading("limited", "vandal"), payloads, threading.Event()
        )

    with capture_logs() as logs:
        async with device_for(broker.url, "limited", delay_s=0.2):
            await asyncio.wait_for(asyncio.gather(service.run(), vandal()), WAIT_S)
    limited = rejected_counts(service, "limited").get("rate_limited", 0)
    assert vandalism - 20 - 5 * 30 <= limited < vandalism, limited
    published = {
        (e["round"], e["node"], e["seq"]): e["value"]
        for e in logs
        if e["event"] == "device.reading_published"
    }
    with Store(store_path) as store:
        stored = {
            (r.round, r.node, r.seq): r.value
            for r in store.readings("limited")
            if r.device_id != "vandal"
        }
        assert [r.status for r in store.rounds("limited")] == ["closed"] * 4
        letters = store.dead_letters("limited")
    assert stored == published and len(published) == 4 * len(spec.nodes)
    assert any(letter.reason == "rate_limited" for letter in letters)


def test_the_flood_structures_are_bounded() -> None:
    """What a flood could grow: rate buckets (one per sender it makes up) are capped, the
    oldest forgotten; the dead-letter queues are bounded."""
    bucket = runtime._TokenBucket(rate=1.0, burst=2.0, max_keys=100)
    for sender in range(10_000):
        bucket.take(("topic", f"made-up-{sender}"))
    assert len(bucket) == 100
    assert bucket.take(("topic", "made-up-9999")) and not bucket.take(("topic", "made-up-9999"))
    assert runtime.SENDERS_TRACKED == 10_000 and runtime.DEAD_LETTERS_QUEUED == 100
    assert runtime.INBOX_BYTES_LIMIT == 64 * 2**20


@pytest.mark.integration
async def test_measured_at_travels_from_the_device_to_the_export(
    mosquitto_factory, tmp_path: Path, capsys
) -> None:
    """Device -> broker -> store -> export: every exported reading's `measured_at` is the `at`
    its device put in the message (seen by a listener on the broker), `received_at` the
    agent's clock."""
    import csv

    from agent.cli import main
    from connectors.mqtt import BrokerConfig, MqttConnection
    from connectors.schemas import decode

    broker = mosquitto_factory(MosquittoOptions(extra_lines=shipped_limits()))
    spec = spec_for("measured", rounds=3)
    store_path = tmp_path / "agent.sqlite"
    service = AgentService(config_for(broker.url, store_path), [spec])
    seen: dict[tuple[int, str, int], float] = {}
    listening = asyncio.Event()

    async def listen() -> None:
        async with MqttConnection(BrokerConfig.from_url(broker.url)) as mqtt:
            await mqtt.subscribe("cbo/measured/+/reading")
            listening.set()
            async for message in mqtt.messages():
                reading = decode(message.payload, Reading)
                seen[(reading.round, reading.node, reading.seq)] = reading.at

    listener = asyncio.create_task(listen())
    await asyncio.wait_for(listening.wait(), WAIT_S)
    try:
        async with device_for(broker.url, "measured", delay_s=0.1):
            await asyncio.wait_for(service.run(), WAIT_S)
        await asyncio.sleep(0.5)  # the listener's copies
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    capsys.readouterr()
    out = tmp_path / "export"
    assert main(["export", "measured", "--store", str(store_path), "--out", str(out)]) == 0
    with open(out / "measured_readings.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 * len(spec.nodes)
    exported = {(int(r["round"]), r["node"], int(r["seq"])): float(r["measured_at"]) for r in rows}
    assert exported == {key: seen[key] for key in exported}
    assert all(float(r["received_at"]) >= float(r["measured_at"]) - 1.0 for r in rows)
