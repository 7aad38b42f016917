"""Paper 000's role-based higher-order policy (sim/hom.py) and its ablations, alone and as the
predators' controller in mpe2's simple_tag."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from core.spec import load_spec
from sim.hom import HOMController
from sim.mpe_tag import ACT, CONTROLLERS, OBS, MPETag, controller_blocks, hom_controller
from tests.test_policies_properties import EXAMPLES

HOM_ENVS = {
    "mpe-tag-hom": "hom",
    "mpe-tag-hom-no-ra": "hom-no-ra",
    "mpe-tag-hom-no-ri": "hom-no-ri",
    "mpe-tag-het-hom": "hom",
}


def _draw(controller: HOMController, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, controller.dim), rng.normal(size=(controller.agents, controller.obs))


@pytest.mark.parametrize("controller", ["hom", "hom-no-ri"])
def test_permuting_the_agents_permutes_their_actions(controller):
    hom = hom_controller(controller)
    for seed in range(5):
        theta, states = _draw(hom, seed)
        actions = hom.numpy_actions(theta, states)
        assert actions.shape == (3, ACT) and np.all(np.abs(actions) < 1)
        for order in itertools.permutations(range(3)):
            order = list(order)
            np.testing.assert_allclose(
                hom.numpy_actions(theta, states[order]), actions[order], rtol=0, atol=1e-12
            )


def test_without_role_assignment_the_policy_is_tied_to_agent_order():
    """−RA: agent i always takes role i, so a permutation changes more than the action order."""
    hom = hom_controller("hom-no-ra")
    theta, states = _draw(hom, 0)
    actions = hom.numpy_actions(theta, states)
    moved = [
        np.abs(hom.numpy_actions(theta, states[list(order)]) - actions[list(order)]).max()
        for order in itertools.permutations(range(3))
        if list(order) != [0, 1, 2]
    ]
    assert min(moved) > 1e-6


def test_the_hungarian_assignment_maximizes_the_summed_affinity():
    hom = hom_controller("hom")
    for seed in range(5):
        theta, states = _draw(hom, seed)
        P = hom.assignment(torch.as_tensor(theta), torch.as_tensor(states), soft=False)
        w = theta[: 3 * (OBS + 1)].reshape(3, OBS + 1)
        affinity = w[:, :OBS] @ states.T + w[:, OBS, None]  # [role, agent]
        best = max(
            sum(affinity[i, agent] for i, agent in enumerate(order))
            for order in itertools.permutations(range(3))
        )
        chosen = [int(P[i].argmax()) for i in range(3)]
        assert sorted(chosen) == [0, 1, 2]
        assert np.isclose(sum(affinity[i, a] for i, a in enumerate(chosen)), best)


def test_every_variant_has_fewer_than_500_parameters():
    dims = {name: hom_controller(name).dim for name in CONTROLLERS if name != "mlp"}
    assert dims == {"hom": 414, "hom-no-ra": 363, "hom-no-ri": 164}
    # the paper's largest team (15 predators) still fits, with one role affinity per role
    assert HOMController(15, OBS, ACT).dim < 1000


@pytest.mark.parametrize("controller", ["hom", "hom-no-ra", "hom-no-ri"])
def test_the_blocks_tile_theta_in_order(controller):
    hom = hom_controller(controller)
    spans = list(hom.blocks.values())
    assert spans[0][0] == 0 and spans[-1][1] == hom.dim
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_the_role_blocks_are_the_role_affinities():
    """Role i's block holds Λ_i's weights then bias: the largest weight on s_0 takes the agent
    with the largest s_0 (rearrangement), whatever the other blocks hold."""
    hom = hom_controller("hom")
    theta, states = _draw(hom, 1)
    for i, weight in enumerate([0.0, 5.0, 1.0]):
        start, stop = hom.blocks[f"role_{i}"]
        theta[start:stop] = 0.0
        theta[start] = weight
    P = hom.assignment(torch.as_tensor(theta), torch.as_tensor(states), soft=False)
    order = np.argsort(states[:, 0])  # agents by s_0, smallest first
    assert [int(P[i].argmax()) for i in range(3)] == [order[0], order[2], order[1]]


def test_the_edge_block_gates_the_message_blocks():
    hom = hom_controller("hom")
    theta, states = _draw(hom, 2)
    start, stop = hom.blocks["edge_o0"]
    message = [span for name, span in hom.blocks.items() if name.startswith("message_")]

    def with_messages(base: np.ndarray, seed: int) -> np.ndarray:
        out = base.copy()
        rng = np.random.default_rng(seed)
        for a, b in message:
            out[a:b] = rng.uniform(-1, 1, b - a)
        return hom.numpy_actions(out, states)

    theta[start : stop - 1], theta[stop - 1] = 0.0, -100.0  # edge affinity < 0: no edges
    assert np.array_equal(with_messages(theta, 0), with_messages(theta, 1))
    theta[stop - 1] = 100.0  # every pair of roles interacts
    assert not np.allclose(with_messages(theta, 0), with_messages(theta, 1))


def test_the_soft_relaxation_has_a_hessian_coupling_roles_and_updates():
    """The paper's surrogate Hessian phase: Sinkhorn assignment and sigmoid edges are smooth."""
    hom = hom_controller("hom")
    theta, states = _draw(hom, 3)
    s = torch.as_tensor(states)
    hessian = torch.func.hessian(lambda t: hom.actions(t, s, soft=True).sum())(
        torch.as_tensor(theta)
    )
    assert hessian.shape == (hom.dim, hom.dim) and torch.isfinite(hessian).all()
    assert torch.allclose(hessian, hessian.T, atol=1e-8)
    (r0, r1), (u0, u1) = hom.blocks["role_0"], hom.blocks["update_o0"]
    assert hessian[r0:r1, u0:u1].abs().max() > 1e-8


@pytest.mark.parametrize("name", list(HOM_ENVS))
def test_the_specs_declare_the_hom_layout(name):
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    hom = hom_controller(HOM_ENVS[name])
    assert spec.parameters.dimension == hom.dim
    assert spec.parameters.blocks == hom.blocks == controller_blocks(HOM_ENVS[name])


def test_mpe_tag_hom_plays_simple_tag_episodes_through_mpe2():
    env = MPETag(controller="hom")
    assert env.name == "mpe-tag-hom" and env.dim == 414
    assert type(env._env.unwrapped).__module__.startswith("mpe2.")
    rng = np.random.default_rng(0)
    thetas = [rng.uniform(-1, 1, env.dim) for _ in range(3)]
    returns = [env.episode(theta, seed) for theta in thetas for seed in range(4)]
    assert all(r >= 0 and r % 10 == 0 for r in returns)
    assert env.episode(thetas[0], 2) == returns[2]  # a seed fixes the episode
    # the predators move by the HOM's actions, mapped from (−1, 1) onto MPE's [0, 1]
    obs = rng.normal(size=(3, OBS))
    moves = env._predator_actions(thetas[0], obs)
    np.testing.assert_allclose(moves, (1 + env._hom.numpy_actions(thetas[0], obs)) / 2)
    values = {f"theta.{i}": float(v) for i, v in enumerate(thetas[0])}
    reading = env.step(values, torch.Generator().manual_seed(0))
    assert set(reading) == {"R"} and reading["R"] % 10 == 0
    het = MPETag(heterogeneous=True, controller="hom-no-ri")
    assert het.name == "mpe-tag-het-hom-no-ri" and het.dim == 164
    assert het.episode(np.zeros(het.dim), 0) % 10 == 0
