"""EICBO (policies/eicbo.py): the do-calculus prior and the per-target-set GP against exact
references, and its refusal of soft interventions."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.models import SingleTaskGP
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.means import ZeroMean

from core.network import NetworkModel
from core.spec import load_spec
from policies._optimize import Deadline
from policies._supports import admissible_regions
from policies.base import Constraints
from policies.registry import make_policy
from sim.toygraph import ToyGraph


def toy_model(observational: int, do_x1: list[float], seed: int = 0) -> NetworkModel:
    env, spec = ToyGraph(), load_spec("examples/toygraph.yaml")
    model = NetworkModel(spec)
    noise = torch.Generator().manual_seed(seed)
    for intervention in [{}] * observational + [{"do_X1": v} for v in do_x1]:
        model.learn(intervention, env.step(intervention, noise))
    return model


def region_of(model: NetworkModel, actions: tuple[str, ...]):
    regions = admissible_regions(model, Constraints(), max_enumerate=64, generator=None)
    [region] = [r for r in regions if r.actions == actions]
    return region


def test_soft_interventions_are_refused_in_one_line():
    with pytest.raises(ValueError, match="eicbo: needs hard interventions"):
        make_policy("eicbo", load_spec("examples/dropwave.yaml"))


def test_causal_prior_of_the_reward_parent_is_the_observational_gp():
    """do(X1 = x): Y's only parent is set, so m(x), σ̂(x) are the observational Y-GP's mean and
    latent std at x, exactly (no sampling involved)."""
    model = toy_model(observational=12, do_x1=[-4.0, 7.0])
    policy = make_policy("eicbo", model.spec)
    problem = policy.problem(model, 0, Deadline(60.0))
    observational = policy.observational(model).network
    assert observational.gp.num_observations.tolist() == [12, 12, 12]  # obs rounds only
    x = torch.linspace(-5, 20, 7, dtype=torch.float64).unsqueeze(-1)
    region = region_of(model, ("do_X1",))
    mean, std = problem.causal_prior(region.embed(x), ("do_X1",))
    ref_mean, ref_std = observational.node_posterior("Y", x)
    torch.testing.assert_close(mean, ref_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(std, ref_std, rtol=1e-12, atol=1e-12)


def test_causal_prior_of_a_grandparent_averages_over_the_chain():
    """do(X0 = u): X1 ~ μ_X1(u) + √(σ_X1² + ρ²)·ε over the fixed draws; m is the mean of
    μ_Y(X1), σ̂² the mean of σ_Y²(X1) — recomputed here node by node."""
    model = toy_model(observational=12, do_x1=[])
    policy = make_policy("eicbo", model.spec, {"mc_samples": 16})
    problem = policy.problem(model, 3, Deadline(60.0))
    network = policy.observational(model).network
    u = torch.tensor([[-2.0], [0.5], [3.0]], dtype=torch.float64)
    region = region_of(model, ("do_X0",))
    mean, std = problem.causal_prior(region.embed(u), ("do_X0",))
    mu1, sd1 = network.node_posterior("X1", u)  # (3,)
    spread = (sd1.square() + network.known_noise_std("X1") ** 2).sqrt()
    eps = problem.eps[:, problem.column["X1"]].unsqueeze(-1)  # (16, 1)
    x1 = mu1 + spread * eps  # (16, 3)
    mu_y, sd_y = network.node_posterior("Y", x1.unsqueeze(-1))
    torch.testing.assert_close(mean, mu_y.mean(0), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(std, sd_y.square().mean(0).sqrt(), rtol=1e-10, atol=1e-12)


def test_set_gp_without_observational_data_is_botorch_exact_gp():
    """No observational round: the prior is 0 and the set's GP is a plain exact GP with the
    reward's known noise; its posterior matches BoTorch's SingleTaskGP with the same
    hyperparameters."""
    do_x1 = [-4.0, -1.5, 2.0, 6.0, 11.0, 17.0]
    model = toy_model(observational=0, do_x1=do_x1)
    policy = make_policy("eicbo", model.spec)
    problem = policy.problem(model, 0, Deadline(60.0))
    region = region_of(model, ("do_X1",))
    gp = problem.set_gp(region)
    assert gp is not None and torch.all(gp.prior_std == 0)
    x = torch.linspace(-5, 20, 9, dtype=torch.float64).unsqueeze(-1)
    mean, std = problem.posterior(region, x)

    z = (torch.tensor(do_x1, dtype=torch.float64).unsqueeze(-1) + 5.0) / 25.0
    y = torch.tensor([r.readings["Y"] for r in model.history], dtype=torch.float64)
    covar = ScaleKernel(MaternKernel(nu=2.5)).to(torch.float64)
    covar.base_kernel.lengthscale = gp.lengthscale.reshape(1, 1)
    covar.outputscale = gp.outputscale
    scale = float((gp.outputscale).item())
    noise = model.known_noise_std("Y") ** 2 + 1e-8 * scale  # the policy's jitter, as it adds it
    reference = SingleTaskGP(
        z,
        y.unsqueeze(-1),
        train_Yvar=torch.full((len(y), 1), noise, dtype=torch.float64),
        covar_module=covar,
        mean_module=ZeroMean(),
        outcome_transform=None,
        input_transform=None,
    ).eval()
    with torch.no_grad():
        post = reference.posterior((x + 5.0) / 25.0)
    torch.testing.assert_close(mean, post.mean.squeeze(-1), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(std, post.variance.squeeze(-1).sqrt(), rtol=1e-8, atol=1e-8)


def test_proposals_intervene_within_bounds_and_never_observe():
    env = ToyGraph()
    model = toy_model(observational=10, do_x1=[3.0, 12.0])
    model.learn({"do_X0": 1.0}, env.step({"do_X0": 1.0}, torch.Generator().manual_seed(5)))
    policy = make_policy("eicbo", model.spec, {"max_seconds": 5.0, "raw_samples": 64})
    rng, noise = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    for _ in range(3):
        proposal = policy.propose(model, Constraints.from_spec(model.spec), rng)
        assert proposal.target_set in {("do_X0",), ("do_X1",)}
        for name, value in proposal.intervention.items():
            low, high = model.spec.action(name).bounds
            assert low <= value <= high
        assert math.isfinite(proposal.acquisition_value)
        assert proposal.diagnostics["observational_rounds"] == 10
        model.learn(proposal.intervention, env.step(proposal.intervention, noise))
