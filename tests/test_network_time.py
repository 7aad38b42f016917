"""A time-aware network model (`model.time_scale`) and the spec's drift settings, as `cbo-agent
validate` checks them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from agent.cli import main
from core.gp.temporal import TemporalGP
from core.network import NetworkModel
from core.spec import SpecError, parse_spec
from policies.base import Constraints
from policies.registry import make_policy
from tests.test_policies_helpers import FAST


def _spec(**model) -> dict:
    """A -> B, one soft action feeding B."""
    return {
        "name": "timed",
        "intervention": "soft",
        "nodes": [
            {"name": "A", "bounds": [0, 1], "noise_std": 0.1},
            {"name": "B", "parents": ["A"], "bounds": [-2, 2], "noise_std": 0.1},
        ],
        "actions": [{"name": "u", "targets": ["B"], "bounds": [-1, 1]}],
        "reward": {"node": "B"},
        "model": {"refit_every": None, "misfit_z": None, **model},
    }


def _teach(model: NetworkModel, rounds: int, gen: torch.Generator) -> None:
    """B = A + u early, B = A + u + 1 from round rounds // 2 on: a system that changed."""
    for t in range(rounds):
        a, u = torch.rand(2, generator=gen, dtype=torch.float64).tolist()
        model.learn({"u": 2 * u - 1}, {"A": a, "B": a + 2 * u - 1 + (t >= rounds // 2)})


def test_each_node_gp_takes_the_round_as_one_more_input():
    model = NetworkModel(parse_spec(_spec(time_scale=50.0)))
    assert model.timed and model.gp.dims.tolist() == [1, 3]  # A: round; B: A, u, round
    _teach(model, 6, torch.Generator().manual_seed(0))
    rows, _ = model.gp.member_data(model.member["B"])
    assert (rows[:, 2] * 50.0).tolist() == pytest.approx([0, 1, 2, 3, 4, 5])  # unit cube
    assert model.now == 6
    stationary = NetworkModel(parse_spec(_spec()))
    assert not stationary.timed and stationary.gp.dims.tolist() == [0, 2]


def test_the_posterior_is_the_temporal_gp_at_the_present_round():
    spec = parse_spec(_spec(time_scale=50.0))
    model = NetworkModel(spec)
    gen = torch.Generator().manual_seed(1)
    _teach(model, 12, gen)
    config = dataclasses.replace(model.gp.config, noise_variance=0.1**2)
    reference = TemporalGP([[0, 1], [-1, 1]], config, time_scale=50.0)
    x, y = [], []
    for record in model.history:
        x.append([record.readings["A"], record.intervention["u"]])
        y.append(record.readings["B"])
    for t, (row, value) in enumerate(zip(x, y, strict=True)):
        reference.learn_one([row], [value], t)
    query = torch.tensor([[0.5, 0.2], [0.1, -0.7]], dtype=torch.float64)
    mean, std = model.node_posterior("B", query)
    expected = reference.posterior(query[None], 12)  # same rows, one GP: same to rounding
    assert mean.tolist() == pytest.approx(expected.mean[0].tolist(), rel=1e-6)
    assert std.square().tolist() == pytest.approx(expected.variance[0].tolist(), rel=1e-6)


def test_a_time_aware_model_follows_the_system_after_it_changed():
    means = {}
    for timed in (False, True):
        model = NetworkModel(parse_spec(_spec(**({"time_scale": 5.0} if timed else {}))))
        _teach(model, 40, torch.Generator().manual_seed(2))
        model.gp.refit()
        query = torch.tensor([[0.5, 0.0]], dtype=torch.float64)
        means[timed] = float(model.node_posterior("B", query)[0])
    # now B(0.5, 0) = 1.5; the stationary model averages the two halves (≈ 1.0)
    assert abs(means[True] - 1.5) < 0.2 < abs(means[False] - 1.5)


def test_the_flat_model_and_pending_points_carry_the_round():
    model = NetworkModel(parse_spec(_spec(time_scale=50.0)))
    _teach(model, 4, torch.Generator().manual_seed(3))
    flat = model.flat_model()
    assert model.flat_dim == 2 and flat.dim == 2
    assert (flat.member_data(0)[0][:, 1] * 50.0).tolist() == pytest.approx([0, 1, 2, 3])
    encoded = model.flat_encode(torch.tensor([[0.25]], dtype=torch.float64))
    assert encoded.tolist() == [[0.25, 4.0]]  # at the round to propose
    live = model.start_round({"u": 0.25})
    rows = int(model.gp.num_rows[1])
    handle = model.add_pending({"u": 0.25}, live)
    assert int(model.gp.num_rows[1]) == rows + 1
    model.drop_pending(handle)


@pytest.mark.parametrize("name", ["mcbo", "gpucb", "eifn"])
def test_time_aware_policies_propose(name):
    spec = parse_spec({**_spec(time_scale=20.0), "policy": {"name": name}})
    model = NetworkModel(spec)
    _teach(model, 6, torch.Generator().manual_seed(4))
    policy = make_policy(name, spec, FAST[name])
    proposal = policy.propose(model, Constraints.from_spec(spec), torch.Generator().manual_seed(0))
    assert -1.0 <= proposal.intervention["u"] <= 1.0


def test_the_spec_refuses_a_time_aware_model_with_an_information_budget():
    with pytest.raises(SpecError) as raised:
        parse_spec(_spec(time_scale=10.0, capacity=50))
    assert any("model.time_scale and model.capacity" in p for p in raised.value.problems)
    with pytest.raises(SpecError) as raised:
        parse_spec(_spec(time_scale=0.0))
    assert any("model.time_scale" in p for p in raised.value.problems)
    with pytest.raises(SpecError) as raised:
        parse_spec(_spec(change={"threshold": 30, "keeep": 4}))
    assert any("model.change.keeep" in p for p in raised.value.problems)


def test_validate_names_a_policy_that_would_ignore_the_setting(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(
        yaml.safe_dump({**_spec(time_scale=100.0, change={}), "policy": {"name": "mcbo"}})
    )
    assert main(["validate", str(good)]) == 0
    assert "ok" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    spec = {
        **_spec(time_scale=100.0),
        "actions": [{"name": "u", "targets": ["B"], "bounds": [-1, 1]}],
        "policy": {"name": "cmaes"},
    }
    bad.write_text(yaml.safe_dump(spec))
    assert main(["validate", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: model.time_scale: cmaes decides on a model of its own" in out


def test_with_a_period_each_node_gp_takes_the_rounds_point_on_the_circle():
    """`model.period`: (round, cos, sin) after a node's inputs, and the posterior is the
    periodic TemporalGP's at the present round, to rounding."""
    spec = parse_spec(_spec(time_scale=50.0, period=4.0))
    model = NetworkModel(spec)
    assert model.time_width == 3 and model.gp.dims.tolist() == [3, 5]  # A: t, cos, sin
    gen = torch.Generator().manual_seed(5)
    _teach(model, 10, gen)
    rows, _ = model.gp.member_data(model.member["B"])
    cos = (2.0 * rows[:, 3] - 1.0).tolist()  # declared on (-1, 1)
    assert cos == pytest.approx([1, 0, -1, 0] * 2 + [1, 0], abs=1e-12)
    config = dataclasses.replace(model.gp.config, noise_variance=0.1**2)
    reference = TemporalGP([[0, 1], [-1, 1]], config, time_scale=50.0, period=4.0)
    for t, record in enumerate(model.history):
        row = [record.readings["A"], record.intervention["u"]]
        reference.learn_one([row], [record.readings["B"]], t)
    query = torch.tensor([[0.5, 0.2], [0.1, -0.7]], dtype=torch.float64)
    mean, std = model.node_posterior("B", query)
    expected = reference.posterior(query[None], 10)
    assert mean.tolist() == pytest.approx(expected.mean[0].tolist(), rel=1e-6)
    assert std.square().tolist() == pytest.approx(expected.variance[0].tolist(), rel=1e-6)
    flat = model.flat_model()
    assert model.flat_dim == 4 and flat.dim == 4
    encoded = model.flat_encode(torch.tensor([[0.25]], dtype=torch.float64))
    assert encoded[0].tolist() == pytest.approx([0.25, 10.0, -1.0, 0.0], abs=1e-12)


def test_the_spec_refuses_a_period_without_a_time_scale():
    with pytest.raises(SpecError) as raised:
        parse_spec(_spec(period=52.0))
    assert any("model.period needs a model.time_scale" in p for p in raised.value.problems)
    with pytest.raises(SpecError) as raised:
        parse_spec(_spec(time_scale=52.0, period=-1.0))
    assert any("model.period" in p for p in raised.value.problems)
