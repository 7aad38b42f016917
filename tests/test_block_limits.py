"""Cardinality on a parameter vector's blocks: at most k blocks of θ changed from its default per
round — kept by the policies that take it, refused by the others, enforced by the service."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import torch

from agent.runtime import AgentService
from agent.validate import check_policy
from agent.vetting import Violation, vet
from connectors.mqtt import BrokerConfig
from connectors.store import Store
from core.network import NetworkModel
from core.spec import parse_spec
from policies._blocks import nearest_units
from policies.base import Constraints
from policies.registry import make_policy
from sim.additive_er import AdditiveER
from sim.device import DeviceSettings, SimulatorDevice
from tests.test_agent_service import agent_config

D = 5
BLOCKS = {"a": [0, 2], "b": [2, 4]}  # theta.4 is a block of its own
WAIT_S = 120.0


SETTINGS = {
    "addgpucb": {"candidates": 16, "polish": 5},
    "hagpucb": {"candidates": 16, "polish": 5},
    "gpucb": {"max_seconds": 5.0, "restarts": 2, "raw_samples": 64},
    "cmaes": {"popsize": 4},
    "random": {},
    "mcbo": {},
}


def _spec(policy: str = "addgpucb", limit: int = 1, rounds: int = 6, design: int = 2):
    return parse_spec(
        {
            "name": "lim",
            "intervention": "soft",
            "nodes": [{"name": "R", "bounds": [-3, 3], "noise_std": 0.01}],
            "parameters": {
                "name": "theta",
                "dimension": D,
                "bounds": [0, 1],
                "targets": ["R"],
                "blocks": BLOCKS,
                "default": 0.5,
            },
            "reward": {"node": "R"},
            "constraints": {"max_interventions": limit},
            "model": {"refit_every": 10},
            "policy": {"name": policy, "settings": SETTINGS[policy]},
            "initial_design": {"rounds": design},
            "schedule": {"max_rounds": rounds, "ack_timeout_s": 5.0, "round_timeout_s": 5.0},
        }
    )


def _theta(values) -> dict[str, float]:
    return {f"theta.{i}": float(v) for i, v in enumerate(values)}


def test_the_constraints_carry_the_limit_as_blocks_not_actions():
    constraints = Constraints.from_spec(_spec(limit=2))
    assert constraints.max_blocks == 2 and constraints.max_interventions is None


def test_the_service_check_refuses_more_blocks_than_the_limit():
    spec = _spec(limit=1)
    constraints = Constraints.from_spec(spec)
    one = vet(spec, _theta([0.9, 0.1, 0.5, 0.5, 0.5]), constraints)  # block a only
    assert one.intervention["theta.0"] == 0.9
    with pytest.raises(Violation) as refused:
        vet(spec, _theta([0.9, 0.5, 0.5, 0.5, 0.2]), constraints)  # a and theta.4
    assert refused.value.reason == "max_interventions"
    assert "2 blocks of theta changed from its default ['a', 'theta.4'], at most 1" in str(
        refused.value.detail
    )


def test_policies_that_do_not_keep_it_refuse_the_spec():
    (problem,) = check_policy(_spec("mcbo"))
    assert "does not keep a limit on the blocks of θ changed per round" in problem
    assert "policies that do: addgpucb, cmaes, gpucb, hagpucb, random" in problem


def _r(x: dict[str, float]) -> float:
    """Only block b matters: R peaks at θ_2 = θ_3 = 0.9, with an interaction inside b."""
    t2, t3 = x["theta.2"], x["theta.3"]
    return -((t2 - 0.9) ** 2) - (t3 - 0.9) ** 2 + 1.5 * (t2 - 0.9) * (t3 - 0.9)


@pytest.mark.parametrize("limit", [1, 2])
@pytest.mark.parametrize("name", ["gpucb", "cmaes", "hagpucb", "addgpucb"])
def test_no_proposal_changes_more_blocks_than_the_limit(name, limit):
    """Every round a policy plays — hagpucb's phase 1 and 2, every CMA-ES candidate — changes
    at most `limit` of the 3 units of θ, and the service's own check passes it."""
    spec = _spec(name, limit)
    policy = make_policy(name, spec, spec.policy.settings)
    model, rng = NetworkModel(spec), torch.Generator().manual_seed(0)
    rounds = getattr(policy, "phase_one_rounds", 0) + (9 if name == "cmaes" else 6)
    changed = []
    for _ in range(rounds):
        constraints = Constraints.from_spec(spec)
        proposal = policy.propose(model, constraints, rng)
        vet(spec, proposal.intervention, constraints)  # raises Violation past the limit
        changed.append(spec.parameters.changed_units(proposal.intervention))
        model.learn(proposal.intervention, {"R": _r(proposal.intervention)})
    assert all(len(c) <= limit for c in changed)
    assert any(len(c) == limit for c in changed)  # the limit binds, not an idle policy
    if name == "cmaes":  # the projected candidates are found in the history: generations move
        assert policy.generations >= 2


