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


def test_cardinality_is_refused_with_a_parameter_vector():
    data = _spec()
    data["constraints"] = {"max_interventions": 2}
    with pytest.raises(SpecError, match="every parameter is set each round"):
        parse_spec(data)
