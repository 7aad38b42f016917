"""An array node as a parent of scalar nodes (issue 15): the feature map, the child's rows, the
rollouts of MCBO, EI-FN and the composite policies through the field's sample paths (each
checked against a reference composed by hand from fixed samples), and the service."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch
from rich.console import Console

from agent.demo import DemoOptions, run_demo
from connectors.store import Store
from core.field_features import MAX_FIELD_FEATURES, FieldFeatures
from core.network import NetworkModel
from core.spec import parse_spec
from policies._optimize import Deadline
from policies.registry import make_policy

SPEC = {
    "name": "tiny-field",
    "intervention": "soft",
    "nodes": [
        {"name": "f", "shape": [3], "bounds": [-2.0, 2.0], "noise_std": 0.0},
        {"name": "y", "parents": ["f"], "bounds": [-5.0, 5.0], "noise_std": 0.05},
    ],
    "actions": [
        {"name": "a", "targets": ["f"], "bounds": [0.0, 1.0]},
        {"name": "b", "targets": ["y"], "bounds": [0.0, 1.0]},
    ],
    "reward": {"node": "y"},
}


def field_at(a: float) -> np.ndarray:
    return np.array([math.sin(3 * a), math.cos(2 * a), a * a - 0.5])


def child_at(field: np.ndarray, b: float) -> float:
    return float(field.sum() - (b - 0.3) ** 2)


def taught(spec_data: dict, rounds: int = 7) -> NetworkModel:
    model = NetworkModel(parse_spec(spec_data))
    rng = np.random.default_rng(3)
    for _ in range(rounds):
        a, b = rng.uniform(size=2)
        field = field_at(a)
        model.learn({"a": a, "b": b}, {"f": field, "y": child_at(field, b)})
    return model


def by_hand(model: NetworkModel, fields: torch.Tensor, b: torch.Tensor, eps: torch.Tensor):
    """y_s = μ([F_s, b]) + σ([F_s, b]) · eps_s, one GP input row stacked by hand per sample."""
    rows = torch.cat([fields, b.expand(fields.shape[0], 1)], dim=-1)  # (S, 3 + 1)
    mean, std = model.node_posterior("y", rows)
    return mean + std * eps


def test_the_feature_map_flattens_small_fields_and_pools_large_ones_by_hand() -> None:
    small = FieldFeatures((2, 2, 3))
    field = torch.arange(12.0, dtype=torch.float64).reshape(2, 2, 3)
    assert small.count == 12 and torch.equal(small(field), field.reshape(-1))
    big = FieldFeatures((2, 6, 6))  # 72 elements: each channel on a 2 x 2 grid of 3 x 3 blocks
    field = torch.randn(5, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = torch.stack(
        [
            field[:, c, 3 * i : 3 * i + 3, 3 * j : 3 * j + 3].mean((-1, -2))
            for c in range(2)
            for i in range(2)
            for j in range(2)
        ],
        dim=-1,
    )
    torch.testing.assert_close(big(field), expected)
    assert FieldFeatures((100,)).count == FieldFeatures((1, 64, 64)).count == MAX_FIELD_FEATURES
    assert FieldFeatures((2, 64, 64)).count == 8  # u and v kept apart: 2 x 2 x 2
    for shape in [(100,), (64, 64), (2, 64, 64), (32, 16, 16), (5, 7, 3)]:
        features = FieldFeatures(shape)
        assert features.count <= MAX_FIELD_FEATURES
        ones = torch.ones(shape, dtype=torch.float64)  # block means of a constant: the constant
        three = torch.full((features.count,), 3.0, dtype=torch.float64)
        torch.testing.assert_close(features(3.0 * ones), three)


def test_the_child_learns_from_the_reported_field_and_its_inputs_are_bounded_by_the_parent():
    model = taught(SPEC)
    assert model.inputs["y"].width == 4 and model.order == ["y"]
    bounds = model.node_input_bounds("y")
    assert bounds.tolist() == [[-2.0, 2.0]] * 3 + [[0.0, 1.0]]
    record = model.history[2]
    row = model.node_input_row("y", {**record.readings, **record.arrays}, record.intervention)
    expected = [*record.arrays["f"].tolist(), record.intervention["b"]]
    assert row == pytest.approx(expected, abs=0)
    z, y = model.gp.member_data(model.member["y"])  # unit-cube inputs: (x - low) / (high - low)
    assert len(y) == 7  # every round's row learned
    unit = [
        (v - low) / (high - low) for v, (low, high) in zip(expected, bounds.tolist(), strict=True)
    ]
    assert z[2].tolist() == pytest.approx(unit, abs=1e-12)
    # the child's posterior at a training row is close to its reading (noise 0.05)
    mean, _ = model.node_posterior("y", torch.tensor([expected], dtype=torch.float64))
    assert float(mean[0]) == pytest.approx(record.readings["y"], abs=0.1)


def test_a_mean_rollout_passes_the_posterior_mean_field_to_the_child():
    model = taught(SPEC)
    model.field_model("f", "hogp", fit_steps=5)
    model.refresh_field("f")
    actions = torch.tensor([[0.4, 0.7], [0.9, 0.1]], dtype=torch.float64)
    values = model.rollout(actions)
    field = model.fields["f"].posterior_mean(actions[:, :1])
    torch.testing.assert_close(values["f"], field)
    mean, _ = model.node_posterior("y", torch.cat([field, actions[:, 1:]], dim=-1))
    torch.testing.assert_close(values["y"], mean)


def test_eifn_samples_the_field_and_passes_each_path_on_as_by_hand():
    model = taught(SPEC)
    policy = make_policy("eifn", model.spec, {"mc_samples": 6})
    problem = policy.problem(model, seed=5, deadline=Deadline(30.0))
    actions = torch.tensor([[0.25, 0.6], [0.8, 0.2]], dtype=torch.float64)
    samples = problem.sample_rewards(actions, ())
    assert samples.shape == (6, 2)
    paths = problem.fields.paths["f"](actions[:, :1])  # (S, b, 3): the fixed sample paths
    assert paths.shape == (6, 2, 3) and float(paths.std(0).max()) > 0
    rho = model.known_noise_std("y")
    for i in range(2):
        eps = problem.epistemic[:, 0]
        expected = by_hand(model, paths[:, i], actions[i, 1:], eps)
        expected = expected + rho * problem.aleatoric[:, 0]
        torch.testing.assert_close(samples[:, i], expected)
    # the screening prefix: the first 3 paths with the first 3 base samples
    torch.testing.assert_close(problem.sample_rewards(actions, (), 3), samples[:3])
    # a wrong pairing (paths shifted by one sample) is not what the rollout computes
    shifted = by_hand(model, paths[:, 0].roll(1, 0), actions[0, 1:], problem.epistemic[:, 0])
    assert not torch.allclose(samples[:, 0], shifted + rho * problem.aleatoric[:, 0])


def test_mcbo_hallucinates_the_child_at_each_field_path_as_by_hand():
    model = taught(SPEC)
    settings = {"mc_samples": 4, "beta": 0.5, "rescore_samples": 8}
    policy = make_policy("mcbo", model.spec, settings)
    problem = policy.problem(model, seed=2, deadline=Deadline(30.0))
    assert policy.eta_mode(model) == "constant"  # the reward is the only hallucinated node
    actions = torch.tensor([[0.3, 0.5]], dtype=torch.float64)
    value = problem.optimistic_reward(actions, actions.new_zeros(1, 0), (), 0.5)
    paths = problem.fields.paths["f"](actions[:, :1])[:4, 0]  # (S, 3)
    assert problem.fields.count == 8  # enough paths for the rescoring chunks
    rows = torch.cat([paths, actions[:, 1:].expand(4, 1)], dim=-1)
    mean, std = model.node_posterior("y", rows)
    noise = model.known_noise_std("y") * problem.eps[:, 0]
    torch.testing.assert_close(value, (mean + 0.5 * std + noise).mean().reshape(1))


COMPOSITE = {
    **SPEC,
    "reward": {
        "node": "score",
        "components": ["f", "y"],
        "aggregation": "expression",
        "expression": "y - var(f)",
    },
}
COMPOSITE["nodes"] = [
    *SPEC["nodes"],
    {"name": "score", "parents": ["f", "y"], "bounds": [-10.0, 10.0]},
]


def test_composite_ei_passes_the_field_paths_to_a_scalar_component_as_by_hand():
    model = taught(COMPOSITE)
    assert model.order == ["y"] and model.field_reward is not None
    settings = {"mc_samples": 5, "fit_steps": 5}
    policy = make_policy("eicf", model.spec, settings)
    problem = policy.problem(model, seed=4, deadline=Deadline(30.0))
    actions = torch.tensor([[0.45, 0.35]], dtype=torch.float64)
    samples = problem.reward_samples(actions)
    paths = problem.fields.paths["f"](actions[:, :1])[:, 0]  # (S, 3)
    child = by_hand(model, paths, actions[0, 1:], problem.normals["y"][:, 0])
    expected = child - paths.var(-1, unbiased=False)
    torch.testing.assert_close(samples[:, 0], expected)


def test_a_field_parent_validates_and_what_cannot_work_is_one_line(tmp_path, capsys):
    import yaml

    from agent.cli import main

    path = tmp_path / "field-parent.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "policy": {"name": "mcbo"}}))
    assert main(["validate", str(path)]) == 0
    assert "ok (tiny-field" in capsys.readouterr().out
    for data, message in [
        ({**SPEC, "policy": {"name": "dgpucb"}}, "array nodes feed the scalar nodes ['y']"),
        ({**SPEC, "policy": {"name": "eicf"}}, "needs a spec with array nodes"),
    ]:
        path.write_text(yaml.safe_dump(data))
        assert main(["validate", str(path)]) == 1
        lines = [ln for ln in capsys.readouterr().out.splitlines() if message in ln]
        assert len(lines) == 1, message


@pytest.mark.slow
@pytest.mark.integration
def test_mcbo_learns_and_proposes_on_the_kiln_through_the_service_on_the_embedded_broker(
    tmp_path, capfd
):
    rounds = 7  # 5 random rounds, then MCBO through the field's sample paths
    options = DemoOptions(
        env="kiln", rounds=rounds, live=False, out=tmp_path, metrics_port=0, policy="mcbo"
    )
    console = Console(width=120, record=True)
    result = asyncio.run(run_demo(options, console))
    assert result.rounds == rounds and result.initial_rounds == 5
    captured = capfd.readouterr()
    text = console.export_text() + captured.out + captured.err
    for number in (5, 6):  # proposed by MCBO itself, not by the explorer it falls back on
        assert f"round {number} by mcbo" in text, text[-2000:]
    with Store(tmp_path / "demo.sqlite") as store:
        (name,) = store.experiment_names()
        rows = store.rounds(name)
        assert {r.status for r in rows} == {"closed"} and len(rows) == rounds
        fields = [r for r in store.readings(name) if r.node == "temps"]
        assert len(fields) == rounds and all(r.array().shape == (16,) for r in fields)
        quality = [r for r in store.readings(name) if r.node == "quality"]
        assert len(quality) == rounds
