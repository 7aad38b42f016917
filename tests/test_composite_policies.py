"""Array nodes through the network model and the composite policies (paper 002)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from rich.console import Console

from agent.demo import DemoOptions, run_demo
from connectors.store import Store
from core.network import NetworkModel
from core.spec import load_spec
from policies.base import Constraints
from policies.registry import make_policy
from sim.registry import make_environment

FAST = {
    "mc_samples": 8,
    "fit_steps": 3,
    "raw_samples": 16,
    "restarts": 1,
    "maxiter": 10,
    "max_seconds": 5,
}


def taught_model(rounds: int = 6) -> tuple[NetworkModel, object]:
    spec = load_spec("examples/environmental.yaml")
    env = make_environment("environmental")
    model = NetworkModel(spec)
    for action in env.initial_design(seed=1)[:rounds] + env.initial_design(seed=2)[: rounds - 5]:
        readings = env.step(action)
        del readings["score"]  # the model composes g(field) itself
        model.learn(action, readings)
    return model, env


def test_the_model_composes_the_reward_from_the_field_and_checks_its_shape() -> None:
    model, env = taught_model()
    assert model.order == [] and model.reported == ["field"]
    for record in model.history:
        expected = env.expected_reward(record.intervention)
        assert record.readings["score"] == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="shape"):
        model.learn(model.history[0].intervention, {"field": np.zeros((4, 3))})
    with pytest.raises(ValueError, match="non-finite"):
        model.learn(model.history[0].intervention, {"field": np.full((3, 4), np.nan)})


def test_a_field_model_learns_by_root_extension_equal_to_a_rebuild() -> None:
    model, _ = taught_model()
    field = model.field_model("field", "hogp", fit_steps=2)
    model.refresh_field("field")
    env = make_environment("environmental")
    extra = env.initial_design(seed=7)[:3]
    for action in extra:
        model.learn(action, {"field": env.step(action)["field"]})
    assert field.n == 9 and field.since_fit == 3
    grown = field.gp
    assert grown is not None
    rebuilt = type(grown)(grown.kernel, grown.factors, grown.noise, grown.x, grown.y)
    torch.testing.assert_close(grown.root, rebuilt.root, rtol=0, atol=1e-8)
    x = field.normalize(torch.tensor([[10.0, 0.07, 1.5, 30.15]], dtype=torch.float64))
    torch.testing.assert_close(
        grown.posterior_mean(x), rebuilt.posterior_mean(x), atol=1e-8, rtol=0
    )


@pytest.mark.parametrize("name", ["eicf", "ucbcf", "eimetric", "random"])
def test_each_array_policy_proposes_an_admissible_intervention(name: str) -> None:
    model, env = taught_model()
    settings = FAST if name in ("eicf", "ucbcf") else {}
    policy = make_policy(name, model.spec, settings)
    proposal = policy.propose(
        model, Constraints.from_spec(model.spec), torch.Generator().manual_seed(0)
    )
    env.validate(proposal.intervention)  # inside the bounds
    assert np.isfinite(proposal.acquisition_value) or name == "random"


def test_policies_without_arrays_refuse_an_array_spec() -> None:
    spec = load_spec("examples/environmental.yaml")
    for name in ("mcbo", "eifn", "dgpucb"):
        with pytest.raises(ValueError, match="function of arrays"):
            make_policy(name, spec, {})


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize(
    ("env_name", "shape", "rtol"),
    [
        ("environmental", (3, 4), 1e-12),
        ("brusselator", (2, 64, 64), 1e-6),  # 8,192 elements: float32 on the wire
    ],
)
def test_eicf_runs_a_field_environment_through_the_service_on_the_embedded_broker(
    tmp_path, env_name, shape, rtol
):
    rounds = 7  # 5 random rounds, then EI-CF on the HOGP
    options = DemoOptions(env=env_name, rounds=rounds, live=False, out=tmp_path, metrics_port=0)
    result = asyncio.run(run_demo(options, Console(width=120, record=True)))
    assert result.rounds == rounds
    with Store(tmp_path / "demo.sqlite") as store:
        (name,) = store.experiment_names()
        assert {r.status for r in store.rounds(name)} == {"closed"}
        fields = [r for r in store.readings(name) if r.node == "field"]
        assert len(fields) == rounds and all(r.array().shape == shape for r in fields)
        env = make_environment(env_name)
        for row, stored in zip(fields, store.rounds(name), strict=True):
            assert np.allclose(row.array(), env.step(stored.intervention)["field"], rtol=rtol)


def array_reading(exp, round_: int, node: str, array, seq: int):
    from connectors.arrays import ArrayPayload
    from connectors.schemas import Reading

    payload = None if array is None else ArrayPayload.from_numpy(np.asarray(array), "float64")
    value = 1.0 if array is None else None
    fields = {"experiment": exp.name, "round": round_, "node": node, "seq": seq}
    return Reading(**fields, value=value, device_id="sim-environmental", at=0.0, array=payload)


def test_the_join_stores_a_good_array_and_rejects_bad_ones_with_a_reason() -> None:
    from agent.experiment import Experiment
    from tests.test_agent_join import Clock, ack

    spec = load_spec("examples/environmental.yaml")
    random = spec.policy.model_copy(update={"name": "random", "settings": {}})
    spec = spec.model_copy(update={"policy": random})
    store = Store(":memory:")
    exp = Experiment(spec, store, seed=0, clock=Clock())
    live = exp.propose()
    exp.mark_published(live.number)
    exp.on_ack(ack(exp, live.number))
    field = make_environment("environmental").step(live.intervention)["field"]
    bad = [
        (np.zeros((4, 3)), "wrong_shape"),
        (None, "not_an_array"),
        (np.full((3, 4), 1e9), "out_of_range"),
    ]
    verdicts = exp.on_readings(
        [array_reading(exp, live.number, "field", a, seq) for seq, (a, _) in enumerate(bad)]
    )
    assert [(v.outcome, v.reason) for v in verdicts] == [("rejected", why) for _, why in bad]
    (unexpected,) = exp.on_readings([array_reading(exp, live.number, "score", field, 9)])
    assert (unexpected.outcome, unexpected.reason) == ("rejected", "unexpected_array")
    (good,) = exp.on_readings([array_reading(exp, live.number, "field", field, 10)])
    assert good.outcome == "accepted"
    (row,) = store.readings(exp.name)
    assert np.array_equal(row.array(), field) and row.value == pytest.approx(field.mean())
    record = exp.model.history[live.model_round]
    assert record.readings["score"] == pytest.approx(
        make_environment("environmental").expected_reward(live.intervention)
    )
    assert live.status.value == "closed"  # the field was every reported node


def test_a_field_refit_runs_beside_the_model_and_installs_with_the_rows_that_came_meanwhile():
    model, env = taught_model()
    field = model.field_model("field", "hogp", fit_steps=2)
    model.refresh_field("field")  # the first fit, synchronous: nothing to sample without it
    extra = env.initial_design(seed=11)
    for action in extra:  # 5 more: the schedule (refit_every 5) makes a refit due
        model.learn(action, {"field": env.step(action)["field"]})
    jobs = model.refit_jobs()
    assert list(jobs) == ["field:field"] and model.refit_jobs() == {}  # one job at a time
    late = env.initial_design(seed=12)[0]
    model.learn(late, {"field": env.step(late)["field"]})  # arrives while the job runs
    assert not model.refresh_field("field")  # the policy does not fit again meanwhile
    result = jobs["field:field"].run()
    model.install("field:field", result)
    assert result.n == 11 and field.n == 12 and field.since_fit == 1 and not field.job_out
    # the installed model is the exact GP of all 12 rows with the fitted hyperparameters
    gp = field.gp
    rebuilt = type(gp)(gp.kernel, gp.factors, gp.noise, gp.x, gp.y)
    x = field.normalize(torch.tensor([[9.0, 0.05, 2.0, 30.2]], dtype=torch.float64))
    torch.testing.assert_close(gp.posterior_mean(x), rebuilt.posterior_mean(x), atol=1e-8, rtol=0)
    assert gp.n == 12


def test_a_restart_replays_array_readings_into_the_model(tmp_path) -> None:
    from agent.experiment import Experiment
    from tests.test_agent_join import Clock, ack

    spec = load_spec("examples/environmental.yaml")
    random = spec.policy.model_copy(update={"name": "random", "settings": {}})
    spec = spec.model_copy(update={"policy": random})
    env = make_environment("environmental")
    with Store(tmp_path / "s.sqlite") as store:
        before = Experiment(spec, store, seed=0, clock=Clock())
        for seq in range(3):
            live = before.propose()
            before.mark_published(live.number)
            before.on_ack(ack(before, live.number))
            field = env.step(live.intervention)["field"]
            before.on_readings([array_reading(before, live.number, "field", field, seq)])
        after = Experiment(spec, store, seed=0, clock=Clock())
    for old, new in zip(before.model.history, after.model.history, strict=True):
        assert new.readings["score"] == old.readings["score"]
        torch.testing.assert_close(new.arrays["field"], old.arrays["field"], rtol=0, atol=0)
