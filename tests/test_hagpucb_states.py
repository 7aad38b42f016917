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


def _reading(exp, round_: int, states: np.ndarray, seq: int):
    from connectors.arrays import ArrayPayload
    from connectors.schemas import Reading

    fields = {"experiment": exp.name, "round": round_, "node": "R", "seq": seq, "at": 0.0}
    payload = ArrayPayload.from_numpy(states)
    return Reading(**fields, value=1.0, device_id="dev", states=payload)


def _experiment(policy: dict):
    from agent.experiment import Experiment
    from connectors.store import Store
    from tests.test_agent_join import Clock, ack

    spec = _swimmer_spec(policy.get("settings", {}))
    spec = spec.model_copy(update={"policy": spec.policy.model_copy(update=policy)})
    store = Store(":memory:")
    exp = Experiment(spec, store, seed=0, clock=Clock())
    live = exp.propose()
    exp.mark_published(live.number)
    exp.on_ack(ack(exp, live.number))
    return exp, store, live


def test_the_join_stores_the_states_and_hands_them_to_the_policy_or_refuses_them():
    states = _states(7, 2, 6).numpy()
    exp, store, live = _experiment({"name": "random", "settings": {}})
    (verdict,) = exp.on_readings([_reading(exp, live.number, states, 0)])
    assert (verdict.outcome, verdict.reason) == ("rejected", "unexpected_states")
    assert store.readings(exp.name) == [] and store.visited_states(exp.name) == []

    settings = {"controller": "mamujoco-swimmer", "visited_states": 100}
    exp, store, live = _experiment({"name": "hagpucb", "settings": settings})
    (wrong,) = exp.on_readings([_reading(exp, live.number, _states(7, 3, 6).numpy(), 0)])
    assert (wrong.outcome, wrong.reason) == ("rejected", "wrong_shape")
    (good,) = exp.on_readings([_reading(exp, live.number, states, 1)])
    assert good.outcome == "accepted"
    (trace,) = store.visited_states(exp.name)
    assert trace.round == live.number and np.array_equal(trace.array(), states.astype(np.float32))
    assert exp.policy._visited_rows == 7 and live.status.value == "closed"
