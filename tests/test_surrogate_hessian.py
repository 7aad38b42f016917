"""hagpucb's surrogate-Hessian phase 1 (paper 000, Sec. 4.5): ∂²π/∂θ² of the controller the
devices run, its edges on policies whose structure is known, and the settings' mistakes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.network import NetworkModel
from core.spec import load_spec
from core.structure import maximal_cliques, structure_from_hessian, surrogate_hessian
from policies._controllers import controller
from policies.base import Constraints
from policies.registry import make_policy

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _states(n: int, agents: int, obs: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return -2 + 4 * torch.rand(n, agents, obs, generator=g, dtype=torch.float64)


def _theta(dim: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(dim, generator=g, dtype=torch.float64) * 2 - 1


def _block_policy(theta: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """A policy with known block-diagonal coupling: θ = [A (0:3), B (3:6), c (6)];
    π = (tanh(A·s), tanh(B·s)·sin(B₀), c·s₀) — A and B each a clique, c coupled to nothing."""
    s = state[0]
    return torch.stack(
        [
            torch.tanh(theta[0:3] @ s),
            torch.tanh(theta[3:6] @ s) * torch.sin(theta[3]),
            theta[6] * s[0],
        ]
    )


def test_the_block_diagonal_coupling_of_a_known_policy_is_recovered():
    states = _states(3, 1, 3)
    total = surrogate_hessian(_block_policy, _theta(7), states)
    structure = structure_from_hessian(total, 1e-9 * float(total.max()))
    within = {(a, b) for block in ((0, 1, 2), (3, 4, 5)) for a in block for b in block if a < b}
    assert set(structure.edges) == within
    assert structure.groups == ((0, 1, 2), (3, 4, 5), (6,))
    assert float(total[:3, 3:].abs().max()) == 0.0 and float(total[6].abs().max()) == 0.0


def test_the_surrogate_is_the_mean_over_states_of_the_summed_absolute_output_hessians():
    theta, states = _theta(7), _states(2, 1, 3)
    total = surrogate_hessian(_block_policy, theta, states)
    by_hand = torch.zeros(7, 7, dtype=torch.float64)
    for state in states:
        for k in range(3):
            h = torch.autograd.functional.hessian(
                lambda t, s=state, k=k: _block_policy(t, s)[k], theta
            )
            by_hand += h.abs() / 2
    by_hand.fill_diagonal_(0.0)
    torch.testing.assert_close(total, by_hand)


@pytest.mark.parametrize(
    ("name", "module", "obs"),
    [("mpe-tag", "sim.mpe_tag", 16), ("mamujoco-swimmer", "sim.mamujoco", 6)],
)
def test_the_agents_copy_of_a_controller_is_the_one_the_devices_run(name, module, obs):
    import importlib

    sim = importlib.import_module(module)
    found = controller(name)
    theta, states = _theta(found.dim), _states(1, found.agents, obs)[0]
    numpy = sim.mlp_actions if name == "mpe-tag" else sim.linear_actions
    expected = numpy(theta.numpy(), states.numpy()).reshape(found.agents, -1)
    np.testing.assert_allclose(found.actions(theta, states).numpy(), expected, rtol=1e-12)


def test_the_ant_controller_matches_the_device_and_its_joints_are_the_cliques():
    from sim import mamujoco_ant

    found = controller("mamujoco-ant")
    # small states: 19 inputs at ±2 saturate tanh, whose curvature then underflows (its
    # entries e^-40 of the largest, below any cut-off)
    theta, states = _theta(found.dim), 0.1 * _states(2, found.agents, found.obs)
    expected = mamujoco_ant.linear_actions(theta.numpy(), states[0].numpy())
    np.testing.assert_allclose(found.actions(theta, states[0]).numpy(), expected, rtol=1e-12)
    total = surrogate_hessian(found.actions, theta, states)
    # 8 joints × C(20, 2) = 1,520 edges: past the default cap of 1,500, which drops 20
    capped = structure_from_hessian(total, 1e-9 * float(total.max()))
    assert len(capped.edges) == 1500 and capped.dropped == 20
    structure = structure_from_hessian(total, 1e-9 * float(total.max()), max_edges=2000)
    joints = tuple(tuple(range(a, b)) for a, b in mamujoco_ant.blocks().values())
    assert structure.groups == joints  # 8 joints' linear-tanh units, nothing across


def test_the_hom_relaxation_couples_its_networks():
    """The soft HOM (Sinkhorn roles, sigmoid edges) has Hessian entries across its networks:
    role affinities × update, edge affinity × message — what the paper's Fig. 3 shows."""
    found = controller("mpe-tag-hom-no-ri")  # 164 parameters: roles and update, a quick one
    total = surrogate_hessian(found.actions, _theta(found.dim), _states(1, 3, 16))
    roles = slice(0, 51)  # role_0 … role_2
    update = slice(51, found.dim)
    assert float(total[roles, update].abs().max()) > 0.0
    assert float(total[roles, roles].abs().max()) > 0.0


