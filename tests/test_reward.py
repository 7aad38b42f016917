"""Decomposed rewards in the spec: validation and the compiled function g."""

from __future__ import annotations

import pytest
import torch

from core.reward import RewardFunction
from core.spec import SpecError, parse_spec

APPARENT = "T + 0.33 * (RH / 100) * 6.105 * exp(17.27 * T / (237.7 + T)) - 0.70 * ws - 4.0"


def decomposed(reward: dict, components=("f1", "f2")) -> dict:
    return {
        "name": "decomposed",
        "intervention": "soft",
        "nodes": [
            *({"name": c, "bounds": [-5, 40], "noise_std": 0.1} for c in components),
            {"name": "y", "parents": list(components), "bounds": [-10, 60]},
        ],
        "actions": [{"name": "x", "targets": list(components), "bounds": [0, 1]}],
        "reward": {"node": "y", "components": list(components), **reward},
    }


def test_linear_reward_with_constant_and_action_dependent_weights():
    spec = parse_spec(decomposed({"aggregation": "linear", "weights": [2.0, "1 + x"]}))
    g = RewardFunction(spec)
    components = torch.tensor([[1.0, 3.0], [2.0, -1.0]], dtype=torch.float64)
    actions = {"x": torch.tensor([0.5, 0.0], dtype=torch.float64)}
    torch.testing.assert_close(
        g(components, actions), torch.tensor([2 + 4.5, 4 - 1.0], dtype=torch.float64)
    )
    assert g.derivative_bounds() == pytest.approx([2.0, 2.0])  # 1 + x peaks at x = 1


def test_expression_reward_and_its_derivative_bounds():
    spec = parse_spec(
        decomposed(
            {"aggregation": "expression", "expression": APPARENT}, components=("T", "RH", "ws")
        )
    )
    g = RewardFunction(spec)
    bounds = g.derivative_bounds()
    points = torch.rand(500, 3, dtype=torch.float64) * torch.tensor([45.0, 45.0, 45.0]) - 5
    points.requires_grad_(True)
    (grad,) = torch.autograd.grad(g(points).sum(), points)
    assert (grad.abs() <= torch.tensor(bounds, dtype=torch.float64) * (1 + 1e-9)).all()
    assert bounds[2] == pytest.approx(0.70)


def test_weather_simulator_and_spec_agree_on_g():
    from sim.registry import make_environment

    env = make_environment("weather")
    spec = parse_spec(
        decomposed(
            {
                "aggregation": "expression",
                "expression": APPARENT.replace("RH", "humidity")
                .replace("T", "temperature")
                .replace("ws", "wind_speed"),
            },
            components=("temperature", "humidity", "wind_speed"),
        )
    )
    values = torch.tensor([[30.0, 60.0, 3.0], [15.0, 20.0, 8.0]], dtype=torch.float64)
    torch.testing.assert_close(RewardFunction(spec)(values), env.compose_reward(values))


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ({}, "reward.aggregation: say 'linear', 'expression' or 'function'"),
        ({"aggregation": "linear", "weights": [1.0]}, "one weight per component"),
        ({"aggregation": "linear", "weights": [1.0, "z * 2"]}, "reward.weights[1]: unknown name"),
        ({"aggregation": "expression", "expression": "f1 + f3"}, "reward.expression: unknown"),
        ({"aggregation": "expression", "expression": "f1", "weights": [1, 1]}, "takes no weights"),
        (
            {"aggregation": "linear", "weights": [1, 1], "derivative_bounds": [1.0]},
            "derivative_bounds",
        ),
    ],
)
def test_bad_decomposed_rewards_name_the_field(reward, message):
    with pytest.raises(SpecError) as raised:
        parse_spec(decomposed(reward))
    assert any(message in p for p in raised.value.problems), raised.value.problems


def test_components_must_be_the_reward_nodes_parents():
    data = decomposed({"aggregation": "linear", "weights": [1, 1]})
    data["nodes"][-1]["parents"] = ["f1"]
    with pytest.raises(SpecError, match="must be exactly the parents"):
        parse_spec(data)


def test_plain_reward_rejects_decomposition_settings():
    data = decomposed({"aggregation": "linear", "weights": [1, 1]})
    data["reward"] = {"node": "y", "weights": [1, 1]}
    with pytest.raises(SpecError, match="only a decomposed reward"):
        parse_spec(data)
