"""Visited states through the service (issue 13): MaMuJoCo's Swimmer device sends the states
its controller visited with each episode's return (cbo.reading version 4) on a real Mosquitto;
`hagpucb` with a controller and `visited_states` plays phase 0 until they have arrived, then
reads the structure off its surrogate Hessian at those states. A restart replays them. The
command line's device (`cbo-agent sim mpe-tag --send-states`) sends MPE's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from agent.runtime import AgentService
from bench.harness.procs import child_environment, cli
from connectors.mqtt import BrokerConfig
from connectors.store import Store
from core.spec import parse_spec
from sim.device import DeviceSettings, SimulatorDevice
from tests.test_agent_service import agent_config

WAIT_S = 240.0
# a Swimmer trace is thinned to 682 states (8,192 values of 2 agents × 6 observations):
# two episodes bring 1,364 ≥ 1,000
VISITED = 1000


def _spec(rounds: int, env: str = "mamujoco-swimmer", name: str = "swim", visited=VISITED):
    from core.spec import load_spec
    from tests.test_surrogate_hessian import EXAMPLES

    data = load_spec(EXAMPLES / f"{env}.yaml").model_dump(mode="json", exclude_none=True)
    data["name"] = name
    data["policy"] = {
        "name": "hagpucb",
        "settings": {
            "controller": env,
            "visited_states": visited,
            "candidates": 16,
            "sweeps": 1,
        },
    }
    data["initial_design"] = {"rounds": 0}
    data["schedule"] = {"max_rounds": rounds, "ack_timeout_s": 30.0, "round_timeout_s": 60.0}
    return parse_spec(data)


async def _serve(mosquitto, path, rounds: int) -> tuple[AgentService, list]:
    from sim.mamujoco import MaMuJoCoSwimmer

    device = SimulatorDevice(
        MaMuJoCoSwimmer(),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="swim", delay_s=0.0, jitter_s=0.0, seed=1, send_states=True),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    events: list = []
    service = AgentService(
        agent_config(mosquitto.url, path), [_spec(rounds)], on_event=events.append
    )
    try:
        await asyncio.wait_for(service.run(), WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task
    return service, events


@pytest.mark.integration
@pytest.mark.slow  # two agents' lives and three MuJoCo episodes: ~30 s at load 10 on 2 cores
async def test_visited_states_reach_the_surrogate_hessian_and_survive_a_restart(
    mosquitto, tmp_path
):
    path = tmp_path / "agent.sqlite"
    service, events = await _serve(mosquitto, path, rounds=2)
    closed = [e for e in events if e.kind == "closed"]
    assert len(closed) == 2 and all(e.detail == "complete" for e in closed)
    policy = service.experiments["swim"].policy
    assert policy.structure is None  # phase 0 only: 682 states after round 0, < 1,000
    with Store(path) as store:
        traces = store.visited_states("swim")
        assert [t.round for t in traces] == [0, 1]
        assert all(t.array().shape == (682, 2, 6) for t in traces)
        # the two rounds were episodes like any other: charged
        assert store.ledger("swim").spent == pytest.approx(2.0)

    service, events = await _serve(mosquitto, path, rounds=3)  # a new agent on the same store
    policy = service.experiments["swim"].policy
    # the restart replayed the two stored traces: round 2 ran phase 1 on them, no more waiting
    assert policy.structure is not None
    assert policy.structure.groups == (tuple(range(7)), tuple(range(7, 14)))
    with Store(path) as store:
        assert [t.round for t in store.visited_states("swim")] == [0, 1, 2]
    assert policy._visited_rows == 3 * 682


def _wait_until_subscribed(log: Path, device: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                if json.loads(line).get("event") == "device.subscribed":
                    return
        assert device.poll() is None, f"exited {device.returncode}: {log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no device.subscribed in {timeout_s} s: {log.read_text()[-3000:]}")


@pytest.mark.integration
async def test_the_command_lines_device_sends_mpe_states_with_send_states(mosquitto, tmp_path):
    """`cbo-agent sim mpe-tag --send-states`, a process of its own: each 25-step episode's
    three predators' observations (16 each) ride on its return; the agent stores them and
    hands them to hagpucb, which waits in phase 0 (it asks for more than two episodes bring)."""
    log = tmp_path / "device.log"
    argv = [*cli(), "sim", "mpe-tag", "--experiment", "tag", "--broker", mosquitto.url]
    with open(log, "w") as out:
        device = subprocess.Popen(
            [*argv, "--send-states"], stdout=out, stderr=out, env=child_environment()
        )
    path = tmp_path / "agent.sqlite"
    try:
        await asyncio.to_thread(_wait_until_subscribed, log, device, WAIT_S)
        service = AgentService(
            agent_config(mosquitto.url, path), [_spec(2, "mpe-tag", "tag", visited=1000)]
        )
        await asyncio.wait_for(service.run(), WAIT_S)
    finally:
        device.terminate()
        device.wait(30)
    policy = service.experiments["tag"].policy
    assert policy.structure is None and policy._visited_rows == 2 * 25  # phase 0 throughout
    with Store(path) as store:
        traces = store.visited_states("tag")
        readings = store.readings("tag")
    assert [(t.round, t.device_id) for t in traces] == [(0, "sim-tag"), (1, "sim-tag")]
    for trace in traces:
        states = trace.array()
        assert states.shape == (25, 3, 16) and np.isfinite(states).all()
        # simple_tag's predator observation starts with its own velocity (0 at the reset)
        # and position; the predators start apart
        assert np.array_equal(states[0, :, :2], np.zeros((3, 2)))
        assert len({tuple(p) for p in states[0, :, 2:4].round(6)}) == 3
    assert sorted(r.round for r in readings) == [0, 1]
