"""D-GP-UCB and the decomposed posterior (paper 003)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.kernels import kernel_matrix
from core.network import NetworkModel
from core.spec import parse_spec
from policies._beta import paper_beta
from policies.base import Constraints
from policies.dgpucb import DGPUCBPolicy
from policies.registry import make_policy

F64 = torch.float64


def _posterior_variance(k_xx, k_qx, k_qq, noise):
    """Exact GP variance at queries: k_qq − k_qx (K + N)⁻¹ k_xq (diagonal)."""
    solve = torch.linalg.solve(k_xx + torch.diag(noise), k_qx.T)
    return k_qq.diagonal() - (k_qx * solve.T).sum(-1)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    components=st.integers(2, 5),
    points=st.integers(2, 25),
    x_dependent=st.booleans(),
)
def test_decomposed_variance_never_exceeds_the_composed_gp(seed, components, points, x_dependent):
    """Paper 003, Theorem 6: Σ_j g_j² σ²_{j} ≤ σ² of one GP on Σ_j g_j k_j g_j."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(points, 2, generator=gen, dtype=F64)
    xq = torch.rand(7, 2, generator=gen, dtype=F64)
    lengthscales = 0.1 + torch.rand(components, 2, generator=gen, dtype=F64)
    scales = 0.2 + torch.rand(components, generator=gen, dtype=F64)
    noise = 10 ** (-3 * torch.rand(components, generator=gen, dtype=F64))
    coefficients = 0.5 + torch.rand(components, 2, generator=gen, dtype=F64)

    def weights(z):  # g_j(x): constant, or a nonzero function of x
        if not x_dependent:
            return coefficients[:, 0].expand(z.shape[0], components)
        return coefficients[:, 0] + coefficients[:, 1] * z[:, :1]

    def k(j, a, b):
        return kernel_matrix(a[None], b[None], lengthscales[j : j + 1], scales[j : j + 1], "rbf")[0]

    gx, gq = weights(x), weights(xq)
    decomposed = sum(
        gq[:, j] ** 2
        * _posterior_variance(k(j, x, x), k(j, xq, x), k(j, xq, xq), noise[j].expand(points))
        for j in range(components)
    )
    composed_xx = sum(gx[:, j, None] * k(j, x, x) * gx[None, :, j] for j in range(components))
    composed_qx = sum(gq[:, j, None] * k(j, xq, x) * gx[None, :, j] for j in range(components))
    composed_qq = sum(gq[:, j, None] * k(j, xq, xq) * gq[None, :, j] for j in range(components))
    aggregate_noise = sum(gx[:, j] ** 2 * noise[j] for j in range(components))
    entire = _posterior_variance(composed_xx, composed_qx, composed_qq, aggregate_noise)
    assert (decomposed <= entire + 1e-9 * entire.abs().max()).all()


def decomposed_spec(weights, policy="dgpucb", settings_=None):
    return parse_spec(
        {
            "name": "decomposed",
            "intervention": "soft",
            "nodes": [
                {"name": "f1", "bounds": [-2, 2], "noise_std": 0.05},
                {"name": "f2", "bounds": [-2, 2], "noise_std": 0.05},
                {"name": "y", "parents": ["f1", "f2"], "bounds": [-4, 4]},
            ],
            "actions": [{"name": "x", "targets": ["f1", "f2"], "bounds": [0, 1]}],
            "reward": {
                "node": "y",
                "components": ["f1", "f2"],
                "aggregation": "linear",
                "weights": weights,
            },
            "model": {"refit_every": None, "misfit_z": None},
            "policy": {"name": policy, "settings": settings_ or {}},
        }
    )


def trained_model(spec) -> NetworkModel:
    model = NetworkModel(spec)
    for x in (0.1, 0.4, 0.7, 0.9):
        model.learn({"x": x}, {"f1": math.sin(5 * x), "f2": x * x})
    return model


def test_ucb_is_the_weighted_component_ucb():
    spec = decomposed_spec([2.0, "1 + x"], settings_={"beta_mode": "constant", "beta": 4.0})
    model = trained_model(spec)
    policy = DGPUCBPolicy(spec, spec.policy.settings)
    problem = policy.problem(model, 0, None)
    actions = torch.tensor([[0.25], [0.55]], dtype=F64)
    m1, s1 = model.node_posterior("f1", actions)
    m2, s2 = model.node_posterior("f2", actions)
    w2 = 1 + actions[:, 0]
    expected = 2 * m1 + w2 * m2 + 2.0 * torch.sqrt(4 * s1**2 + w2**2 * s2**2)
    torch.testing.assert_close(problem.evaluate_candidates(actions), expected)
    # the decomposed reward node has no GP: a rollout composes it
    values = model.rollout(actions)
    torch.testing.assert_close(values["y"], 2 * m1 + w2 * m2)


def test_paper_beta_schedules():
    # Thm 7 on a finite domain of 1000 points, delta 0.05, round 1 (paper 003 §2.7: 20.80)
    assert paper_beta(
        1, domain_size=1000, dim=1, components=10, linear=True, delta=0.05
    ) == pytest.approx(20.80, abs=0.01)
    assert paper_beta(
        100, domain_size=1000, dim=1, components=10, linear=True, delta=0.05
    ) == pytest.approx(39.22, abs=0.01)
    # a general g pays a union bound over the J components
    general = paper_beta(5, domain_size=1000, dim=1, components=10, linear=False, delta=0.05)
    linear = paper_beta(5, domain_size=1000, dim=1, components=10, linear=True, delta=0.05)
    assert general == pytest.approx(linear + 2 * math.log(10))


def test_dgpucb_needs_a_decomposed_reward():
    spec = decomposed_spec([1, 1]).model_copy(
        update={
            "reward": parse_spec(
                {
                    "name": "plain",
                    "intervention": "soft",
                    "nodes": [{"name": "y", "bounds": [0, 1]}],
                    "actions": [{"name": "x", "targets": ["y"], "bounds": [0, 1]}],
                    "reward": {"node": "y"},
                }
            ).reward
        }
    )
    with pytest.raises(ValueError, match="not decomposed"):
        make_policy("dgpucb", spec)


def test_proposals_respect_a_per_unit_budget():
    from pathlib import Path

    from core.spec import load_spec
    from sim.registry import make_environment

    spec = load_spec(Path(__file__).resolve().parents[1] / "examples" / "sir.yaml")
    env = make_environment("sir")
    model = NetworkModel(spec)
    gen = torch.Generator().manual_seed(0)
    for a in env.initial_design(0)[:6]:
        model.learn(a, env.step(a, gen))
    proposal = make_policy("dgpucb", spec, spec.policy.settings).propose(
        model, Constraints.from_spec(spec), gen
    )
    assert proposal.cost <= spec.constraints.budget_per_round + 1e-9
    assert env.cost(proposal.intervention) == pytest.approx(proposal.cost)
