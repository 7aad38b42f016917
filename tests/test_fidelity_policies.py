"""Paper 001's model and acquisition: the product kernel, the exact discrete knowledge
gradient, and the multi-fidelity policies on a small synthetic problem."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.vetting import Violation, vet
from core.gp.fidelity import FidelityGP, FidelityHyperparameters, product_kernel
from core.network import NetworkModel
from core.spec import SpecError, parse_spec
from policies._kg import discrete_kg
from policies.base import Constraints, NothingAffordable
from policies.registry import make_policy


def fidelity_spec(**changes: Any) -> dict[str, Any]:
    spec = {
        "name": "trials",
        "intervention": "soft",
        "nodes": [{"name": "y", "bounds": [-2.0, 2.0]}],
        "actions": [
            {"name": "x", "targets": ["y"], "bounds": [0.0, 1.0], "cost": 0.0},
            {"name": "tau", "targets": ["y"], "bounds": [1.0, 10.0], "cost": 0.0},
            {"name": "reps", "targets": ["y"], "bounds": [1.0, 4.0], "cost": 0.0},
        ],
        "reward": {"node": "y"},
        "fidelity": {
            "action": "tau",
            "levels": [2.0, 5.0, 10.0],
            "replications_action": "reps",
            "replications": [1, 4],
        },
        "initial_design": {"rounds": 0},
    }
    spec.update(changes)
    return spec


# ---- the kernel -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(st.floats(-3.0, 3.0), min_size=3, max_size=3),
    scales=st.lists(st.floats(0.05, 3.0), min_size=2, max_size=2),
    seed=st.integers(0, 2**16),
)
def test_the_product_kernels_gram_matrix_is_psd_for_any_sigma(
    entries: list[float], scales: list[float], seed: int
) -> None:
    """Σ = L Lᵀ for any lower-triangular L: the Gram matrix has no negative eigenvalue."""
    generator = torch.Generator().manual_seed(seed)
    theta = torch.rand(25, 2, generator=generator, dtype=torch.float64)
    s = torch.rand(25, generator=generator, dtype=torch.float64)
    chol = torch.tensor([[entries[0], 0.0], [entries[1], entries[2]]], dtype=torch.float64)
    hyper = FidelityHyperparameters(1.3, torch.tensor(scales, dtype=torch.float64), chol, 0, 0)
    gram = product_kernel(theta, s, theta, s, hyper)
    assert torch.allclose(gram, gram.T)
    scale = max(float(gram.abs().max()), 1e-12)
    assert float(torch.linalg.eigvalsh(gram).min()) >= -1e-9 * scale


# ---- the knowledge gradient -------------------------------------------------------------------


@pytest.mark.parametrize("ties", [False, True])
def test_discrete_kg_matches_a_monte_carlo_estimate(ties: bool) -> None:
    """ν = E[max_i (a_i + b_i Z)] − max_i a_i, against 400,000 draws of Z (4 SE)."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=20), rng.normal(size=(20, 5))
    if ties:
        b[:6] = b[6:12]  # equal slopes: only the highest line counts
        b[:, 4] = 0.0  # a measurement that moves nothing is worth nothing
    exact = discrete_kg(a, b)
    z = rng.normal(size=400_000)
    for j in range(5):
        values = (a[:, None] + b[:, j : j + 1] * z).max(axis=0) - a.max()
        se = values.std() / math.sqrt(z.size)
        assert abs(exact[j] - values.mean()) <= 4 * se + 1e-12
    assert (exact >= 0).all()
    if ties:
        assert exact[4] == 0.0


def test_discrete_kg_of_two_lines_has_the_closed_form() -> None:
    """Two alternatives: ν = |b1 − b2| f(−|a1 − a2| / |b1 − b2|), f(z) = z Φ(z) + φ(z)."""
    a, b = np.array([0.3, -0.2]), np.array([[0.1], [0.9]])
    delta, spread = 0.5, 0.8
    z = -delta / spread
    phi = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    expected = spread * (z * 0.5 * (1 + math.erf(z / math.sqrt(2))) + phi)
    assert discrete_kg(a, b)[0] == pytest.approx(expected, rel=1e-12)


# ---- the model ---------------------------------------------------------------------------------


