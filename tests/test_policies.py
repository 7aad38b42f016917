"""MCBO, EI-FN and GP-UCB: acquisitions, regions, constraints, the flat model, the time cap."""

from __future__ import annotations

import math
import time

import pytest
import torch

from core.network import NetworkModel, mean_sampler
from policies._beta import BetaSchedule, beta_at, paper_beta
from policies._optimize import Deadline
from policies._search import ratio_scorer
from policies._supports import admissible_candidates, admissible_regions
from policies.base import Constraints, NothingAffordable, intervention_cost
from policies.registry import make_policy, policy_names
from tests.test_policies_helpers import (
    FAST,
    POLICIES,
    chain_spec,
    random_intervention,
    trained_model,
    truth,
)


def _problem(name: str, model: NetworkModel, **settings):
    policy = make_policy(name, model.spec, {**FAST[name], **settings})
    return policy, policy.problem(model, 0, Deadline(60.0))


def test_policies_are_registered():
    assert set(POLICIES) <= set(policy_names())


# ---------------------------------------------------------------------- acquisitions
def _mean_network(model: NetworkModel, actions: torch.Tensor, set_actions=()) -> torch.Tensor:
    """(b, A) -> (b,) the reward of the deterministic network of posterior means, wired by hand
    from the spec (not by `NetworkModel.rollout`): each node's GP mean at its parents' values,
    then the actions that feed it in spec order; a node set by a hard action takes its value."""
    spec = model.spec
    column = {a: i for i, a in enumerate(spec.action_names)}
    fixed = {spec.action(a).targets[0]: column[a] for a in set_actions}
    hard = spec.intervention == "hard"
    values: dict[str, torch.Tensor] = {}
    for node in spec.topological_order():
        if node in fixed:
            values[node] = actions[:, fixed[node]]
            continue
        inputs = [values[p] for p in spec.node(node).parents]
        if not hard:
            inputs += [actions[:, column[a.name]] for a in spec.actions if node in a.targets]
        x = actions.new_zeros(len(actions), model.input_dim)  # padded as the GP stores rows
        if inputs:
            x[:, : len(inputs)] = torch.stack(inputs, -1)
        values[node] = model.gp.posterior(x, members=model.member[node]).mean
    return values[spec.reward.node]


