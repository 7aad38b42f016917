"""hagpucb's `visited_states` (issue 13): phase 0 plays θ in the box until the devices' traces
hold that many states, then phase 1's surrogate Hessian draws its states from them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.network import NetworkModel
from policies.base import Constraints
from policies.registry import make_policy
from tests.test_surrogate_hessian import _states, _swimmer_spec


def _policy(settings: dict):
    spec = _swimmer_spec(settings)
    return spec, make_policy("hagpucb", spec, settings)


def test_phase_zero_waits_for_the_visited_states_then_the_hessian_uses_them(tmp_path):
    settings = {
        "controller": "mamujoco-swimmer",
        "visited_states": 8,
        "candidates": 16,
        "sweeps": 1,
    }
    spec, policy = _policy(settings)
    assert policy.states_shape() == (2, 6)
    model, rng = NetworkModel(spec), torch.Generator().manual_seed(0)
    first, second = _states(5, 2, 6, seed=3).numpy(), _states(5, 2, 6, seed=4).numpy()
    waiting = policy.propose(model, Constraints.from_spec(spec), rng)
    assert waiting.diagnostics == {"phase": 0, "visited_states": 0, "waiting_for": 8}
    theta = np.array(list(waiting.intervention.values()))
    assert theta.shape == (14,) and (np.abs(theta) <= 1.0).all()  # the spec's box [-1, 1]
    policy.observe_states(0, first)
    again = policy.propose(model, Constraints.from_spec(spec), rng)
    assert again.diagnostics["phase"] == 0 and again.diagnostics["visited_states"] == 5
    assert again.intervention != waiting.intervention
    policy.observe_states(1, second)
    learned = policy.propose(model, Constraints.from_spec(spec), rng)
    assert learned.diagnostics["phase"] == 2 and learned.diagnostics["states_from"] == "visited"

    # the same states handed over as a file give the same Hessian queries, so the same edges
    np.save(tmp_path / "s.npy", np.concatenate([first, second]))
    _, from_file = _policy(
        {"controller": "mamujoco-swimmer", "states_file": str(tmp_path / "s.npy")}
    )
    from_file._learn_surrogate_structure()  # phase 1 alone: the decision after it is not needed
    assert policy.structure == from_file.structure


def test_without_visited_states_the_policy_takes_none():
    assert _policy({"controller": "mamujoco-swimmer"})[1].states_shape() is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"visited_states": 10}, "policy.settings.visited_states: needs a controller"),
        (
            {"controller": "mamujoco-swimmer", "visited_states": 10, "states_file": "s.npy"},
            "visited_states and states_file both name",
        ),
    ],
)
def test_visited_states_mistakes_are_one_plain_error(settings, message):
    with pytest.raises(ValueError, match="hagpucb: ") as error:
        _policy(settings)
    assert message in str(error.value)
