"""Visited states through the service (issue 13): MaMuJoCo's Swimmer device sends the states
its controller visited with each episode's return (cbo.reading version 4) on a real Mosquitto;
`hagpucb` with a controller and `visited_states` plays phase 0 until they have arrived, then
reads the structure off its surrogate Hessian at those states. A restart replays them."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agent.runtime import AgentService
from connectors.mqtt import BrokerConfig
from connectors.store import Store
from core.spec import parse_spec
from sim.device import DeviceSettings, SimulatorDevice
from tests.test_agent_service import agent_config

WAIT_S = 240.0
# a Swimmer trace is thinned to 682 states (8,192 values of 2 agents × 6 observations):
# two episodes bring 1,364 ≥ 1,000
VISITED = 1000


def _spec(rounds: int):
    from core.spec import load_spec
    from tests.test_surrogate_hessian import EXAMPLES

    data = load_spec(EXAMPLES / "mamujoco-swimmer.yaml").model_dump(mode="json", exclude_none=True)
    data["name"] = "swim"
    data["policy"] = {
        "name": "hagpucb",
        "settings": {
            "controller": "mamujoco-swimmer",
            "visited_states": VISITED,
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