def _zero_variance(model: NetworkModel) -> None:
    """Force every node's posterior variance to exactly 0 (the mean is left as it is)."""
    posterior = model.node_posterior

    def exact(node: str, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = posterior(node, inputs)
        return mean, torch.zeros_like(std)

    model.node_posterior = exact


_WIRED = [  # several actions per node and one action feeding two nodes, out of node order
    {"name": "a0", "targets": ["X2"], "bounds": [-1.0, 1.0]},
    {"name": "a1", "targets": ["X0", "Y"], "bounds": [0.0, 2.0]},
    {"name": "a2", "targets": ["X1"], "bounds": [0.5, 1.5]},
    {"name": "a3", "targets": ["X2"], "bounds": [0.0, 1.0]},
]


@pytest.mark.parametrize(
    ("intervention", "noise", "set_actions"),
    [("soft", 0.0, ()), ("soft", 0.2, ()), ("hard", 0.0, ("a1",)), ("hard", 0.2, ("a0", "a2"))],
)
def test_rollout_at_zero_variance_is_the_deterministic_network(intervention, noise, set_actions):
    """With every posterior variance exactly 0 and no sampled observation noise, MCBO's
    hallucinated rollouts (any β, any η) and EI-FN's posterior samples all collapse to the
    deterministic network of posterior means — to rounding, not to a tolerance.

    Noiseless nodes: the policies' own noise draws must add nothing (the known noise is 0, not
    the GP's numerical noise floor). Noisy nodes: the draws are set to 0.
    """
    if intervention == "soft":
        spec = chain_spec(nodes=4, actions=_WIRED, noise=noise)
    else:
        target_sets = [[], ["a1"], ["a0", "a2"]]
        spec = chain_spec(intervention="hard", nodes=4, noise=noise, target_sets=target_sets)
    model = trained_model(spec, 8)
    generator = torch.Generator().manual_seed(0)
    bounds = model.action_bounds()
    actions = bounds[:, 0] + (bounds[:, 1] - bounds[:, 0]) * torch.rand(
        6, len(bounds), generator=generator, dtype=torch.float64
    )
    expected = _mean_network(model, actions, set_actions)
    exact = {"rtol": 0.0, "atol": 1e-10}

    # Sampled noise 0 at the real posterior: β = 0 (any η) and EI-FN at zero base samples.
    _, mcbo = _problem("mcbo", model, mc_samples=3)
    count = len(mcbo.eta_nodes(set_actions))
    eta = 2 * torch.rand(len(actions), count, generator=generator, dtype=torch.float64) - 1
    zero_eps = torch.zeros_like(mcbo.eps)
    got = mcbo.optimistic_reward(actions, eta, set_actions, 0.0, zero_eps)
    torch.testing.assert_close(got, expected, **exact)
    _, eifn = _problem("eifn", model, mc_samples=4)
    eifn.epistemic, eifn.aleatoric = torch.zeros_like(eifn.epistemic), eifn.aleatoric.clone()
    if noise:
        eifn.aleatoric.zero_()
    samples = eifn.sample_rewards(actions, set_actions)
    torch.testing.assert_close(samples, expected.expand_as(samples), **exact)

    # Variance exactly 0: β and η have nothing to scale, EI-FN's samples nothing to spread.
    _zero_variance(model)
    _, mcbo = _problem("mcbo", model, mc_samples=3)
    eps = torch.zeros_like(mcbo.eps) if noise else None  # None: the policy's own draws
    for beta in (0.5, 2.0):
        got = mcbo.optimistic_reward(actions, eta, set_actions, beta, eps)
        torch.testing.assert_close(got, expected, **exact)
    _, eifn = _problem("eifn", model, mc_samples=4)
    if noise:
        eifn.aleatoric = torch.zeros_like(eifn.aleatoric)
    samples = eifn.sample_rewards(actions, set_actions)
    assert samples.shape[0] == 4 and eifn.epistemic.abs().sum() > 0
    torch.testing.assert_close(samples, expected.expand_as(samples), **exact)
    # the network of means is not trivially constant: it moves with the actions
    assert expected.std() > 1e-3


def test_mcbo_with_beta_zero_is_the_mean_rollout():
    spec = chain_spec()
    model = trained_model(spec, 8)
    _, problem = _problem("mcbo", model, beta=0.0)
    region = admissible_regions(model, Constraints())[0]
    x = torch.rand(7, region.dim + 2, dtype=torch.float64)
    x[:, region.dim :] = 2 * x[:, region.dim :] - 1
    mean = model.rollout(region.embed(x[:, : region.dim]), mean_sampler)["Y"]
    assert torch.allclose(problem.evaluate(region, x), mean, atol=1e-12)


def test_mcbo_reward_node_is_optimistic_by_beta_sigma():
    """With η = 0 upstream, β only adds β·σ_Y at the reward (η_Y ≡ +1)."""
    spec = chain_spec()
    model = trained_model(spec, 5)
    _, problem = _problem("mcbo", model)
    actions = torch.full((1, 3), 0.3, dtype=torch.float64)
    eta = torch.zeros(1, 2, dtype=torch.float64)
    zero = problem.optimistic_reward(actions, eta, (), 0.0)
    one = problem.optimistic_reward(actions, eta, (), 1.0)
    values = model.rollout(actions, mean_sampler)
    inputs = torch.stack([values["X1"], actions[:, 2]], dim=-1)
    _, std = model.node_posterior("Y", inputs)
    assert torch.allclose(one - zero, std)


@pytest.mark.parametrize("log_ei", [True, False])
def test_eifn_acquisition_matches_brute_force_monte_carlo(log_ei):
    spec = chain_spec(noise=0.3)
    model = trained_model(spec, 6)
    _, problem = _problem("eifn", model, mc_samples=4096, log_ei=log_ei)
    actions = torch.tensor([[0.2, 0.7, 0.5], [0.9, 0.1, 0.3]], dtype=torch.float64)
    value = problem.expected_improvement(actions, ())
    qmc = value.exp() if log_ei else value  # the smoothing's τ is 1e-6 of the rewards' spread

    generator = torch.Generator().manual_seed(5)
    count = 100_000
    values = {}
    for node in model.order:
        inputs = model.node_inputs_at(node, actions.unsqueeze(0).expand(count, 2, 3), values)
        mean, std = model.node_posterior(node, inputs)
        z = torch.randn(count, 2, generator=generator, dtype=torch.float64)
        e = torch.randn(count, 2, generator=generator, dtype=torch.float64)
        values[node] = mean + std * z + model.known_noise_std(node) * e
    brute = (values["Y"] - max(model.observed_rewards)).clamp_min(0).mean(0)
    assert torch.allclose(qmc, brute, rtol=0.05, atol=2e-3)


def test_log_eifn_still_ranks_points_where_plain_ei_is_flat():
    """Far from the incumbent every sample's improvement is 0: plain EI cannot tell points
    apart (no gradient either), the smoothed log EI still prefers the one closer to improving."""
    spec = chain_spec(noise=0.0)
    model = trained_model(spec, 12)
    _, plain = _problem("eifn", model, mc_samples=64, log_ei=False)
    _, smooth = _problem("eifn", model, mc_samples=64, log_ei=True)
    plain.best_f = smooth.best_f = max(model.observed_rewards) + 1e3  # out of reach
    actions = torch.rand(64, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert (plain.expected_improvement(actions, ()) == 0).all()
    logs = smooth.expected_improvement(actions, ())
    assert torch.isfinite(logs).all()
    means = smooth.sample_rewards(actions, ()).mean(0)
    assert logs.argmax() == means.argmax()  # closest to improving, by the samples


def test_gpucb_uses_beta_as_a_sigma_multiplier():
    spec = chain_spec()
    model = trained_model(spec, 6)
    _, problem = _problem("gpucb", model, beta=2.0)
    actions = torch.rand(4, 3, dtype=torch.float64)
    post = model.flat_model().posterior(actions.unsqueeze(0), members=[0])
    expected = post.mean[0] + 2.0 * post.variance[0].sqrt()
    assert torch.allclose(problem.ucb(actions, (), 2.0), expected)


def test_beta_schedule_grows_like_sqrt_log_t():
    spec = chain_spec()
    model = trained_model(spec, 100)
    assert beta_at(0.5, None, model) == 0.5
    assert beta_at(0.5, BetaSchedule(kind="constant"), model) == 0.5
    grown = beta_at(0.5, BetaSchedule(rate=0.2), model)
    assert grown == pytest.approx(0.5 * math.sqrt(1 + 0.2 * math.log(100)))
    # paper 003's β_t/5 as a σ-multiplier √(β_t/5), one GP (no union over components), β unused
    assert spec.candidates is None
    paper = beta_at(0.5, BetaSchedule(kind="paper003"), model)
    raw = paper_beta(
        101, domain_size=None, dim=len(spec.actions), components=1, linear=True, delta=0.05
    )
    assert paper == pytest.approx(math.sqrt(0.2 * raw))


# ---------------------------------------------------------------------- flat model
@pytest.mark.parametrize("intervention", ["soft", "hard"])
def test_flat_model_is_built_lazily_and_kept_up_to_date(intervention):
    spec = chain_spec(intervention=intervention)
    eager = NetworkModel(spec)
    eager.flat_model()  # built before any data: learns every round through `observe`
    lazy = trained_model(spec, 6)
    assert lazy._flat is None
    lazy.flat_model()  # built from the 6 rounds of history
    generator = torch.Generator().manual_seed(3)
    for intervention_ in [random_intervention(spec, generator) for _ in range(4)]:
        lazy.learn(intervention_, truth(spec, intervention_))
    for record in lazy.history:
        eager.learn(record.intervention, record.readings)
    rewards = torch.tensor(lazy.observed_rewards, dtype=torch.float64)
    for model in (eager, lazy):
        gp = model.flat_model()
        assert int(gp.num_observations[0]) == 10
        rows = torch.stack([model._flat_row(r) for r in model.history]).unsqueeze(0)
        # Noiseless reward: the GP interpolates every reading it has learned.
        assert torch.allclose(gp.posterior(rows).mean[0], rewards, atol=1e-2)


def test_flat_model_learns_its_noise_when_nodes_upstream_of_the_reward_are_noisy():
    """The flat GP sees Var(Y | a): the reward node's noise fixes it only when nothing upstream
    adds noise (issue 22: told the reward node's noise on dropwave-drift, a lengthscale went to
    its floor)."""
    noisy = NetworkModel(chain_spec(noise=0.1))
    assert noisy.flat_model().config.noise_variance is None  # X0, X1 noisy: learned
    quiet = chain_spec(noise=0.0)
    assert NetworkModel(quiet).flat_model().config.noise_variance == 0.0
    last = quiet.nodes[-1].model_copy(update={"noise_std": 0.1})
    only_reward = quiet.model_copy(update={"nodes": [*quiet.nodes[:-1], last]})
    assert NetworkModel(only_reward).flat_model().config.noise_variance == pytest.approx(0.01)
    learned = quiet.model_copy(update={"nodes": [*quiet.nodes[:-1], last.model_copy(
        update={"noise_std": None})]})  # fmt: skip
    assert NetworkModel(learned).flat_model().config.noise_variance is None


def test_flat_encoding_of_hard_interventions_has_do_bits():
    spec = chain_spec(intervention="hard")
    model = NetworkModel(spec)
    actions = torch.tensor([[0.3, 0.8]], dtype=torch.float64)
    encoded = model.flat_encode(actions, ("a1",))
    assert encoded.tolist() == [[0.0, 0.8, 0.0, 1.0]]


# ---------------------------------------------------------------------- regions
def test_soft_supports_respect_the_cardinality_limit():
    spec = chain_spec(nodes=4, constraints={"max_interventions": 2})
    model = NetworkModel(spec)
    regions = admissible_regions(model, Constraints(max_interventions=2))
    # Supports of size 2 dominate their subsets (values may be 0, no budget): C(4, 2) = 6.
    assert sorted(r.actions for r in regions) == sorted(
        [("a0", "a1"), ("a0", "a2"), ("a0", "a3"), ("a1", "a2"), ("a1", "a3"), ("a2", "a3")]
    )


def test_budget_skips_supports_and_adds_a_linear_constraint():
    actions = [
        {"name": "a0", "targets": ["X0"], "bounds": [0.0, 1.0], "cost": 1.0, "cost_per_unit": 2.0},
        {"name": "a1", "targets": ["X1"], "bounds": [0.0, 1.0], "cost": 3.0},
        {"name": "a2", "targets": ["Y"], "bounds": [0.0, 1.0], "cost": 0.5},
    ]
    spec = chain_spec(actions=actions)
    model = NetworkModel(spec)
    regions = admissible_regions(model, Constraints(budget_per_round=2.5))
    supports = {r.actions for r in regions}
    assert all("a1" not in s for s in supports)  # its fixed cost 3 exceeds the cap
    both = next(r for r in regions if r.actions == ("a0", "a2"))
    ((indices, coefficients, rhs),) = both.inequality_constraints()
    assert (
        indices.tolist() == [0] and coefficients.tolist() == [-2.0] and rhs == pytest.approx(-1.0)
    )
    pulled = both.feasible(torch.tensor([[1.0, 1.0]], dtype=torch.float64))
    assert float(both.cost(pulled)) == pytest.approx(2.5)


def test_negative_bounds_split_into_sign_orthants_when_the_budget_binds():
    actions = [
        {"name": "a0", "targets": ["X0"], "bounds": [-2.0, 1.0], "cost": 0.0, "cost_per_unit": 1.0}
    ]
    spec = chain_spec(actions=actions, nodes=2)
    model = NetworkModel(spec)
    assert len(admissible_regions(model, Constraints(budget_per_round=5.0))) == 1  # never binds
    regions = admissible_regions(model, Constraints(budget_per_round=0.5))
    boxes = sorted((float(r.lower[0]), float(r.upper[0])) for r in regions)
    assert boxes == [(-2.0, 0.0), (0.0, 1.0)]
    for region in regions:
        points = region.feasible(region.lower + (region.upper - region.lower) * torch.rand(50, 1))
        assert (region.cost(points) <= 0.5 + 1e-12).all()


def test_hard_target_sets_filtered_by_cardinality_and_budget():
    spec = chain_spec(
        intervention="hard",
        target_sets=[[], ["a0"], ["a1"], ["a0", "a1"]],
    )
    model = NetworkModel(spec)
    regions = admissible_regions(model, Constraints(max_interventions=1, budget_per_round=1.5))
    assert sorted(r.actions for r in regions) == [(), ("a0",), ("a1",)]
    regions = admissible_regions(model, Constraints(budget_remaining=0.5))
    assert [r.actions for r in regions] == [()]


def test_nothing_affordable():
    spec = chain_spec(intervention="hard", target_sets=[["a0"], ["a1"]])
    model = trained_model(spec, 3)
    for name in POLICIES:
        policy = make_policy(name, spec, FAST[name])
        with pytest.raises(NothingAffordable):
            policy.propose(model, Constraints(budget_remaining=0.5), torch.Generator())
    mandatory = [{"name": "a0", "targets": ["X0"], "bounds": [0.5, 1.0], "cost": 2.0}]
    soft = chain_spec(actions=mandatory, nodes=2)
    with pytest.raises(NothingAffordable):
        admissible_regions(NetworkModel(soft), Constraints(budget_per_round=1.0))
    listed = chain_spec(candidates=[[1.0, 1.0, 0.0], [0.5, 0.0, 0.0]])
    with pytest.raises(NothingAffordable):
        admissible_candidates(NetworkModel(listed), Constraints(budget_per_round=0.5))


# ---------------------------------------------------------------------- proposals
@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("intervention", ["soft", "hard"])
def test_proposals_are_admissible(name, intervention):
    spec = chain_spec(intervention=intervention, noise=0.1)
    model = trained_model(spec, 6)
    policy = make_policy(name, spec, FAST[name])
    rng = torch.Generator().manual_seed(1)
    proposal = policy.propose(model, Constraints(max_interventions=1), rng)
    for action, value in proposal.intervention.items():
        low, high = spec.action(action).bounds
        assert low <= value <= high
    if intervention == "hard":
        assert list(proposal.intervention) in [list(s) for s in spec.allowed_target_sets()]
        assert len(proposal.intervention) <= 1
    else:
        assert sum(v != 0 for v in proposal.intervention.values()) <= 1
    assert proposal.cost == intervention_cost(spec, proposal.intervention)
    assert math.isfinite(proposal.acquisition_value)


def test_random_keeps_actions_that_cannot_be_switched_off():
    """a0 on [0.5, 1.5] is always used and paid: it takes the one slot a limit of 1 leaves."""
    actions = [
        {"name": "a0", "targets": ["X0"], "bounds": [0.5, 1.5], "cost": 1.0, "cost_per_unit": 1.0},
        {"name": "a1", "targets": ["X1"], "bounds": [0.0, 1.0], "cost": 0.5},
        {"name": "a2", "targets": ["Y"], "bounds": [-1.0, 1.0], "cost_per_unit": 1.0},
    ]
    spec = chain_spec(actions=actions)
    model = NetworkModel(spec)
    policy = make_policy("random", spec)
    rng = torch.Generator().manual_seed(0)
    for constraints in (Constraints(max_interventions=1), Constraints(budget_per_round=1.6)):
        for _ in range(50):
            proposal = policy.propose(model, constraints, rng)
            values = proposal.intervention
            assert 0.5 <= values["a0"] <= 1.5 and "a0" in proposal.target_set
            assert proposal.cost == intervention_cost(spec, values) <= constraints.round_cap
            if constraints.max_interventions == 1:
                assert values["a1"] == values["a2"] == 0.0
    with pytest.raises(NothingAffordable, match=r"a0.*round cap 1\.4"):
        policy.propose(model, Constraints(budget_per_round=1.4), rng)  # a0 costs at least 1.5
    two = chain_spec(actions=[{**actions[0]}, {**actions[1], "bounds": [-2.0, -1.0]}])
    with pytest.raises(NothingAffordable, match="max_interventions = 1"):
        make_policy("random", two).propose(NetworkModel(two), Constraints(max_interventions=1), rng)


def test_random_draws_uniformly_over_admissible_interventions():
    """With room for 2 of 3 actions, every draw uses 2 (a support's values may be 0, so its box
    holds the smaller supports): never a round with nothing used, as drawing the number of
    actions first gave in a third of the rounds. A support's chance is its box's volume: a1
    spans 3, a0 and a2 span 1, so {a0, a2} has weight 1 of 1 + 3 + 3."""
    actions = [
        {"name": "a0", "targets": ["X0"], "bounds": [0.0, 1.0]},
        {"name": "a1", "targets": ["X1"], "bounds": [-1.0, 2.0]},
        {"name": "a2", "targets": ["Y"], "bounds": [0.0, 1.0]},
    ]
    spec = chain_spec(actions=actions)
    policy, model = make_policy("random", spec), NetworkModel(spec)
    rng = torch.Generator().manual_seed(0)
    draws = 700
    supports = [
        policy.propose(model, Constraints(max_interventions=2), rng).target_set
        for _ in range(draws)
    ]
    assert all(len(support) == 2 for support in supports)
    share = supports.count(("a0", "a2")) / draws
    assert abs(share - 1 / 7) < 4 * math.sqrt((1 / 7) * (6 / 7) / draws)  # 4 standard errors


def test_random_draws_only_admissible_candidates():
    candidates = [[1.0, 1.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]
    spec = chain_spec(candidates=candidates)
    policy = make_policy("random", spec)
    rng = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(40):
        proposal = policy.propose(NetworkModel(spec), Constraints(max_interventions=1), rng)
        seen.add(tuple(proposal.intervention[a] for a in spec.action_names))
    assert seen == {(0.5, 0.0, 0.0), (0.0, 0.0, 0.0)}  # the first uses two actions


@pytest.mark.parametrize("name", POLICIES)
def test_candidates_are_scored_exhaustively(name):
    candidates = [[0.0, 0.0, 0.0], [1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0]]
    spec = chain_spec(candidates=candidates)
    model = trained_model(spec, 6)
    policy = make_policy(name, spec, FAST[name])
    proposal = policy.propose(model, Constraints(max_interventions=2), torch.Generator())
    point = [proposal.intervention[a] for a in spec.action_names]
    assert point in candidates[:2]  # the others use three actions
    assert proposal.diagnostics["candidates"] == 2


def test_cost_aware_scores_improvement_per_cost():
    spec = chain_spec(nodes=2)
    model = NetworkModel(spec)
    region = admissible_regions(model, Constraints())[0]
    score = ratio_scorer(1.0, 1e-6)
    values = torch.tensor([[0.0, 0.0], [0.5, 0.0]], dtype=torch.float64)
    acquisition = torch.tensor([3.0, 0.5], dtype=torch.float64)
    assert score(region, acquisition, values).tolist() == [1.0, 0.0]  # fixed cost 2, improvement 2


@pytest.mark.parametrize("name", POLICIES)
def test_cost_aware_proposals_fit_the_budget(name):
    actions = [
        {"name": "a0", "targets": ["X0"], "bounds": [0.0, 1.0], "cost": 0.1, "cost_per_unit": 1.0},
        {"name": "a1", "targets": ["X1"], "bounds": [-1.0, 1.0], "cost": 1.0, "cost_per_unit": 1.0},
        {"name": "a2", "targets": ["Y"], "bounds": [0.0, 1.0], "cost": 2.0},
    ]
    spec = chain_spec(actions=actions, noise=0.1)
    model = trained_model(spec, 6)
    policy = make_policy(name, spec, {**FAST[name], "cost_aware": True})
    constraints = Constraints(budget_per_round=1.6)
    proposal = policy.propose(model, constraints, torch.Generator().manual_seed(0))
    assert proposal.cost <= 1.6 + 1e-9
    assert "cost_baseline" in proposal.diagnostics


def test_mcbo_network_mode_warm_starts_from_the_previous_round():
    spec = chain_spec(noise=0.2)
    model = trained_model(spec, 6)
    policy = make_policy("mcbo", spec, FAST["mcbo"])
    rng = torch.Generator().manual_seed(0)
    first = policy.propose(model, Constraints(), rng)
    assert first.diagnostics["eta"] == "network" and first.diagnostics["warm_started"] == 0
    second = policy.propose(model, Constraints(), rng)
    assert second.diagnostics["warm_started"] == 1


def test_eta_mode_auto_follows_the_noise():
    """Network η only where a hallucinated node's inputs vary with the noise."""
    policy = make_policy("mcbo", chain_spec())
    assert policy.eta_mode(NetworkModel(chain_spec())) == "constant"
    assert policy.eta_mode(NetworkModel(chain_spec(noise=0.1))) == "network"
    # X0 -> Y only: X0's inputs are the actions, and η_Y ≡ 1: constant suffices.
    assert policy.eta_mode(NetworkModel(chain_spec(noise=0.1, nodes=2))) == "constant"
    hard = NetworkModel(chain_spec(intervention="hard", noise=0.1))
    assert policy.eta_mode(hard, ()) == "network"
    assert policy.eta_mode(hard, ("a0",)) == "constant"  # X0 set: X1 sees a fixed input
    assert policy.eta_mode(hard, ("a1",)) == "constant"  # X1 set: only the root X0 is free
    forced = make_policy("mcbo", chain_spec(), {"eta": "network"})
    assert forced.eta_mode(NetworkModel(chain_spec())) == "network"


def test_invalid_settings_name_the_field():
    with pytest.raises(ValueError, match="beta"):
        make_policy("mcbo", chain_spec(), {"beta": -1})
    with pytest.raises(ValueError, match="betta"):
        make_policy("gpucb", chain_spec(), {"betta": 1})


# ---------------------------------------------------------------------- wall-clock cap
@pytest.mark.parametrize(
    ("name", "settings"),
    [
        # the plateau rule off: the training must run into the cap, not stop on a plateau
        ("mcbo", {"eta": "network", "steps": 100_000, "nn_restarts": 16, "stop_patience": 0}),
        ("mcbo", {"eta": "constant", "restarts": 64, "raw_samples": 2048, "maxiter": 100_000}),
        ("eifn", {"restarts": 64, "raw_samples": 1024, "maxiter": 100_000, "mc_samples": 512}),
    ],
)
def test_wall_clock_cap_is_honoured(name, settings):
    spec = chain_spec(noise=0.2, nodes=4)
    model = trained_model(spec, 20)
    policy = make_policy(name, spec, {**settings, "max_seconds": 0.5})
    started = time.perf_counter()
    proposal = policy.propose(model, Constraints(), torch.Generator().manual_seed(0))
    assert time.perf_counter() - started < 2.0
    if name == "mcbo" and settings["eta"] == "network":
        assert proposal.diagnostics["timed_out"]


def test_cost_floor_defaults_to_the_cheapest_paid_action():
    actions = [
        {"name": "a0", "targets": ["X0"], "bounds": [0.0, 1.0], "cost": 0.0},
        {"name": "a1", "targets": ["Y"], "bounds": [0.0, 1.0], "cost": 0.25},
    ]
    spec = chain_spec(actions=actions, nodes=2)
    assert make_policy("gpucb", spec)._cost_floor() == 0.25
    assert make_policy("gpucb", spec, {"cost_floor": 0.01})._cost_floor() == 0.01


# ---------------------------------------------------------------------- regions searched together
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_joint_search_of_soft_regions_beats_a_dense_grid_of_each(beta):
    """MCBO's soft regions (here: one action of three, 3 regions) are searched in one batched
    problem; its best is at least the best of a dense grid over every region's box (the action
    on 201 points × η on the corners and centre of its cube)."""
    spec = chain_spec(
        actions=[
            {"name": f"a{i}", "targets": [t], "bounds": [-1.0, 1.0]}
            for i, t in enumerate(["X0", "X1", "Y"])
        ],
        constraints={"max_interventions": 1},
    )
    model = trained_model(spec, 12)
    policy = make_policy("mcbo", spec, {"beta": beta, "eta": "constant"})
    proposal = policy.propose(model, Constraints.from_spec(spec), torch.Generator().manual_seed(0))
    assert proposal.diagnostics["joint"] and proposal.diagnostics["regions"] == 3
    assert len(proposal.target_set) <= 1
    problem = policy.problem(model, 0, Deadline(60))
    grid = torch.linspace(-1.0, 1.0, 201, dtype=torch.float64)
    corners = torch.cartesian_prod(*[torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)] * 2)
    best = -math.inf
    with torch.no_grad():
        for column in range(3):
            actions = torch.zeros(len(grid), 3, dtype=torch.float64)
            actions[:, column] = grid
            for eta in corners:
                value = problem.optimistic_reward(actions, eta.expand(len(grid), 2), (), beta)
                best = max(best, float(value.max()))
    # joint_maxiter (30) stops the climb near, not at, the top: it may leave the 4th digit
    assert proposal.acquisition_value >= best - 1e-3 * max(1.0, abs(best))


def test_network_eta_regions_in_threads_propose_what_one_by_one_does():
    """MCBO's η-net regions train two at a time (`region_threads`), each on one torch thread:
    the seeds, starts and comparison order are the sequential search's, so the proposal and its
    value are the same up to the order of floating-point sums — nothing a regret table could see."""
    # X0 -> X1 -> X2 -> X3 -> Y, noisy: in each set some hallucinated node has a noisy parent
    target_sets = [[], ["a0"], ["a1"], ["a0", "a1"]]
    spec = chain_spec(intervention="hard", nodes=5, noise=0.2, target_sets=target_sets)
    model = trained_model(spec, 10)
    proposals, threads_seen = [], []
    for threads in (1, 2):
        policy = make_policy(
            "mcbo", spec, {**FAST["mcbo"], "region_threads": threads, "max_seconds": 600.0}
        )
        problem = policy.problem(model, 0, Deadline(600.0))
        regions = admissible_regions(model, Constraints.from_spec(spec, 0.0))
        threads_seen.append(all(problem.solves_in_threads(r) for r in regions))
        before = torch.get_num_threads()
        proposal = policy.propose(
            model, Constraints.from_spec(spec, 0.0), torch.Generator().manual_seed(3)
        )
        assert torch.get_num_threads() == before  # the search's one-thread setting is undone
        proposals.append(proposal)
    assert threads_seen == [True, True]  # every region is a network-η one: threads are used
    one, two = proposals
    # the same target set and, to the optimizer's precision, the same point and value: not to
    # the bit, since torch's thread pool (one thread in the region threads, the process's own
    # otherwise) sums in another order and Adam carries that difference through its steps
    # (seen: 3e-5 in the action)
    assert one.target_set == two.target_set
    assert one.intervention.keys() == two.intervention.keys()
    for name, value in one.intervention.items():
        assert value == pytest.approx(two.intervention[name], abs=1e-3)
    assert one.acquisition_value == pytest.approx(two.acquisition_value, rel=1e-3, abs=1e-6)


def test_region_threads_keep_their_one_torch_thread_to_themselves(monkeypatch):
    """Each region thread runs torch on one thread, and only it: a thread that starts using
    torch during the search (the next proposal's worker, a refit's factorization) gets the
    process's count, not the region threads' 1 (`core.threads.this_thread_only`)."""
    import threading

    from policies.mcbo import _MCBOProblem

    target_sets = [[], ["a0"], ["a1"], ["a0", "a1"]]
    spec = chain_spec(intervention="hard", nodes=5, noise=0.2, target_sets=target_sets)
    model = trained_model(spec, 10)
    solve, seen = _MCBOProblem.solve, []

    def probe(self, *args, **kwargs):
        meanwhile: list[int] = []
        thread = threading.Thread(target=lambda: meanwhile.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        seen.append((torch.get_num_threads(), meanwhile[0]))
        return solve(self, *args, **kwargs)

    monkeypatch.setattr(_MCBOProblem, "solve", probe)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        policy = make_policy(
            "mcbo", spec, {**FAST["mcbo"], "region_threads": 2, "max_seconds": 600.0}
        )
        policy.propose(model, Constraints.from_spec(spec, 0.0), torch.Generator().manual_seed(3))
    finally:
        torch.set_num_threads(before)
    assert seen and all(pair == (1, 2) for pair in seen), seen
