"""A parameter vector in the spec: expansion into coordinate actions, checks, cost."""

from __future__ import annotations

import pytest

from core.errors import SpecError
from core.spec import parse_spec
from policies.base import intervention_cost


def _spec(**parameters):
    return {
        "name": "pv",
        "intervention": "soft",
        "nodes": [{"name": "R", "bounds": [-5, 5]}],
        "parameters": {
            "name": "theta",
            "dimension": 4,
            "bounds": [-1, 1],
            "targets": ["R"],
            "cost": 2.5,
            **parameters,
        },
        "reward": {"node": "R"},
    }


def test_parameters_stand_for_coordinate_actions_and_cost_once_per_round():
    spec = parse_spec(_spec(coordinate_bounds=[[0, 1], [-1, 1], [-2, 2], [0, 3]]))
    assert spec.action_names == ["theta.0", "theta.1", "theta.2", "theta.3"]
    assert spec.parameter_vector == spec.action_names
    assert spec.action("theta.2").bounds == (-2, 2)
    assert intervention_cost(spec, dict.fromkeys(spec.action_names, 0.5)) == 2.5
    # written back and read again: the same spec (the coordinates are rebuilt, not doubled)
    assert parse_spec(spec.model_dump(by_alias=True)) == spec


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"blocks": {"a": [0, 3], "b": [2, 4]}}, "parameters: blocks.b: overlaps block 'a'"),
        ({"blocks": {"a": [0, 9]}}, "parameters: blocks.a: [0, 9) is not within [0, 4)"),
        ({"dimension": 1001}, "parameters.dimension"),
        ({"targets": ["X"]}, "parameters.targets: unknown node 'X'"),
        ({"coordinate_bounds": [[0, 1]]}, "coordinate_bounds: one pair per coordinate (4)"),
    ],
)
def test_parameter_mistakes_name_the_field(parameters, message):
    with pytest.raises(SpecError) as error:
        parse_spec(_spec(**parameters))
    assert message in str(error.value)


def test_cardinality_counts_the_blocks_changed_from_the_default():
    data = _spec(blocks={"a": [0, 2]}, default=[0.0, 0.5, 0.0, -1.0])
    data["constraints"] = {"max_interventions": 1}
    spec = parse_spec(data)
    params = spec.parameters
    # the blocks, and each coordinate outside them a block of its own, in θ's order
    assert params.units == {"a": (0, 2), "theta.2": (2, 3), "theta.3": (3, 4)}
    assert params.reference == [0.0, 0.5, 0.0, -1.0]
    at_default = dict(zip(spec.action_names, params.reference, strict=True))
    assert params.changed_units(at_default) == []
    assert params.changed_units({**at_default, "theta.1": 0.0, "theta.3": 1.0}) == ["a", "theta.3"]
    assert parse_spec(_spec(default=0.25)).parameters.reference == [0.25] * 4


@pytest.mark.parametrize(
    ("default", "message"),
    [
        ([0.0, 0.0], "parameters: default: one value per coordinate (4), got 2"),
        (2.0, "parameters: default: outside the bounds at coordinates [0, 1, 2, 3]"),
    ],
)
def test_a_default_outside_the_box_is_refused(default, message):
    with pytest.raises(SpecError) as error:
        parse_spec(_spec(default=default))
    assert message in str(error.value)


def test_a_block_limit_beside_other_actions_is_refused():
    data = _spec()
    data["actions"] = [{"name": "x", "targets": ["R"], "bounds": [0, 1]}]
    data["constraints"] = {"max_interventions": 2}
    with pytest.raises(SpecError, match="not with other actions beside θ"):
        parse_spec(data)
