"""MCBO's η-net training stops on a plateau of its acquisition estimate (issue 17, psa17b)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from core.threads import this_thread_only
from policies._search import plain_scorer
from policies.base import Constraints
from policies.mcbo import MCBOSettings, _Plateau
from policies.registry import make_policy
from tests.test_policies_helpers import chain_spec, trained_model

DRAWS = 64
SPREAD = 0.8  # per-draw std of the reward: standard error 0.8/√64 = 0.1, tolerance 0.1·0.1


def _plateau(means: list[float], **settings) -> _Plateau:
    """A rule whose k-th check sees restarts with these best means (per-draw std SPREAD)."""
    noise = torch.randn(DRAWS, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    noise = SPREAD * (noise - noise.mean()) / noise.std()
    calls = iter(means)

    def draws(region, values, nets, eps):
        best = next(calls)
        # (S, R): restart 0 is the best, restart 1 trails it by a unit
        return torch.stack([best + noise, best - 1.0 + noise], dim=1)

    problem = SimpleNamespace(
        settings=MCBOSettings(stop_samples=DRAWS, **settings),
        fields=None,
        column={"X0": 0, "Y": 1},
        _network_draws=draws,
    )
    values = torch.zeros(2, 1, dtype=torch.float64)
    return _Plateau(problem, None, plain_scorer, None, lambda: values, seed=0)


def test_the_rule_stops_on_a_plateau_and_not_before():
    # rises of 1, 0.5, 0.25, 0.02 (all above 0.1 standard errors = 0.01), then 0.005
    means = [0.0, 1.0, 1.5, 1.75, 1.77, 1.775, 1.776]
    rule = _plateau(means)
    verdicts = [rule.reached() for _ in range(6)]
    assert verdicts == [False, False, False, False, False, True]
    assert rule.checks == 6 and rule.record == pytest.approx(1.77)


def test_patience_counts_checks_in_a_row_and_a_rise_resets_it():
    # stale, then a rise (resets), then stale twice: patience 2 stops at the second of those
    means = [0.0, 0.001, 0.5, 0.502, 0.503, 0.504]
    rule = _plateau(means, stop_patience=2)
    assert [rule.reached() for _ in range(5)] == [False, False, False, False, True]


def test_the_tolerance_is_in_standard_errors():
    # a rise of 0.05 is half a standard error: enough at stop_tol 0.1, not at 1
    loose, strict = _plateau([0.0, 0.05], stop_tol=1.0), _plateau([0.0, 0.05], stop_tol=0.1)
    assert [loose.reached(), loose.reached()] == [False, True]
    assert [strict.reached(), strict.reached()] == [False, False]


def test_patience_zero_is_the_fixed_step_count():
    rule = _plateau([], stop_patience=0)
    assert not any(rule.due(step) for step in range(64))


# ------------------------------------------------------------------ the whole proposal
def _propose(settings: dict) -> object:
    # X0 -> X1 -> X2 -> X3 -> Y, noisy: in every target set a hallucinated node has a noisy
    # parent, so every region trains η nets
    target_sets = [[], ["a0"], ["a1"], ["a0", "a1"]]
    spec = chain_spec(intervention="hard", nodes=5, noise=0.1, target_sets=target_sets)
    model = trained_model(spec, 12)
    base = {"nn_restarts": 8, "region_threads": 1, "max_seconds": 600.0}
    policy = make_policy("mcbo", spec, {**base, **settings})
    constraints = Constraints.from_spec(spec, 0.0)
    # one torch thread: at these sizes a pool of two only waits on a busy machine
    with this_thread_only(1):
        return policy.propose(model, constraints, torch.Generator().manual_seed(1))


def test_a_stopped_search_proposes_what_the_full_one_does():
    """On a small noisy chain the rule stops every region's training well before `steps` (64),
    and the proposal is the full search's: the same target set, its action value to 0.1 of its
    [0, 1] span (the acquisition is flat near its top: seen 0.959 against 0.911, acquisitions
    0.979 and 0.983) and the acquisition within its rescoring's Monte-Carlo noise (different
    draws: the rescoring's come after the training's)."""
    full = _propose({"stop_patience": 0})
    fast = _propose({})
    assert full.diagnostics["eta"] == fast.diagnostics["eta"] == "network"
    assert full.diagnostics["steps"] == 64
    assert fast.diagnostics["steps"] < 64 and fast.diagnostics["steps"] % 8 == 0
    assert fast.diagnostics["plateau_checks"] >= 2
    assert fast.target_set == full.target_set
    for name, value in full.intervention.items():
        assert fast.intervention[name] == pytest.approx(value, abs=0.1)
    assert fast.acquisition_value == pytest.approx(full.acquisition_value, abs=0.02)
    assert math.isfinite(fast.acquisition_value)
