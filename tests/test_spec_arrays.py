"""Array nodes in the spec (paper 002): shapes, where they may sit, and the reward g(field)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from connectors.arrays import MAX_ARRAY_ELEMENTS
from core.errors import SpecError
from core.field_metrics import environmental_target
from core.field_reward import FieldReward
from core.spec import MAX_FIELD_ELEMENTS, parse_spec

BASE: dict[str, Any] = {
    "name": "kiln",
    "intervention": "soft",
    "nodes": [
        {"name": "temps", "shape": [16], "bounds": [0, 100]},
        {"name": "power", "bounds": [0, 10]},
        {"name": "score", "parents": ["temps", "power"], "bounds": [-100, 0]},
    ],
    "actions": [{"name": "a", "targets": ["temps", "power"], "bounds": [0, 1]}],
    "reward": {
        "node": "score",
        "components": ["temps", "power"],
        "aggregation": "expression",
        "expression": "-var(temps) - 0.1 * power",
    },
}


def spec_with(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        data[key] = value
    return data


def problems(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    return str(caught.value)


def test_the_spec_and_the_wire_agree_on_the_largest_array() -> None:
    assert MAX_FIELD_ELEMENTS == MAX_ARRAY_ELEMENTS


def test_an_array_reward_expression_reduces_the_field() -> None:
    spec = parse_spec(BASE)
    assert spec.array_nodes == {"temps": (16,)}
    g = FieldReward(spec)
    temps = torch.arange(32.0, dtype=torch.float64).reshape(2, 16)
    power = torch.tensor([1.0, 2.0], dtype=torch.float64)
    out = g({"temps": temps, "power": power})
    expected = -temps.var(-1, unbiased=False) - 0.1 * power
    torch.testing.assert_close(out, expected)


def test_a_registered_metric_is_a_reward_function() -> None:
    data = spec_with(
        nodes=[
            {"name": "field", "shape": [3, 4], "bounds": [0, 20]},
            {"name": "score", "parents": ["field"], "bounds": [-100, 0]},
        ],
        actions=[{"name": "M", "targets": ["field"], "bounds": [7, 13]}],
        reward={
            "node": "score",
            "components": ["field"],
            "aggregation": "function",
            "function": "environmental_sse",
        },
    )
    g = FieldReward(parse_spec(data))
    target = environmental_target()
    assert float(g({"field": target})) == 0.0
    assert float(g({"field": target + 1.0})) == pytest.approx(-12.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nodes": [{"name": "temps", "shape": [100, 100], "bounds": [0, 1]}]}, "limit of 8192"),
        ({"nodes": [{"name": "temps", "shape": [0], "bounds": [0, 1]}]}, "at least 1"),
        ({"nodes": [{"name": "temps", "shape": [1, 1, 1, 1], "bounds": [0, 1]}]}, "shape"),
    ],
)
def test_bad_shapes_are_named(change: dict[str, Any], message: str) -> None:
    assert message in problems(spec_with(**change))


def test_an_unreduced_array_or_an_unknown_metric_is_named() -> None:
    data = spec_with()
    data["reward"]["expression"] = "temps + power"
    assert "reduce every array" in problems(data)
    data["reward"] = {
        "node": "score",
        "components": ["temps", "power"],
        "aggregation": "function",
        "function": "enviromental_sse",
    }
    assert "did you mean 'environmental_sse'" in problems(data)


def test_array_nodes_have_no_parents_and_feed_something() -> None:
    data = spec_with()
    data["nodes"][0]["parents"] = ["power"]
    assert "an array node has no parents" in problems(data)
    data = spec_with()
    data["nodes"][1]["parents"] = ["temps"]  # a field feeding a scalar node (issue 15)
    assert parse_spec(data).node("power").parents == ["temps"]
    data = spec_with()
    data["reward"] = {"node": "temps"}
    assert "cannot be the reward" in problems(data)
    data = spec_with(intervention="hard", target_sets=[["a"]])
    data["actions"][0]["targets"] = ["power"]
    assert "soft experiments" in problems(data)
    data = spec_with()
    data["nodes"].append({"name": "idle", "shape": [4], "bounds": [0, 1]})
    data["actions"].append({"name": "c", "targets": ["idle"], "bounds": [0, 1]})
    assert "the array node 'idle' feeds nothing" in problems(data)
    data["actions"].pop()
    data["nodes"][1]["parents"] = ["idle"]
    assert "the array node 'idle' has no soft action targeting it" in problems(data)


def test_validate_names_an_array_node_that_feeds_nothing_in_one_line(tmp_path, capsys) -> None:
    """What cannot work is one line of `cbo-agent validate`, exit 1 as every spec problem, no
    traceback; a field feeding a scalar node validates (issue 15)."""
    import yaml

    from agent.cli import main

    data = spec_with()
    data["nodes"][1]["parents"] = ["temps"]
    path = tmp_path / "field-parent.yaml"
    path.write_text(yaml.safe_dump({**data, "policy": {"name": "random"}}))
    assert main(["validate", str(path)]) == 0
    data["nodes"].append({"name": "idle", "shape": [4], "bounds": [0, 1]})
    data["actions"].append({"name": "c", "targets": ["idle"], "bounds": [0, 1]})
    path.write_text(yaml.safe_dump({**data, "policy": {"name": "random"}}))
    capsys.readouterr()
    assert main(["validate", str(path)]) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if "nodes[3]" in line]
    assert len(lines) == 1
    assert "the array node 'idle' feeds nothing" in lines[0]
    assert "Traceback" not in captured.out + captured.err
