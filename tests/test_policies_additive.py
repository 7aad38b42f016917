"""hagpucb and addgpucb on a small additive problem, in process (no service)."""

from __future__ import annotations

import itertools

import pytest
import torch

from core.network import NetworkModel
from core.spec import parse_spec
from core.structure import stencil_size
from policies.base import Constraints
from policies.registry import make_policy

D = 6
TRUE_GROUPS = [(0, 1), (2, 3), (4,), (5,)]


def _value(theta: torch.Tensor) -> float:
    x = theta
    return float(
        -((x[0] - 0.3) ** 2)
        - (x[1] - 0.7) ** 2
        + 2 * (x[0] - 0.3) * (x[1] - 0.7)
        + torch.sin(3 * x[2] * x[3])
        - (x[4] - 0.5) ** 2
        - (x[5] - 0.2) ** 2
    )


def _spec(policy: str, settings: dict) -> object:
    return parse_spec(
        {
            "name": "small",
            "intervention": "soft",
            "nodes": [{"name": "R", "bounds": [-3, 3], "noise_std": 0.001}],
            "parameters": {
                "name": "theta",
                "dimension": D,
                "bounds": [0, 1],
                "targets": ["R"],
                "blocks": {"a": [0, 2], "b": [2, 4]},
            },
            "reward": {"node": "R"},
            "model": {"refit_every": 10},
            "policy": {"name": policy, "settings": settings},
            "initial_design": {"rounds": 0},
        }
    )


def _play(policy_name: str, settings: dict, rounds: int):
    spec = _spec(policy_name, settings)
    model = NetworkModel(spec)
    policy = make_policy(policy_name, spec, settings)
    rng = torch.Generator().manual_seed(0)
    noise = torch.Generator().manual_seed(1)
    proposals = []
    for _ in range(rounds):
        proposal = policy.propose(model, Constraints.from_spec(spec), rng)
        theta = torch.tensor([proposal.intervention[n] for n in spec.action_names])
        y = _value(theta) + 0.001 * float(torch.randn(1, generator=noise))
        model.learn(proposal.intervention, {"R": y})
        proposals.append((proposal, _value(theta)))
    return policy, proposals


def test_hagpucb_learns_the_structure_then_climbs():
    phase_one = stencil_size(D)
    policy, played = _play("hagpucb", {"step": 0.3, "candidates": 64, "sweeps": 2}, phase_one + 12)
    assert all(p.diagnostics["phase"] == 1 for p, _ in played[:phase_one])
    assert policy.structure is not None
    assert set(policy.structure.edges) == {(0, 1), (2, 3)}
    assert policy.structure.groups == ((0, 1), (2, 3), (4,), (5,))
    phase_two = [value for p, value in played[phase_one:]]
    assert played[-1][0].diagnostics["phase"] == 2
    assert max(phase_two) > max(value for _, value in played[:phase_one])


def test_addgpucb_uses_the_spec_blocks_as_groups():
    _, played = _play("addgpucb", {"candidates": 64, "sweeps": 2}, 15)
    assert played[0][0].diagnostics["groups"] == 4  # blocks a, b and two singletons
    assert max(v for _, v in played[8:]) > max(v for _, v in played[:3])


def test_hagpucb_asks_again_for_a_stencil_point_whose_round_got_no_reward():
    spec = _spec("hagpucb", {})
    model = NetworkModel(spec)
    policy = make_policy("hagpucb", spec, {})
    rng = torch.Generator().manual_seed(0)
    first = policy.propose(model, Constraints(), rng)
    model.start_round(first.intervention)  # played, but the reading never came
    second = policy.propose(model, Constraints(), rng)
    assert second.intervention != first.intervention
    for _ in range(stencil_size(D) - 1):
        p = policy.propose(model, Constraints(), rng)
        model.learn(p.intervention, {"R": 0.0})
    again = policy.propose(model, Constraints(), rng)
    assert again.intervention == first.intervention and again.diagnostics["phase"] == 1


@pytest.mark.slow  # statistical: 60 rounds, ten generations
def test_cmaes_plays_whole_generations_and_improves():
    policy, played = _play("cmaes", {"popsize": 6}, 60)
    generations = [p.diagnostics["generation"] for p, _ in played]
    assert generations[:6] == [0] * 6 and generations[6] == 1
    first, last = [v for _, v in played[:6]], [v for _, v in played[-6:]]
    assert sum(last) / 6 > sum(first) / 6
    assert policy.generations == 9


def test_additive_acquisition_colours_are_exact_block_moves_and_never_lower_ucb():
    from policies._additive_ucb import _colour_classes, _overlaps

    dim = 14
    chain = [[i, i + 1] for i in range(0, 9)] + [[9, 10, 11], [12], [13]]  # overlaps + disjoint
    spec = parse_spec(
        {
            "name": "chain",
            "intervention": "soft",
            "nodes": [{"name": "R", "bounds": [-20, 20], "noise_std": 0.01}],
            "parameters": {"name": "theta", "dimension": dim, "bounds": [-1, 1], "targets": ["R"]},
            "reward": {"node": "R"},
            "policy": {"name": "addgpucb", "settings": {"groups": chain}},
            "initial_design": {"rounds": 0},
        }
    )
    policy = make_policy("addgpucb", spec, {"groups": chain, "polish": 0})
    ucb = policy._ucb
    neighbours = _overlaps(ucb.groups)
    for colour in _colour_classes(ucb.groups):  # no two moves of a colour touch one term
        for a in colour:
            for b in colour:
                assert a == b or not set(neighbours[a]) & set(neighbours[b])
    model = NetworkModel(spec)
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        x = 2 * torch.rand(dim, generator=g, dtype=torch.float64) - 1
        y = float(torch.sin(3 * x[:-1] * x[1:]).sum() - (x**2).sum())
        model.learn(dict(zip(spec.action_names, x.tolist(), strict=True)), {"R": y})
    ucb.sync(model)
    theta = ucb._start()
    rng = torch.Generator().manual_seed(1)
    values = [float(ucb._acquisition(theta))]
    for step in (0.2, 0.1):
        for plan in ucb._plans:
            before = theta.clone()
            ucb._update(theta, plan, step, rng)
            values.append(float(ucb._acquisition(theta)))
            moved = (theta != before).nonzero().flatten().tolist()
            owned = {c for i in plan.index.tolist() for c in i if c < dim}
            assert set(moved) <= owned  # a colour moves only its own groups' coordinates
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(values))
    assert values[-1] > values[0]
    polished = make_policy("addgpucb", spec, {"groups": chain, "polish": 30})
    proposal = polished.propose(model, Constraints(), torch.Generator().manual_seed(1))
    assert proposal.diagnostics["colours"] == len(polished._ucb._plans)
    assert proposal.acquisition_value >= values[0] - 1e-9