def _swimmer_spec(settings: dict):
    spec = load_spec(EXAMPLES / "mamujoco-swimmer.yaml")
    data = spec.model_dump(mode="json", exclude_none=True)
    data["policy"] = {"name": "hagpucb", "settings": settings}
    return type(spec).model_validate(data)


def test_hagpucb_with_a_controller_plays_no_structure_episode_and_finds_the_agents():
    settings = {"controller": "mamujoco-swimmer", "t0": 2, "c1": 2, "candidates": 16}
    spec = _swimmer_spec(settings)
    policy = make_policy("hagpucb", spec, settings)
    assert policy.phase_one_rounds == 0
    model, rng = NetworkModel(spec), torch.Generator().manual_seed(0)
    proposal = policy.propose(model, Constraints.from_spec(spec), rng)
    assert proposal.diagnostics["phase"] == 2  # the first round is already GP-UCB's
    assert proposal.diagnostics["structure_from"] == "surrogate:mamujoco-swimmer"
    assert proposal.diagnostics["hessian_queries"] == 4
    agents = tuple(tuple(range(a, b)) for a, b in spec.parameters.blocks.values())
    assert policy.structure.groups == agents
    assert policy.structure.groups == maximal_cliques(14, policy.structure.edges)
    model.learn(proposal.intervention, {"R": 1.0})
    again = policy.propose(model, Constraints.from_spec(spec), rng)
    assert "structure_from" not in again.diagnostics  # phase 1 ran once


def test_hagpucb_averages_over_the_recorded_states_of_a_states_file(tmp_path):
    recorded = _states(5, 2, 6, seed=3).numpy()
    np.save(tmp_path / "states.npy", recorded)
    settings = {"controller": "mamujoco-swimmer", "states_file": str(tmp_path / "states.npy")}
    spec = _swimmer_spec(settings)
    policy = make_policy("hagpucb", spec, settings)
    torch.testing.assert_close(policy._states, torch.as_tensor(recorded))
    policy.propose(NetworkModel(spec), Constraints(), torch.Generator().manual_seed(0))
    assert len(policy.structure.edges) == 42  # 2 agents × C(7, 2)


def test_the_edge_cap_holds_on_a_dense_surrogate():
    settings = {"controller": "mamujoco-swimmer", "max_edges": 10}
    spec = _swimmer_spec(settings)
    policy = make_policy("hagpucb", spec, settings)
    policy.propose(NetworkModel(spec), Constraints(), torch.Generator().manual_seed(0))
    assert len(policy.structure.edges) == 10 and policy.structure.dropped == 32


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"controller": "mpe-tagg"}, "unknown controller 'mpe-tagg'"),
        ({"controller": "mpe-tag-hom"}, "mpe-tag-hom has 414 parameters, the spec's θ 14"),
        (
            {"controller": "mamujoco-swimmer", "states_file": "/nonexistent/s.npy"},
            "policy.settings.states_file: cannot read /nonexistent/s.npy",
        ),
    ],
)
def test_a_wrong_controller_or_states_file_is_one_plain_error(settings, message):
    with pytest.raises(ValueError, match="hagpucb: ") as error:
        make_policy("hagpucb", _swimmer_spec(settings), settings)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_states_file_of_the_wrong_shape_is_refused(tmp_path):
    np.save(tmp_path / "s.npy", np.zeros((4, 3, 6)))
    settings = {"controller": "mamujoco-swimmer", "states_file": str(tmp_path / "s.npy")}
    with pytest.raises(ValueError, match=r"shape \[4, 3, 6\], not \[S, 2, 6\]"):
        make_policy("hagpucb", _swimmer_spec(settings), settings)
