"""A lease handover with a round's feedback in flight: no reading is lost.

Replica A (a `cbo-agent serve` process) publishes round 0 and is frozen (SIGSTOP) before it can
read anything; the device, whose persistent session queued the action, applies it and
publishes its ack and readings while A cannot store them; A is killed (kill -9) and its
queued input dies with it, after the action's first expiry has passed. Replica B takes the
experiment over and finds round 0 open and never acknowledged in the store: recovery restarts
its ack window, B publishes it again under its own epoch, and the device, seeing a newer epoch
on an action it applied, acknowledges it again and publishes its readings again (docs/
protocol.md, "Fencing"). Every reading the device sent must end up in the store, and the
action must not be applied twice. Everything is real and on loopback: Mosquitto, a SQLite
store shared by the two processes, the simulated device in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.control import submit
from agent.paths import example_spec
from bench.fleet import FleetRig
from bench.harness.procs import wait_until
from connectors.mqtt import BrokerConfig, MqttConnection
from connectors.schemas import Reading, decode
from connectors.topics import Topics
from core.spec import parse_spec
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment
from tests.brokers import find_mosquitto

TTL_S = 3.0
ACK_WINDOW_S = 4.0  # the action expires this long after it is issued (one attempt)
NAME = "handover-0"
pytestmark = [pytest.mark.integration]


def _spec() -> dict[str, Any]:
    spec = yaml.safe_load(example_spec("toygraph").read_text())
    spec["name"] = NAME
    spec["policy"] = {"name": "random", "settings": {}}
    spec["schedule"] = {
        "max_rounds": 3,
        "ack_timeout_s": ACK_WINDOW_S,
        "ack_retries": 0,
        "round_timeout_s": 3.0,
    }
    return spec


def _device(url: str) -> SimulatorDevice:
    """The experiment's device on a persistent session: the broker queues its actions while
    it is away."""
    broker = BrokerConfig.from_url(
        url, client_id=f"sim-{NAME}", clean_start=False, session_expiry_s=600, timeout_s=10.0
    )
    settings = DeviceSettings(experiment=NAME, delay_s=0.05, seed=0, publish_oracle=False)
    return SimulatorDevice(make_environment("toygraph", 0), broker, settings)


async def _run_until_ready(device: SimulatorDevice) -> asyncio.Task[None]:
    task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), 30)
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_readings_sent_while_the_owner_was_frozen_are_stored_by_the_next(
    tmp_path: Path,
) -> None:
    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed")
    with FleetRig(
        tmp_path,
        str(tmp_path / "fleet.sqlite"),
        experiments=0,
        replicas=0,
        lease_ttl_s=TTL_S,
        capacity=1,
    ) as rig:
        assert rig.broker is not None
        rig.names = [NAME]
        published: set[tuple[int, str, int]] = set()  # what the device sent: the witness
        async with MqttConnection(BrokerConfig.from_url(rig.broker.url)) as witness:
            await witness.subscribe(f"{Topics().prefix}/{NAME}/+/reading")

            async def watch() -> None:
                async for message in witness.messages():
                    reading = decode(message.payload, Reading)
                    published.add((reading.round, reading.node, reading.seq))

            watching = asyncio.create_task(watch())
            await _stop(await _run_until_ready(_device(rig.broker.url)))  # session made

            a = await asyncio.to_thread(rig.start_replica, "replica-a")
            submit(rig.store, [parse_spec(_spec(), NAME)])
            await asyncio.to_thread(a.log.wait_for, "round.published", 60, child=a, round=0)
            a.pause()  # frozen before the device can answer: nothing of round 0 is stored
            round0 = rig.store.rounds(NAME)[0]
            assert round0.status == "published" and round0.expires_at is not None

            device = _device(rig.broker.url)
            running = await _run_until_ready(device)  # the queued action arrives
            await asyncio.to_thread(
                wait_until, "round 0's readings published", lambda: len(published) >= 3, 20
            )
            assert device.applied == 1
            a.kill()  # its queued input dies with it
            sent = {(n, node, seq) for n, node, seq in published if n == 0}

            # B arrives once the action's first window has passed: the device applied it, the
            # store never heard so, and only the device still has the readings
            await asyncio.sleep(max(0.0, round0.expires_at + 0.5 - time.time()))
            b = await asyncio.to_thread(rig.start_replica, "replica-b")
            await asyncio.to_thread(b.log.wait_for, "fleet.taken", 30, child=b)

            def stored() -> set[tuple[int, str, int]]:
                return {(r.round, r.node, r.seq) for r in rig.store.readings(NAME) if r.round == 0}

            try:
                await asyncio.to_thread(
                    wait_until, "round 0's readings stored", lambda: sent <= stored(), 20
                )
            finally:
                await _stop(running)
                await _stop(watching)
            assert device.applied == 1  # asked again, not applied again
