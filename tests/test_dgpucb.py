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
from tests.gp_reference import exact_posterior

F64 = torch.float64


def _posterior_variance(k_xx, k_qx, k_qq, noise):
    """Exact GP variance at queries: k_qq − k_qx (K + N)⁻¹ k_xq (diagonal)."""
    solve = torch.linalg.solve(k_xx + torch.diag(noise), k_qx.T)
    return k_qq.diagonal() - (k_qx * solve.T).sum(-1)


def _theorem6_spec(components, dim, weights, noise, kernel):
    actions = [f"x{i}" for i in range(dim)]
    names = [f"f{j}" for j in range(components)]
    return parse_spec(
        {
            "name": "theorem6",
            "intervention": "soft",
            "nodes": [
                *(
                    {"name": n, "bounds": [-3, 3], "noise_std": s}
                    for n, s in zip(names, noise, strict=True)
                ),
                {"name": "y", "parents": names, "bounds": [-20, 20]},
            ],
            "actions": [{"name": a, "targets": names, "bounds": [0, 1]} for a in actions],
            "reward": {
                "node": "y",
                "components": names,
                "aggregation": "linear",
                "weights": weights,
            },
            "model": {"kernel": kernel, "refit_every": None, "misfit_z": None},
            "policy": {"name": "dgpucb", "settings": {"beta_mode": "constant", "beta": 1.0}},
        }
    )


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    components=st.integers(2, 4),
    points=st.integers(2, 25),
    dim=st.integers(1, 2),
    x_dependent=st.booleans(),
    kernel=st.sampled_from(["rbf", "matern52"]),
)
def test_decomposed_variance_never_exceeds_the_composed_gp(
    seed, components, points, dim, x_dependent, kernel
):
    """Paper 003, Theorem 6, on the policy's own computation.

    The component GPs of a `NetworkModel` (random hyperparameters, conditioned on random data by
    the model's incremental appends) give D-GP-UCB's aggregated variance Σ_j g_j(a)² σ_j²(a) as
    `_DecomposedUCB.aggregate` computes it. It must equal the exact variance (gpytorch, from the
    raw data and the model's hyperparameters), and never exceed the variance of one GP on the
    composed kernel Σ_j g_j k_j g_j with the aggregated noise Σ_j g_j² σ²_noise,j.
    """
    gen = torch.Generator().manual_seed(seed)
    coefficients = (0.5 + torch.rand(components, 2, generator=gen, dtype=F64)).tolist()
    noise = (10 ** (-2 * torch.rand(components, generator=gen, dtype=F64))).tolist()
    weights = [
        f"{c0!r} + {c1!r} * x0" if x_dependent else c0 for c0, c1 in coefficients
    ]  # g_j(x): constant, or a nonzero function of x
    spec = _theorem6_spec(components, dim, weights, noise, kernel)
    model = NetworkModel(spec)
    model.gp.set_hyperparameters(
        lengthscale=0.1 + torch.rand(components, model.gp.dim, generator=gen, dtype=F64),
        outputscale=0.2 + torch.rand(components, generator=gen, dtype=F64),
    )
    x = torch.rand(points, dim, generator=gen, dtype=F64)
    y = torch.randn(points, components, generator=gen, dtype=F64)
    for row, readings in zip(x.tolist(), y.tolist(), strict=True):
        model.learn(
            {f"x{i}": v for i, v in enumerate(row)},
            {f"f{j}": v for j, v in enumerate(readings)},
        )
    xq = torch.cat([torch.rand(7, dim, generator=gen, dtype=F64), x[:3]])  # and at data
    problem = DGPUCBPolicy(spec, spec.policy.settings).problem(model, 0, None)
    _, ours = problem.aggregate(xq)

    gp = model.gp

    def g(z):  # (m, dim) -> (m, J), evaluated independently of the policy
        c = torch.tensor(coefficients, dtype=F64)
        return c[:, 0] + c[:, 1] * z[:, :1] if x_dependent else c[:, 0].expand(len(z), -1)

    def k(j, a, b):  # component j's kernel in raw units (inputs on [0, 1] already)
        scale = gp.outputscale[j : j + 1] * gp.y_scale[j] ** 2
        return kernel_matrix(a[None], b[None], gp.lengthscale[j : j + 1, :dim], scale, kernel)[0]

    raw_noise = [
        float((gp.noise[j] + gp.jitter[j]) * gp.y_scale[j] ** 2) for j in range(components)
    ]
    gx, gq = g(x), g(xq)
    exact = sum(
        gq[:, j] ** 2
        * float(gp.y_scale[j]) ** 2
        * exact_posterior(
            x,
            (y[:, j] - gp.y_mean[j]) / gp.y_scale[j],
            xq,
            lengthscale=gp.lengthscale[j, :dim],
            outputscale=float(gp.outputscale[j]),
            noise=float(gp.noise[j] + gp.jitter[j]),
            kernel=kernel,
        )[1]
        for j in range(components)
    )
    prior = float(sum(gq[:, j].pow(2).max() * k(j, xq[:1], xq[:1]) for j in range(components)))
    torch.testing.assert_close(ours, exact, rtol=1e-10, atol=1e-12 * prior)  # float64 throughout

    composed_xx = sum(gx[:, j, None] * k(j, x, x) * gx[None, :, j] for j in range(components))
    composed_qx = sum(gq[:, j, None] * k(j, xq, x) * gx[None, :, j] for j in range(components))
    composed_qq = sum(gq[:, j, None] * k(j, xq, xq) * gq[None, :, j] for j in range(components))
    aggregate_noise = sum(gx[:, j] ** 2 * raw_noise[j] for j in range(components))
    entire = _posterior_variance(composed_xx, composed_qx, composed_qq, aggregate_noise)
    assert (ours <= entire + 1e-9 * prior).all()


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


def test_dgpucb_refuses_hard_interventions():
    spec = decomposed_spec([1, 1])
    hard = spec.model_copy(update={"intervention": "hard", "target_sets": [[], ["x"]]})
    with pytest.raises(ValueError, match="hard interventions"):
        make_policy("dgpucb", hard)


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