def _truth(x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """A learning curve: the score at τ approaches its limit at τ_max."""
    return torch.sin(6 * x[:, 0]) * (0.4 + 0.6 * tau / 10.0)


def test_cheap_trials_inform_the_prediction_at_tau_max() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(30, 1, generator=generator, dtype=torch.float64)
    tau = torch.full((30,), 2.0, dtype=torch.float64)
    x_top = torch.rand(4, 1, generator=generator, dtype=torch.float64)
    tau_top = torch.full((4,), 10.0, dtype=torch.float64)
    gp = FidelityGP(torch.tensor([[0.0, 1.0]]), tau_max=10.0, tau_min=2.0)
    gp.learn(
        x, tau, torch.full((30,), 4.0), _truth(x, tau) + 0.01 * torch.randn(30, generator=generator)
    )
    gp.learn(x_top, tau_top, torch.full((4,), 4.0), _truth(x_top, tau_top))
    gp.fit(seed=0)
    grid = torch.linspace(0, 1, 50, dtype=torch.float64).unsqueeze(-1)
    top = torch.full((50,), 10.0, dtype=torch.float64)
    error = (gp.mean(grid, top) - _truth(grid, top)).abs().max()
    assert error < 0.25
    # a reported variance is a row's own noise: a noisy row moves the mean less
    assert gp.noise_for(1) > gp.noise_for(4)


# ---- spec, cost, vetting -----------------------------------------------------------------------


def test_a_fidelity_spec_names_its_levers_and_prices_q_tau() -> None:
    spec = parse_spec(fidelity_spec())
    assert spec.parameter_names == ["x"]
    assert spec.fidelity.tau_max == 10.0 and spec.fidelity.cost(5.0, 4) == 20.0
    with pytest.raises(SpecError, match=r"fidelity\.action"):
        parse_spec(fidelity_spec(fidelity={**fidelity_spec()["fidelity"], "action": "nope"}))
    with pytest.raises(SpecError, match="exclude"):
        parse_spec(fidelity_spec(fidelity={**fidelity_spec()["fidelity"], "levels": [20.0]}))
    with pytest.raises(Violation, match="not one of"):
        vet(spec, {"x": 0.5, "tau": 3.0, "reps": 4.0}, Constraints())


# ---- the policies ------------------------------------------------------------------------------


def _play(name: str, budget: float, rounds: int, seed: int = 0) -> tuple[NetworkModel, list]:
    spec = parse_spec(fidelity_spec(constraints={"budget_total": budget}))
    policy = make_policy(
        name, spec, {} if name in {"random", "hyperband"} else {"grid_size": 60, "restarts": 1}
    )
    model, spent, proposals = NetworkModel(spec), 0.0, []
    noise = torch.Generator().manual_seed(seed)
    rng = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        try:
            proposal = policy.propose(model, Constraints.from_spec(spec, spent), rng)
        except NothingAffordable:
            break
        vet(spec, proposal.intervention, Constraints.from_spec(spec, spent))  # never over
        act = proposal.intervention
        x = torch.tensor([[act["x"]]], dtype=torch.float64)
        q = int(act["reps"])
        y = _truth(x, torch.tensor([act["tau"]])) + torch.randn(1, generator=noise) * 0.3 / q**0.5
        index = model.start_round(act)
        model.note_replications(index, "y", 0.09 / q, q)
        model.observe(index, {"y": float(y)})
        spent += proposal.cost
        proposals.append(proposal)
    return model, proposals


@pytest.mark.slow
def test_besd_mixes_fidelities_finds_the_optimum_and_stops_at_the_budget() -> None:
    model, proposals = _play("besd", budget=400.0, rounds=60)
    assert sum(p.cost for p in proposals) <= 400.0
    chosen = [p for p in proposals if not p.diagnostics.get("design")]
    assert chosen, "the design used the whole budget"
    assert {p.intervention["tau"] for p in proposals} >= {2.0, 10.0}
    spec = model.spec
    policy = make_policy("besd", spec, {"grid_size": 60})
    theta, _ = policy.recommend(model)
    # sin(6x) peaks at x = π/12 ≈ 0.262
    assert abs(theta["x"] - math.pi / 12) < 0.1


def test_the_recommendation_is_argmax_of_the_mean_at_tau_max_and_costs_no_fit() -> None:
    """`recommendation` (what the service publishes, retained) is θ only, predicted at τ_max;
    without `refit` it uses the last fit's hyperparameters and fits nothing, with it a due fit
    runs first and the answer is `recommend`'s. None before any trial, and from policies that
    keep no model."""
    spec = parse_spec(fidelity_spec())
    policy = make_policy("ei", spec, {"grid_size": 60, "restarts": 1, "refit_every": 100})
    assert policy.recommendation(NetworkModel(spec)) is None
    assert make_policy("random", spec, {}).recommendation(NetworkModel(spec)) is None
    model, _ = _play("ei", budget=400.0, rounds=6)
    policy.propose(model, Constraints.from_spec(spec), torch.Generator().manual_seed(0))
    fitted = policy.fitted._hyper
    assert fitted is not None  # the proposal fitted once (refit_every 100: not again)
    for x in (0.1, 0.5):  # two more trials: a fit is not due for 100
        index = model.start_round({"x": x, "tau": 10.0, "reps": 4.0})
        model.note_replications(index, "y", 0.02, 4)
        model.observe(index, {"y": float(_truth(torch.tensor([[x]]), torch.tensor([10.0])))})
    cheap = policy.recommendation(model)
    assert cheap is not None and policy.fitted._hyper is fitted  # no fit ran
    assert set(cheap.values) == {"x"} and cheap.fidelity == 10.0 and cheap.trials == 8
    theta, mean = policy.recommend(model)
    assert cheap.values == theta and cheap.predicted == pytest.approx(mean, rel=1e-12)


@pytest.mark.parametrize("name", ["ei", "lcb", "random"])
def test_the_baselines_run_every_trial_at_tau_max_and_q_max(name: str) -> None:
    _, proposals = _play(name, budget=200.0, rounds=10)
    assert proposals and all(
        (p.intervention["tau"], p.intervention["reps"]) == (10.0, 4.0) for p in proposals
    )
    assert len(proposals) == 5  # 200 / (4 · 10)


def test_a_multi_fidelity_policy_refuses_a_plain_spec() -> None:
    plain = fidelity_spec()
    del plain["fidelity"]
    with pytest.raises(ValueError, match="fidelity"):
        make_policy("besd", parse_spec(plain))


# ---- Hyperband and mfkg (issue 14's other baselines) -------------------------------------------


def test_hyperband_stops_configurations_on_short_trials_and_stays_within_budget() -> None:
    """Every trial is an admissible (θ, τ ∈ 𝒯, q_max); configurations start at the cheapest
    level, some are stopped there by successive halving, and some reach τ_max."""
    _, proposals = _play("hyperband", budget=400.0, rounds=200)
    assert sum(p.cost for p in proposals) <= 400.0 + 1e-9
    assert all(p.intervention["tau"] in (2.0, 5.0, 10.0) for p in proposals)
    assert all(p.intervention["reps"] == 4.0 for p in proposals)
    by_configuration: dict[int, list[float]] = {}
    for p in proposals:
        by_configuration.setdefault(p.diagnostics["configuration"], []).append(
            p.intervention["tau"]
        )
    levels = list(by_configuration.values())
    assert all(taus == sorted(taus) and taus[0] == 2.0 for taus in levels)
    assert any(taus[-1] == 10.0 for taus in levels)  # some configuration reached R
    assert any(taus == [2.0] for taus in levels[:-1])  # and some were stopped early


def test_hyperband_maps_resources_to_the_levels_of_the_spec() -> None:
    spec = parse_spec(fidelity_spec())
    policy = make_policy("hyperband", spec)
    # r units of τ_max / 81 rounded up to a level: 1, 3, 9 → 2; 27 → 5; 81 → 10
    assert policy.resource_levels() == [(2.0, 9), (5.0, 27), (10.0, 81)]
    with pytest.raises(ValueError, match="replications"):
        make_policy("hyperband", spec, {"replications": 3})


@pytest.mark.slow
def test_mfkg_proposes_admissible_cost_aware_trials_within_budget() -> None:
    """BoTorch's multi-fidelity KG: after the shared design, trials at levels of 𝒯 with q_max,
    never over the budget; its cost model is the spec's q·τ."""
    spec = parse_spec(fidelity_spec())
    policy = make_policy("mfkg", spec, {"grid_size": 60})
    model = policy.cost_model()
    for tau in (2.0, 5.0, 10.0):
        x = torch.tensor([[0.3, tau / 10.0]], dtype=torch.float64)
        assert float(model(x.unsqueeze(0))) == pytest.approx(4.0 * tau)
    _, proposals = _play("mfkg", budget=300.0, rounds=14)
    assert sum(p.cost for p in proposals) <= 300.0 + 1e-9
    chosen = [p for p in proposals if not p.diagnostics.get("design")]
    assert chosen, "the design used the whole budget"
    for p in chosen:
        assert p.intervention["tau"] in (2.0, 5.0, 10.0)
        assert p.intervention["reps"] == 4.0
        assert 0.0 <= p.intervention["x"] <= 1.0
