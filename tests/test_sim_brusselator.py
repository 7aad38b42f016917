"""The Brusselator PDE environment on py-pde (paper 002's second composite problem)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from core.network import NetworkModel
from core.spec import load_spec
from policies.base import Constraints
from policies.registry import make_policy
from sim.brusselator import DT, SHAPE, _solve_at, solve_brusselator
from sim.registry import environment_names, make_environment

POINT = {"a": 1.0, "b": 3.0, "d0": 1.0, "d1": 0.1}


def weighted_variance(field: np.ndarray) -> float:
    """The authors' metric written out: rows and columns 0, 1, −2, −1 weigh 1, the rest 0.1."""
    weights = np.full(field.shape, 0.1)
    weights[:, [0, 1, -2, -1], :] = 1.0
    weights[:, :, [0, 1, -2, -1]] = 1.0
    return float((weights * field).var())


def test_a_reading_is_the_field_and_the_score_its_weighted_variance() -> None:
    env = make_environment("brusselator")
    assert "brusselator" in environment_names()
    readings = env.step(POINT)
    field = readings["field"]
    assert field.shape == SHAPE == (2, 64, 64) and np.isfinite(field).all()
    assert field.std() > 0.01  # the initial noise has not all decayed: not a constant field
    assert readings["score"] == pytest.approx(-weighted_variance(field), rel=1e-12)
    assert env.expected_reward(POINT) == readings["score"]


def test_a_solve_is_a_function_of_the_inputs() -> None:
    first = _solve_at(*POINT.values(), DT)
    again = _solve_at(*POINT.values(), DT)
    assert np.array_equal(first, again)
    other = _solve_at(1.0, 3.0, 1.0, 0.2, DT)
    assert not np.allclose(first, other)


def test_the_optimum_is_the_uniform_field_of_the_metric_minimum() -> None:
    env = make_environment("brusselator")
    optimum = env.optimum
    assert optimum.intervention["b"] == 0.1 and optimum.intervention["a"] == math.sqrt(0.1)
    # the uniform field (a, b/a): variance s²(k2/2 − k1²/4) − k2 b, s = a + b/a
    p = 1 - (60 / 64) ** 2
    k1, k2 = p + 0.1 * (1 - p), p + 0.01 * (1 - p)
    uniform = 4 * 0.1 * (k2 / 2 - k1**2 / 4) - k2 * 0.1
    assert -optimum.value == pytest.approx(uniform, rel=0.01)
    assert env.expected_reward(POINT) < optimum.value


@pytest.mark.slow
def test_where_the_fast_step_blows_up_the_authors_step_solves_it() -> None:
    stiff = (0.1, 5.0, 0.01, 0.01)  # small a, large b: relaxation oscillations
    assert not np.isfinite(_solve_at(*stiff, DT)).all()
    field = solve_brusselator(*stiff)
    assert np.isfinite(field).all() and not field.flags.writeable


@pytest.mark.slow
def test_eicf_proposes_within_the_bounds_from_a_brusselator_design() -> None:
    spec = load_spec("examples/brusselator.yaml")
    env = make_environment("brusselator")
    model = NetworkModel(spec)
    for action in env.initial_design(seed=3):
        readings = env.step(action)
        del readings["score"]  # the model composes g(field) itself
        model.learn(action, readings)
        assert model.history[-1].readings["score"] == pytest.approx(
            env.expected_reward(action), rel=1e-9
        )
    settings = {"mc_samples": 8, "fit_steps": 5, "raw_samples": 16, "restarts": 1}
    policy = make_policy("eicf", spec, settings)
    proposal = policy.propose(
        model, Constraints.from_spec(model.spec), torch.Generator().manual_seed(0)
    )
    for name, (low, high) in {a.name: a.bounds for a in spec.actions}.items():
        assert low <= proposal.intervention[name] <= high
