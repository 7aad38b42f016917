"""The composite policies' quadratic form of g on the Matheron paths' basis (issue 17) against
the slow way: the fields formed at every point and g applied to them."""

from __future__ import annotations

import pytest
import torch

from core.field_metrics import FIELD_METRICS, FIELD_RESIDUALS
from core.gp.kronecker import KroneckerGP
from core.gp.matheron import MatheronSamples
from core.network import NetworkModel
from core.spec import ExperimentSpec, load_spec
from policies._optimize import Deadline
from policies.registry import make_policy
from sim.registry import make_environment

SETTINGS = {"mc_samples": 16, "fit_steps": 3, "raw_samples": 16, "restarts": 1, "maxiter": 5}


def rbf(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * torch.cdist(a, b) ** 2 / 0.4**2)


def test_a_path_is_its_coefficients_times_its_basis() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(7, 2, generator=g, dtype=torch.float64)
    y = torch.randn(7, 2, 3, 4, generator=g, dtype=torch.float64)
    factors = []
    for d in (2, 3, 4):
        root = torch.randn(d, 2, generator=g, dtype=torch.float64)
        factors.append(root @ root.T + 0.3 * torch.eye(d, dtype=torch.float64))
    draws = MatheronSamples(KroneckerGP(rbf, factors, 0.05, x, y), 6, g)
    x_test = torch.rand(5, 2, generator=g, dtype=torch.float64)
    direct = draws.marginal(x_test)  # (S, b, 2, 3, 4)
    combined = torch.einsum("bk,sk...->sb...", draws.coefficients(x_test), draws.basis())
    torch.testing.assert_close(combined, direct, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(draws.basis(2, 5), draws.basis()[2:5], rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(FIELD_RESIDUALS))
def test_each_residual_squared_is_its_metric_and_affine(name: str) -> None:
    shape = (3, 4) if name == "environmental_sse" else (2, 6, 5)
    g = torch.Generator().manual_seed(1)
    a, b = (torch.rand(9, *shape, generator=g, dtype=torch.float64) * 5 for _ in range(2))
    residual = FIELD_RESIDUALS[name]
    metric = FIELD_METRICS[name]
    torch.testing.assert_close(-(residual(a) ** 2).sum(-1), metric({"f": a}), rtol=1e-12, atol=0)
    zero = residual(torch.zeros(shape, dtype=torch.float64))
    torch.testing.assert_close(  # r(2a − b) = 2 r(a) − r(b) + (1 − 2 + 1)·…: affine
        residual(2 * a - b) - zero, 2 * (residual(a) - zero) - (residual(b) - zero)
    )


def _small_brusselator_spec() -> ExperimentSpec:
    """The shipped Brusselator spec on a 2 x 6 x 6 field (the weighted variance's borders
    and interior both present)."""
    raw = load_spec("examples/brusselator.yaml").model_dump(mode="json", exclude_unset=True)
    for node in raw["nodes"]:
        if node["name"] == "field":
            node["shape"] = [2, 6, 6]
    return ExperimentSpec.model_validate(raw)


def _brusselator_model(rounds: int) -> NetworkModel:
    model = NetworkModel(_small_brusselator_spec())
    g = torch.Generator().manual_seed(4)
    grid = torch.linspace(0, 1, 6, dtype=torch.float64)
    for _ in range(rounds):
        a, b, d0, d1 = (float(v) for v in 0.1 + 4.9 * torch.rand(4, generator=g))
        u = a + 0.3 * torch.sin(3 * d0 * grid[:, None] + b * grid[None, :])
        v = b / a + 0.2 * torch.cos(2 * d1 * grid[None, :] - a * grid[:, None])
        model.learn({"a": a, "b": b, "d0": d0, "d1": d1}, {"field": torch.stack([u, v]).numpy()})
    return model


def _environmental_model(rounds: int) -> NetworkModel:
    spec = load_spec("examples/environmental.yaml")
    env = make_environment("environmental")
    model = NetworkModel(spec)
    for action in env.initial_design(seed=1)[:5] + env.initial_design(seed=2)[: rounds - 5]:
        readings = env.step(action)
        del readings["score"]
        model.learn(action, readings)
    return model


@pytest.mark.parametrize(("which", "policy"), [("brusselator", "eicf"), ("environmental", "eicf")])
def test_the_quadratic_form_gives_the_rollouts_reward_samples_and_gradients(
    which: str, policy: str
) -> None:
    model = _brusselator_model(7) if which == "brusselator" else _environmental_model(7)
    chosen = make_policy(policy, model.spec, SETTINGS)
    problem = chosen.problem(model, 11, Deadline(60.0))
    assert problem.gram is not None and problem.diagnostics()["quadratic_g"]
    bounds = torch.tensor([a.bounds for a in model.spec.actions], dtype=torch.float64)
    u = torch.rand(9, len(bounds), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    x = (bounds[:, 0] + (bounds[:, 1] - bounds[:, 0]) * u).requires_grad_(True)
    fast = problem.reward_samples(x)
    (fast_grad,) = torch.autograd.grad(problem.acquisition(fast).sum(), x)
    slow = problem.reward_samples_by_rollout(x)
    (slow_grad,) = torch.autograd.grad(problem.acquisition(slow).sum(), x)
    assert fast.shape == slow.shape == (SETTINGS["mc_samples"], 9)
    scale = float(slow.detach().abs().max())
    torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-10 * scale)
    torch.testing.assert_close(fast_grad, slow_grad, rtol=1e-6, atol=1e-8 * scale)


def test_the_gram_is_built_in_chunks_the_same_as_at_once() -> None:
    from policies._composite import residual_gram

    model = _brusselator_model(6)
    problem = make_policy("eicf", model.spec, SETTINGS).problem(model, 3, Deadline(60.0))
    node, gram = problem.gram
    paths = problem.fields.paths[node]
    residual = FIELD_RESIDUALS["weighted_variance"]
    torch.testing.assert_close(residual_gram(paths, residual, chunk_elements=1), gram)