def test_gpucb_moves_the_block_its_acquisition_values_most():
    spec = _spec("gpucb", 1)
    policy, model = make_policy("gpucb", spec, spec.policy.settings), NetworkModel(spec)
    rng = torch.Generator().manual_seed(0)
    explorer = make_policy("random", spec)
    for _ in range(12):
        x = explorer.propose(model, Constraints.from_spec(spec), rng).intervention
        model.learn(x, {"R": _r(x)})
    proposal = policy.propose(model, Constraints.from_spec(spec), rng)
    assert proposal.diagnostics["blocks_changed"] == ["b"]
    assert spec.parameters.changed_units(proposal.intervention) == ["b"]
    assert proposal.intervention["theta.2"] > 0.6 and proposal.intervention["theta.3"] > 0.6


def test_cmaes_projects_a_candidate_onto_its_farthest_blocks():
    spec = _spec("cmaes", 1)
    theta = [0.5, 0.9, 0.1, 0.5, 0.8]  # a: 0.16, b: 0.16 + 0, theta.4: 0.09
    assert nearest_units(spec, theta, 1) in (["a"], ["b"])
    assert nearest_units(spec, [0.5, 0.9, 0.0, 0.5, 0.8], 1) == ["b"]  # b: 0.25 > a: 0.16
    assert nearest_units(spec, [0.5, 0.9, 0.0, 0.5, 0.8], 2) == ["a", "b"]
    assert nearest_units(spec, [0.5] * 5, 2) == []  # nothing moved, nothing kept


@pytest.mark.parametrize(("limit", "pairs"), [(1, 2), (2, 10)])
def test_hagpucb_phase_one_sits_at_the_default_and_finds_the_edge_inside_b(limit, pairs):
    """k = 1: one stencil at the default with only the pairs inside a block (a: (0,1), b:
    (2,3)); k = 2: all 10 pairs. Either way the one edge (2, 3) is found and nothing else."""
    spec = _spec("hagpucb", limit)
    policy = make_policy("hagpucb", spec, spec.policy.settings)
    assert policy.phase_one_rounds == 1 + D + pairs
    model, rng = NetworkModel(spec), torch.Generator().manual_seed(0)
    for _ in range(policy.phase_one_rounds):
        proposal = policy.propose(model, Constraints.from_spec(spec), rng)
        assert proposal.diagnostics["phase"] == 1
        model.learn(proposal.intervention, {"R": _r(proposal.intervention)})
    policy.propose(model, Constraints.from_spec(spec), rng)
    assert policy.structure.edges == ((2, 3),)


@pytest.mark.parametrize("limit", [1, 2])
def test_random_changes_at_most_the_limit_of_blocks(limit):
    spec = _spec("random", limit)
    policy, model = make_policy("random", spec), NetworkModel(spec)
    rng = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(40):
        proposal = policy.propose(model, Constraints.from_spec(spec), rng)
        changed = spec.parameters.changed_units(proposal.intervention)
        assert len(changed) == limit  # uniform values never hit the default exactly
        seen.add(tuple(changed))
    assert len(seen) == 3  # every choice of blocks is drawn: C(3, 1) = C(3, 2) = 3


def test_addgpucb_moves_the_block_its_acquisition_values_most():
    """Only block b matters (R peaks at θ_2 = θ_3 = 0.9); after data, the one block moved is b."""
    spec = _spec("addgpucb", 1)
    policy, model = make_policy("addgpucb", spec, spec.policy.settings), NetworkModel(spec)
    rng = torch.Generator().manual_seed(0)
    explorer = make_policy("random", spec)
    for _ in range(12):
        x = explorer.propose(model, Constraints.from_spec(spec), rng).intervention
        value = -((x["theta.2"] - 0.9) ** 2) - (x["theta.3"] - 0.9) ** 2
        model.learn(x, {"R": value})
    proposal = policy.propose(model, Constraints.from_spec(spec), rng)
    assert proposal.diagnostics["blocks_changed"] == ["b"]
    assert spec.parameters.changed_units(proposal.intervention) == ["b"]
    assert proposal.intervention["theta.2"] > 0.6 and proposal.intervention["theta.3"] > 0.6
    assert [proposal.intervention[f"theta.{i}"] for i in (0, 1, 4)] == [0.5, 0.5, 0.5]


@pytest.mark.integration
async def test_the_service_publishes_rounds_within_the_block_limit(mosquitto, tmp_path):
    rounds = 6
    device = SimulatorDevice(
        AdditiveER(D, seed=0),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="lim", delay_s=0.0, jitter_s=0.0, seed=1),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    events = []
    spec = _spec("addgpucb", 1, rounds)
    service = AgentService(
        agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec], on_event=events.append
    )
    try:
        await asyncio.wait_for(service.run(), WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task
    closed = [e for e in events if e.kind == "closed"]
    assert len(closed) == rounds and all(e.detail == "complete" for e in closed)
    with Store(tmp_path / "agent.sqlite") as store:
        stored = store.rounds("lim")
    assert len(stored) == rounds
    assert all(len(spec.parameters.changed_units(r.intervention)) <= 1 for r in stored)
    assert any(spec.parameters.changed_units(r.intervention) for r in stored)
