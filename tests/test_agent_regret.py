"""The model-based regret estimate: from the experiment's own network model, at bounded cost."""

from __future__ import annotations

import pytest
import torch

import agent.regret as regret
from agent.regret import regret_bound
from core.network import NetworkModel, mean_sampler
from core.spec import load_spec
from sim.registry import make_environment
from tests.test_agent_service import EXAMPLES


@pytest.fixture(scope="module")
def learned() -> tuple[NetworkModel, object]:
    """ToyGraph's node GPs after 80 random rounds (hyperparameters fitted): enough for the
    model to tell the best single action from the worst at every seed (at 40 it did at a
    third of them)."""
    spec = load_spec(EXAMPLES / "toygraph.yaml")
    env = make_environment("toygraph", 0)
    model = NetworkModel(spec)
    gen = torch.Generator().manual_seed(0)
    bounds = model.action_bounds()
    sets = spec.allowed_target_sets()
    for i in range(80):
        chosen = sets[i % len(sets)]
        u = torch.rand(len(bounds), generator=gen, dtype=bounds.dtype)
        values = bounds[:, 0] + u * (bounds[:, 1] - bounds[:, 0])
        intervention = {a: float(values[spec.action_names.index(a)]) for a in chosen}
        model.learn(intervention, env.step(intervention, gen))
    return model, env


def test_none_before_the_reward_node_has_two_observations():
    spec = load_spec(EXAMPLES / "toygraph.yaml")
    model = NetworkModel(spec)
    assert regret_bound(model, {}, torch.Generator().manual_seed(0)) is None


def test_uses_the_own_model_only_and_orders_good_and_bad_actions(learned):
    model, env = learned
    gen = torch.Generator().manual_seed(1)
    spec = model.spec
    # the best and the worst of a grid of single-action interventions, by the simulator's truth
    grid = [
        {a: float(v)}
        for a in spec.action_names
        for v in torch.linspace(*spec.action(a).bounds, 25).tolist()
    ]
    truth = [env.expected_reward(i) for i in grid]
    best, worst = grid[max(range(len(grid)), key=truth.__getitem__)], grid[truth.index(min(truth))]
    ucb_best, lcb_at_best = regret_bound(model, best, gen)
    ucb_worst, lcb_at_worst = regret_bound(model, worst, gen)
    assert model._flat is None  # no second, graph-blind GP is built
    assert ucb_best >= lcb_at_best
    assert ucb_worst - lcb_at_worst > ucb_best - lcb_at_best  # a bad action costs more regret
    assert ucb_best >= max(truth) - 1.0  # optimistic: near or above the true optimum


def test_cost_is_bounded_by_candidates_and_samples(learned, monkeypatch):
    model, _ = learned
    queries = []
    original = model.node_posterior

    def counted(node, inputs):
        queries.append(inputs.shape[:-1].numel())
        return original(node, inputs)

    monkeypatch.setattr(model, "node_posterior", counted)
    regret_bound(model, {"do_X0": 0.0}, torch.Generator().manual_seed(2))
    assert sum(queries) <= len(model.order) * regret.CANDIDATES * regret.SAMPLES


def test_one_pass_over_every_target_set_gives_each_sets_own_rollout(learned):
    """Candidates of different target sets are rolled out together, each node's posterior once
    for all of them; each candidate's reward is what a rollout of its own target set gives."""
    model, _ = learned
    candidates = [{"do_X0": 1.0}, {}, {"do_X1": 5.0}, {"do_X0": -2.0}, {"do_X1": 15.0}]
    actions = torch.stack([model.action_vector(c) for c in candidates])
    together = regret._mixed_rollout(model, actions, candidates, mean_sampler)
    for i, candidate in enumerate(candidates):
        alone = model.rollout(actions[i : i + 1], mean_sampler, set_actions=tuple(candidate))
        torch.testing.assert_close(together[..., i], alone[model.reward_node][..., 0])


def test_one_posterior_per_node_whatever_the_target_sets(learned, monkeypatch):
    model, _ = learned
    asked = []
    original = model.node_posterior

    def counted(node, inputs):
        asked.append(node)
        return original(node, inputs)

    monkeypatch.setattr(model, "node_posterior", counted)
    # the candidates span all three of ToyGraph's target sets: (), (do_X0,), (do_X1,)
    regret_bound(model, {"do_X0": 0.0}, torch.Generator().manual_seed(3))
    assert sorted(asked) == sorted(model.order)
