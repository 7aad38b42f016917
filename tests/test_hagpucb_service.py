"""HA-GP-UCB through the service: θ published packed (cbo.action v3) to a simulator device on a
real Mosquitto, phase 1's stencil episodes, then additive GP-UCB rounds."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agent.runtime import AgentService
from connectors.mqtt import BrokerConfig
from connectors.store import Store
from core.spec import parse_spec
from core.structure import stencil_size
from sim.additive_er import AdditiveER
from sim.device import DeviceSettings, SimulatorDevice
from tests.test_agent_service import agent_config

D = 5
PHASE_TWO = 3
WAIT_S = 120.0


def _spec():
    return parse_spec(
        {
            "name": "hag",
            "intervention": "soft",
            "nodes": [{"name": "R", "bounds": [-8, 8], "noise_std": 0.1}],
            "parameters": {
                "name": "theta",
                "dimension": D,
                "bounds": [0, 1],
                "targets": ["R"],
                "cost": 1.0,
            },
            "reward": {"node": "R"},
            "constraints": {"budget_total": 100},
            "model": {"refit_every": 10},
            "policy": {
                "name": "hagpucb",
                "settings": {"step": 0.4, "candidates": 32, "sweeps": 1},
            },
            "initial_design": {"rounds": 0},
            "schedule": {
                "max_rounds": stencil_size(D) + PHASE_TWO,
                "ack_timeout_s": 5.0,
                "round_timeout_s": 5.0,
            },
        }
    )


@pytest.mark.integration
async def test_hagpucb_runs_phase_one_then_additive_ucb_through_the_service(mosquitto, tmp_path):
    env = AdditiveER(D, seed=0)
    device = SimulatorDevice(
        env,
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="hag", delay_s=0.0, jitter_s=0.0, seed=1),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    events = []
    service = AgentService(
        agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [_spec()], on_event=events.append
    )
    try:
        await asyncio.wait_for(service.run(), WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task

    rounds = stencil_size(D) + PHASE_TWO
    closed = [e for e in events if e.kind == "closed"]
    assert len(closed) == rounds and all(e.detail == "complete" for e in closed)
    exp = service.experiments["hag"]
    policy = exp.policy
    assert policy.structure is not None  # phase 1 ended, the groups were learned
    assert {c for g in policy.structure.groups for c in g} == set(range(D))
    with Store(tmp_path / "agent.sqlite") as store:
        stored = store.rounds("hag")
        assert len(stored) == rounds and {r.status for r in stored} == {"closed"}
        # every coordinate of θ reached the device and was applied as sent (an ack that differs
        # would be stored)
        assert all(r.applied in (None, r.intervention) for r in stored)
        assert all(len(r.intervention) == D for r in stored)
        # the budget: one unit per episode, phase 1 included
        assert store.ledger("hag").spent == pytest.approx(rounds)


@pytest.mark.integration
async def test_hagpucb_with_a_controller_plays_phase_two_from_round_one_through_the_service(
    mosquitto, tmp_path
):
    """The surrogate route: MaMuJoCo's Swimmer device runs the two agents' linear policies, the
    agent reads the structure off its own copy of them (no structure episode), and every round
    is additive GP-UCB on the two agents' blocks."""
    from core.spec import load_spec
    from sim.mamujoco import MaMuJoCoSwimmer
    from tests.test_surrogate_hessian import EXAMPLES

    rounds = 3
    data = load_spec(EXAMPLES / "mamujoco-swimmer.yaml").model_dump(mode="json", exclude_none=True)
    data["name"] = "swim"
    data["policy"] = {
        "name": "hagpucb",
        "settings": {"controller": "mamujoco-swimmer", "candidates": 16, "sweeps": 1},
    }
    data["initial_design"] = {"rounds": 0}
    data["schedule"] = {"max_rounds": rounds, "ack_timeout_s": 30.0, "round_timeout_s": 60.0}
    spec = parse_spec(data)
    device = SimulatorDevice(
        MaMuJoCoSwimmer(),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="swim", delay_s=0.0, jitter_s=0.0, seed=1),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    events = []
    service = AgentService(
        agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec], on_event=events.append
    )
    try:
        await asyncio.wait_for(service.run(), 2 * WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task

    closed = [e for e in events if e.kind == "closed"]
    assert len(closed) == rounds and all(e.detail == "complete" for e in closed)
    policy = service.experiments["swim"].policy
    assert policy.phase_one_rounds == 0
    assert policy.structure.groups == (tuple(range(7)), tuple(range(7, 14)))
    with Store(tmp_path / "agent.sqlite") as store:
        assert len(store.rounds("swim")) == rounds
