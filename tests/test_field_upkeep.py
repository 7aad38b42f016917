"""A field model's fits stay out of the decision (issue 15): the service builds the model at
the first reading and its background refits fit it (`NetworkModel.prepare_fields`); a fit a
decision still has to run is kept out of its wall-clock cap; and the model-based regret
estimate samples fitted fields without ever fitting one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agent.experiment import Experiment
from agent.regret import regret_bound
from connectors.store import Store
from core.gp.field import FieldRefitJob
from core.network import NetworkModel
from core.spec import parse_spec
from core.threads import this_thread_only
from policies.base import Constraints
from policies.registry import make_policy

SPEC = {
    "name": "tiny-field",
    "intervention": "soft",
    "nodes": [
        {"name": "f", "shape": [3], "bounds": [-2.0, 2.0]},
        {"name": "y", "parents": ["f"], "bounds": [-5.0, 5.0], "noise_std": 0.05},
    ],
    "actions": [
        {"name": "a", "targets": ["f"], "bounds": [0.0, 1.0]},
        {"name": "b", "targets": ["y"], "bounds": [0.0, 1.0]},
    ],
    "reward": {"node": "y"},
}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread, as the service's fits and decisions run (`core.threads`): the
    default count on 2 shared cores made each small matmul of a fit wait (measured 50x)."""
    with this_thread_only(1):
        yield


# a short search: the decision's own work is a fraction of a second
QUICK = {"mc_samples": 4, "rescore_samples": 8, "raw_samples": 16, "restarts": 1, "steps": 5}


def field_at(a: float) -> np.ndarray:
    return np.array([math.sin(3 * a), math.cos(2 * a), a * a - 0.5])


def teach(model: NetworkModel, rounds: int, seed: int = 3) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        a, b = rng.uniform(size=2)
        field = field_at(a)
        model.learn({"a": a, "b": b}, {"f": field, "y": float(field.sum() - (b - 0.3) ** 2)})


def test_prepared_field_models_are_built_at_the_first_reading_and_fitted_beside_the_decision():
    model = NetworkModel(parse_spec(SPEC), deferred_refits=True)
    model.prepare_fields("hogp", 2)
    assert model.fields == {} and model.refit_jobs().keys() <= {"nodes"}
    teach(model, 6)
    assert model.fields["f"].n == 6 and model.fields["f"].fit_steps == 2
    jobs = model.refit_jobs()
    job = jobs["field:f"]  # the first fit is handed out, as a node GP's refit
    assert isinstance(job, FieldRefitJob) and len(job.x) == 6
    assert "field:f" not in model.refit_jobs()  # once, until installed
    model.install("field:f", job.run())
    policy = make_policy("mcbo", model.spec, QUICK)
    proposal = policy.propose(model, Constraints(), torch.Generator().manual_seed(0))
    assert proposal.diagnostics["fields_refitted"] == []  # the decision fitted nothing
    assert proposal.diagnostics["field_fit_seconds"] == 0.0


def test_an_unprepared_model_fits_in_the_decision_and_the_fit_is_kept_out_of_the_cap():
    model = NetworkModel(parse_spec(SPEC))
    teach(model, 8)
    model.field_model("f", "hogp", 5)  # never fitted: the decision has to fit it
    cap = 3.0
    policy = make_policy("mcbo", model.spec, {**QUICK, "max_seconds": cap})
    proposal = policy.propose(model, Constraints(), torch.Generator().manual_seed(0))
    info = proposal.diagnostics
    assert info["fields_refitted"] == ["f"] and info["field_fit_seconds"] > 0.0
    # the cap in force is the setting plus the fit: the search kept its whole cap
    assert info["cap_seconds"] == pytest.approx(cap + info["field_fit_seconds"], abs=1e-9)
    assert not info["timed_out"] and info["seconds"] >= info["field_fit_seconds"]
    again = policy.propose(model, Constraints(), torch.Generator().manual_seed(1))
    assert again.diagnostics["fields_refitted"] == []  # fitted: nothing more to keep out
    assert again.diagnostics["cap_seconds"] == pytest.approx(cap, abs=1e-9)


def test_the_service_prepares_field_models_with_the_policys_kind():
    with Store(":memory:") as store:
        exp = Experiment(parse_spec(SPEC), store, background_refits=True)
        assert exp.model.field_settings == ("hogp", 50)
        plain = Experiment(parse_spec({**SPEC, "name": "plain"}), store)
        assert plain.model.field_settings is None  # fitted by the policy, as before


def test_the_regret_estimate_samples_a_fitted_field_and_never_fits_one():
    model = NetworkModel(parse_spec(SPEC), deferred_refits=True)
    model.prepare_fields("hogp", 2)
    teach(model, 6)
    chosen = {"a": 0.4, "b": 0.3}
    # the field's first fit is not in yet: no estimate this round, and no fit done for one
    assert regret_bound(model, chosen, torch.Generator().manual_seed(0)) is None
    assert model.fields["f"].gp is None
    model.install("field:f", model.refit_jobs()["field:f"].run())
    bound = regret_bound(model, chosen, torch.Generator().manual_seed(0))
    assert bound is not None
    ucb_best, lcb_chosen = bound
    assert math.isfinite(ucb_best) and math.isfinite(lcb_chosen) and ucb_best > lcb_chosen
    assert model.fields["f"].fits == 1  # the estimate fitted nothing


def test_the_regret_estimate_through_sampled_fields_covers_the_true_reward():
    """Well taught, the estimate's interval at an action holds the true E[y | a]."""
    model = NetworkModel(parse_spec(SPEC))
    teach(model, 20)
    model.field_model("f", "hogp", 10).refit()
    for a, b in [(0.2, 0.3), (0.7, 0.9)]:
        field = field_at(a)
        truth = float(field.sum() - (b - 0.3) ** 2)
        bound = regret_bound(model, {"a": a, "b": b}, torch.Generator().manual_seed(1))
        assert bound is not None
        ucb_best, lcb_chosen = bound
        assert lcb_chosen <= truth + 0.05 and ucb_best >= truth - 0.05
