"""The model-based regret estimate: from the experiment's own network model, at bounded cost."""

from __future__ import annotations

import pytest
import torch

import agent.regret as regret
from agent.regret import regret_bound
from core.network import NetworkModel
from core.spec import load_spec
from sim.registry import make_environment
from tests.test_agent_service import EXAMPLES


@pytest.fixture(scope="module")
def learned() -> tuple[NetworkModel, object]:
    """ToyGraph's node GPs after 40 random rounds (hyperparameters fitted)."""
    spec = load_spec(EXAMPLES / "toygraph.yaml")
    env = make_environment("toygraph", 0)
    model = NetworkModel(spec)
    gen = torch.Generator().manual_seed(0)
    bounds = model.action_bounds()
    sets = spec.allowed_target_sets()
    for i in range(40):
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
