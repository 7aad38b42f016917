"""MCBO's η-net training stops on a plateau of its acquisition estimate (issue 17, psa17b)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.threads import this_thread_only
from policies._eta_nets import EtaNets
from policies._optimize import Deadline
from policies._search import plain_scorer
from policies._supports import admissible_regions
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


# ------------------------------------------------------------------ a region's training
def test_a_stopped_training_finds_what_the_full_one_does():
    """On a small noisy chain every target set's training stops well before `steps` (64), and
    what it found scores as the full training's does: both solutions (actions and η nets) are
    scored on the same 1024 noise draws, and the stopped one is at most 0.01 below (the
    reward's scale is ~1 here; the rescoring's own Monte-Carlo error is ~0.01)."""
    # X0 -> X1 -> X2 -> X3 -> Y, noisy: in every target set a hallucinated node has a noisy
    # parent, so every region trains η nets
    target_sets = [[], ["a0"], ["a1"], ["a0", "a1"]]
    spec = chain_spec(intervention="hard", nodes=5, noise=0.1, target_sets=target_sets)
    model = trained_model(spec, 12)
    base = {"nn_restarts": 8, "max_seconds": 600.0}
    full = make_policy("mcbo", spec, {**base, "stop_patience": 0}).problem(model, 0, Deadline(600))
    fast = make_policy("mcbo", spec, base).problem(model, 0, Deadline(600))
    eps = torch.randn(1024, len(full.column), generator=torch.Generator().manual_seed(9))
    regions = admissible_regions(model, Constraints.from_spec(spec, 0.0))
    assert len(regions) == 4
    # one torch thread: at these sizes a pool of two only waits on a busy machine
    with this_thread_only(1):
        for region in regions:
            assert full.solves_in_threads(region)  # network η
            scores = []
            for problem in (full, fast):
                solution = problem._train(region, plain_scorer, Deadline(600), 600.0, seed=7)
                nets = EtaNets(
                    {
                        n: max(model.inputs[n].width, 1)
                        for n in problem.eta_nodes(region.set_actions)
                    },
                    1,
                    problem.settings.hidden_factor,
                    torch.Generator(),
                    dtype=problem.dtype,
                    device=problem.device,
                )
                assert nets.load(0, solution.memory["nets"])
                values = solution.values.unsqueeze(0)
                with torch.no_grad():
                    scores.append(float(problem._network_reward(region, values, nets, eps, 64)))
                steps = problem.info["steps"]
            assert full.info["steps"] == 64
            assert steps < 64 and steps % 8 == 0 and fast.info["plateau_checks"] >= 2
            assert scores[1] >= scores[0] - 0.01, (region.set_actions, scores)
