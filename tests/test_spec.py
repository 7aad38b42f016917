"""Experiment specs: the shipped examples, validation errors that name fields, the CLI."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cli import main
from core.spec import SpecError, load_spec, parse_spec
from sim.registry import environment_names, make_environment

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SPEC_FILES = sorted(EXAMPLES.glob("*.yaml"))


def test_every_paper_004_environment_has_a_spec():
    shipped = {path.stem for path in SPEC_FILES}
    paper_004 = {
        "toygraph",
        "psagraph",
        "dropwave",
        "dropwave-noisy",
        "alpine2",
        "alpine2-noisy",
        "ackley",
        "rosenbrock",
        "rosenbrock-noisy",
    }
    assert paper_004 <= shipped
    assert shipped <= set(environment_names()) | {p.stem for p in SPEC_FILES if "-" in p.stem}


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_example_spec_matches_its_simulator(path):
    spec = load_spec(path)
    env = make_environment(spec.name if spec.name in environment_names() else path.stem)
    assert spec.intervention == env.intervention_type
    assert spec.reward.node == env.reward_node
    assert [(n.name, tuple(n.parents)) for n in spec.nodes] == [
        (n.name, n.parents) for n in env.nodes
    ]
    for node, info in zip(spec.nodes, env.nodes, strict=True):
        if spec.fidelity is None:  # a multi-fidelity trial's noise is reported or learned
            assert node.noise_std == pytest.approx(info.noise_std, rel=1e-5)
        assert node.bounds == pytest.approx(info.bounds, rel=1e-5)
    for action, info in zip(spec.actions, env.actions, strict=True):
        assert (action.name, tuple(action.targets)) == (info.name, info.targets)
        assert action.bounds == pytest.approx(info.bounds)
    if spec.intervention == "hard":
        assert {frozenset(s) for s in spec.target_sets} == {frozenset(s) for s in env.target_sets}


def _chain_spec() -> dict:
    return {
        "name": "chain",
        "intervention": "soft",
        "nodes": [
            {"name": "A", "bounds": [0, 1], "noise_std": 0.1},
            {"name": "B", "parents": ["A"], "bounds": [-1, 1]},
        ],
        "actions": [{"name": "u", "targets": ["A"], "bounds": [0, 1]}],
        "reward": {"node": "B"},
    }


def test_a_minimal_spec_gets_defaults():
    spec = parse_spec(_chain_spec())
    assert spec.policy.name == "mcbo" and spec.model.kernel == "matern52"
    assert spec.design_rounds == 2 * (1 + 1)  # a random start scaled to the number of actions
    assert spec.topological_order() == ["A", "B"]
    assert spec.allowed_target_sets() == [("u",)]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: s["nodes"][1].update(parents=["Z"]), "nodes[1].parents: unknown node 'Z'"),
        (lambda s: s["nodes"][0].update(parents=["B"]), "nodes: the graph has a cycle"),
        (lambda s: s["nodes"].append(copy.deepcopy(s["nodes"][0])), "duplicate node name 'A'"),
        (lambda s: s["actions"][0].update(targets=["Q"]), "actions[0].targets: unknown node"),
        (lambda s: s["reward"].update(node="Q"), "reward.node: unknown node 'Q'"),
        (lambda s: s["nodes"][0].update(bounds=[2, 1]), "nodes[0].bounds"),
        (lambda s: s["nodes"][0].update(noise_std=-1), "nodes[0].noise_std"),
        (lambda s: s.update(target_sets=[["u"]]), "target_sets: only hard interventions"),
        (lambda s: s.update(candidates=[[0.5, 0.5]]), "candidates[0]: expected 1 values"),
        (lambda s: s.update(candidates=[[7.0]]), "candidates[0]: u=7.0 outside"),
        (lambda s: s.update(colour="red"), "colour: unknown key (known: schema, version, name"),
        (
            lambda s: s.update(schedule={"max_round": 3}),
            "schedule.max_round: unknown key (did you mean 'max_rounds'?)",
        ),
        (
            lambda s: s["nodes"][1].update(parnts=["A"]),
            "nodes[1].parnts: unknown key (did you mean 'parents'?)",
        ),
        (
            lambda s: s.update(intervention="sofft"),
            "intervention: 'sofft' is not one of 'soft', 'hard' (did you mean 'soft'?)",
        ),
        (
            lambda s: s["reward"].update(node="b"),
            "reward.node: unknown node 'b' (known: A, B)",
        ),
        (
            lambda s: s.update(schedule={"pipeline": 0}),
            "schedule.pipeline: must be at least 1, got 0",
        ),
        (
            lambda s: s.update(actions=[]),
            "actions: declare at least one action (or a `parameters` vector)",
        ),
        (lambda s: s.pop("reward"), "reward: required, but missing"),
        (
            lambda s: (
                s["model"].update(kernel="cosine")
                if "model" in s
                else s.update(model={"kernel": "cosine"})
            ),
            "model.kernel",
        ),
        (lambda s: s.update(intervention="hard"), "target_sets: hard interventions need"),
    ],
)
def test_errors_name_the_offending_field(mutate, expected):
    data = _chain_spec()
    mutate(data)
    with pytest.raises(SpecError) as raised:
        parse_spec(data, "test.yaml")
    assert any(expected in problem for problem in raised.value.problems), raised.value.problems


@pytest.mark.parametrize(
    ("design", "max_rounds", "expected"),
    [({}, None, 4), ({}, 9, 3), ({}, 2, 1), ({"rounds": 0}, None, 0), ({"rounds": 7}, 3, 7)],
)
def test_the_initial_design_defaults_to_a_few_rounds_scaled_to_the_actions(
    design, max_rounds, expected
):
    spec = parse_spec(
        {**_chain_spec(), "initial_design": design, "schedule": {"max_rounds": max_rounds}}
    )
    assert spec.design_rounds == expected


@settings(max_examples=60, deadline=None)
@given(
    num_nodes=st.integers(1, 7),
    edges=st.sets(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=15),
    flip=st.booleans(),
)
def test_random_dags_validate_and_back_edges_are_cycles(num_nodes, edges, flip):
    names = [f"N{i}" for i in range(num_nodes)]
    forward = {(a, b) for a, b in edges if a < b < num_nodes}
    data = {
        "name": "random",
        "intervention": "soft",
        "nodes": [
            {
                "name": n,
                "parents": [names[a] for a, b in sorted(forward) if b == i],
                "bounds": [0, 1],
            }
            for i, n in enumerate(names)
        ],
        "actions": [{"name": "u", "targets": [names[0]], "bounds": [0, 1]}],
        "reward": {"node": names[-1]},
    }
    spec = parse_spec(data)
    order = spec.topological_order()
    assert all(order.index(names[a]) < order.index(names[b]) for a, b in forward)
    if flip and forward:
        a, b = sorted(forward)[0]
        data["nodes"][a]["parents"].append(names[b])
        with pytest.raises(SpecError, match="cycle"):
            parse_spec(data)


def test_yaml_syntax_errors_give_line_and_column(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\n  nodes: [\n")
    with pytest.raises(SpecError, match=r"line \d+, column \d+"):
        load_spec(path)


def test_validate_command_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({**_chain_spec(), "policy": {"name": "random"}}))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**_chain_spec(), "reward": {"node": "nope"}}))
    assert main(["validate", str(good)]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["validate", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: reward.node: unknown node 'nope'" in out


def test_validate_checks_policy_settings(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(
        yaml.safe_dump(
            {**_chain_spec(), "policy": {"name": "random", "settings": {"max_drawz": 3}}}
        )
    )
    assert main(["validate", str(path)]) == 1
    assert "policy.settings.max_drawz" in capsys.readouterr().out


@pytest.mark.parametrize("name", environment_names())
def test_example_costs_are_the_environments_to_the_last_bit(name: str) -> None:
    """A policy fills a budget to its edge under the spec's costs; a spec that rounds them (the
    SIR shares once had 6 digits) makes the device's true cost overshoot the cap by ~1e-7."""
    env = make_environment(name)
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    for action in env.actions:
        declared = spec.action(action.name)
        assert (declared.cost, declared.cost_per_unit) == (action.cost, action.cost_per_unit)
