"""The network model: which node learns when, hard interventions, rollouts through the DAG."""

from __future__ import annotations

import pytest
import torch

from core.network import NetworkModel, NodeQuery
from core.spec import parse_spec


def chain(intervention: str = "soft") -> NetworkModel:
    """A -> B -> C, one action feeding (soft) or setting (hard) B."""
    data = {
        "name": "chain",
        "intervention": intervention,
        "nodes": [
            {"name": "A", "bounds": [0, 1], "noise_std": 0.0},
            {"name": "B", "parents": ["A"], "bounds": [-2, 2], "noise_std": 0.0},
            {"name": "C", "parents": ["B"], "bounds": [-4, 4], "noise_std": 0.0},
        ],
        "actions": [{"name": "u", "targets": ["B"], "bounds": [-1, 1]}],
        "reward": {"node": "C"},
        "model": {"refit_every": None, "misfit_z": None},
    }
    if intervention == "hard":
        data["target_sets"] = [[], ["u"]]
    return NetworkModel(parse_spec(data))


def test_a_node_learns_once_its_row_is_complete():
    model = chain()
    r = model.start_round({"u": 0.5})
    model.observe(r, {"C": 1.0})  # C's parent B is missing: nobody learns
    assert model.gp.num_observations.tolist() == [0, 0, 0]
    model.observe(r, {"B": 0.2})  # C is complete (B is its parent); B still needs A
    assert model.gp.num_observations.tolist() == [0, 0, 1]
    model.observe(r, {"A": 0.4})  # A and B complete now, in one call
    assert model.gp.num_observations.tolist() == [1, 1, 1]
    model.observe(r, {"A": 0.4})  # a duplicate reading teaches nothing twice
    assert model.gp.num_observations.tolist() == [1, 1, 1]


def test_late_readings_of_an_old_round_still_teach():
    model = chain()
    first = model.start_round({"u": 0.1})
    model.observe(first, {"A": 0.3, "B": 0.4})
    second = model.start_round({"u": -0.2})
    model.learn({"u": 0.0}, {"A": 0.5, "B": 0.1, "C": 0.3})
    model.observe(second, {"A": 0.2, "B": 0.0, "C": 0.0})
    model.observe(first, {"C": 0.9})  # late
    assert model.gp.num_observations.tolist() == [3, 3, 3]


def test_node_set_by_a_hard_intervention_does_not_learn():
    model = chain("hard")
    model.learn({"u": 0.7}, {"A": 0.2, "B": 0.7, "C": 1.4})
    model.learn({}, {"A": 0.3, "B": 0.1, "C": 0.2})
    assert model.gp.num_observations.tolist() == [2, 1, 2]


def test_inputs_are_parents_then_actions():
    model = chain()
    assert model.inputs["B"].parents == ("A",) and model.inputs["B"].actions == ("u",)
    assert model.node_input_row("B", {"A": 0.25}, {"u": -0.5}) == [0.25, -0.5]
    assert model.inputs["A"].width == 0  # a root without actions: a constant input


def test_rollout_samples_children_at_sampled_parents():
    torch.manual_seed(0)
    model = chain()
    for _ in range(12):
        a, u = float(torch.rand(1)), float(2 * torch.rand(1) - 1)
        b = a + u
        model.learn({"u": u}, {"A": a, "B": b, "C": 2 * b})
    seen: dict[str, torch.Tensor] = {}

    def record(query: NodeQuery) -> torch.Tensor:
        seen[query.node] = query.inputs
        return query.mean + 0.5 * query.std * torch.randn_like(query.mean)

    actions = torch.zeros(64, 3, 1, dtype=torch.float64)
    values = model.rollout(actions, record)
    assert values["C"].shape == (64, 3)
    # B's input column 0 is A's sampled value, C's input is B's sampled value
    torch.testing.assert_close(seen["B"][..., 0], values["A"])
    torch.testing.assert_close(seen["C"][..., 0], values["B"])


def test_hard_rollout_sets_the_node_and_skips_its_model():
    model = chain("hard")
    model.learn({}, {"A": 0.3, "B": 0.3, "C": 0.6})
    values = model.rollout(torch.full((5, 1), 0.8, dtype=torch.float64), set_actions=("u",))
    assert torch.equal(values["B"], torch.full((5,), 0.8, dtype=torch.float64))


def test_rollout_is_differentiable_in_the_actions():
    model = chain()
    for u in (-0.5, 0.0, 0.5):
        model.learn({"u": u}, {"A": 0.5, "B": 0.5 + u, "C": 1 + 2 * u})
    actions = torch.zeros(4, 1, dtype=torch.float64, requires_grad=True)
    model.rollout(actions)["C"].sum().backward()
    assert actions.grad is not None and (actions.grad > 0).all()


def test_unknown_names_are_rejected():
    model = chain()
    r = model.start_round({"u": 0.0})
    with pytest.raises(KeyError, match="unknown node 'Z'"):
        model.observe(r, {"Z": 1.0})
    with pytest.raises(KeyError, match="unknown action 'w'"):
        model.action_vector({"w": 1.0})
    with pytest.raises(ValueError, match="not finite"):
        model.observe(r, {"A": float("nan")})


def test_lengthscale_caps_give_a_view_and_leave_the_model_alone():
    """`with_lengthscale_caps` (issue 19, MCBO's shrinking lengthscales): the view's capped node
    is less sure away from its data, the model it came from is untouched, and a cap above every
    lengthscale returns the model itself."""
    model = chain("hard")
    for a, u in ((0.1, 0.0), (0.2, 0.5), (0.3, -0.5), (0.4, 1.0)):
        model.learn({}, {"A": a, "B": 2 * a - 0.4, "C": 1.5 * (2 * a - 0.4)})
        model.learn({"u": u}, {"A": a, "B": u, "C": 1.5 * u})
    before = model.gp.lengthscale.clone()
    far = torch.tensor([[-1.8]], dtype=torch.float64)  # B far from every reading of C's input
    mean, std = model.node_posterior("C", far)
    assert model.with_lengthscale_caps({"C": 100.0}) is model
    view = model.with_lengthscale_caps({"C": 0.01})
    assert view is not model
    assert float(view.gp.lengthscale[model.member["C"], 0]) == pytest.approx(0.01)
    torch.testing.assert_close(view.gp.lengthscale[: model.member["C"]], before[:2])
    _, view_std = view.node_posterior("C", far)
    assert float(view_std) > float(std)
    torch.testing.assert_close(model.gp.lengthscale, before)  # the model is unchanged
    again_mean, again_std = model.node_posterior("C", far)
    torch.testing.assert_close((again_mean, again_std), (mean, std))
