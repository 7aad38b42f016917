"""The change detector (`core.gp.change`) and what a model does on its alarm."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from core.gp import GPConfig, IncrementalGP
from core.gp.bounded import make_gp
from core.gp.change import CHANGE_FIELDS, ChangeConfig, ChangeDetector

NOISE = 0.1


def test_the_test_waits_its_warmup_and_no_single_outlier_raises_it():
    detector = ChangeDetector(1, ChangeConfig(threshold=30.0, slack=1.0, warmup=3))
    assert [detector.learn(0, 100.0) for _ in range(3)] == [None] * 3  # warming up
    assert detector.learn(0, math.inf) is None  # capped at threshold / 3 = 10: S = 8
    assert detector.statistic[0] == pytest.approx(8.0)
    assert detector.learn(0, math.nan) is None and detector.statistic[0] == pytest.approx(8.0)
    for _ in range(8):  # ordinary readings (z² = 0.25) bring S back to 0
        detector.learn(0, 0.5)
    assert detector.statistic[0] == 0.0 and detector.since_zero[0] == 0


def test_an_alarm_dates_the_change_and_starts_the_test_again():
    detector = ChangeDetector(2, ChangeConfig(threshold=20.0, slack=1.0, warmup=1))
    detector.learn(0, 0.0)
    detector.learn(1, 0.0)
    # z² = 6 → +4 per reading: S = 4, 8, 12, 16, 20, 24 > 20 at the sixth
    found = [detector.learn(0, math.sqrt(6.0)) for _ in range(6)]
    assert found == [None] * 5 + [6]
    assert detector.alarms == [1, 0] and detector.statistic == [0.0, 0.0]
    assert detector.learn(0, 100.0) is None  # warming up again


def _stream(gp, steps: int, *, step_at: int, shift: float, seed: int) -> list[tuple[int, int]]:
    """`steps` noisy readings of a smooth function of 2 inputs, `shift` added from step_at on;
    the (reading, rows kept) of every alarm."""
    gen = torch.Generator().manual_seed(seed)
    alarms = []
    for t in range(steps):
        x = torch.rand(1, 2, generator=gen, dtype=torch.float64)
        f = torch.sin(6 * x[0, 0]) + x[0, 1] ** 2 + (shift if t >= step_at else 0.0)
        y = f + NOISE * torch.randn(1, generator=gen, dtype=torch.float64)
        report = gp.learn_one(x, y)
        if report.changed:
            assert report.changed == [0] and 0 in report.rebuilt
            alarms.append((t, int(gp.num_observations[0])))
    return alarms


def _model(**settings) -> IncrementalGP:
    config = GPConfig(noise_variance=NOISE**2, refit_every=20, change=ChangeConfig(), **settings)
    return make_gp(torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64), config)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_step_is_found_within_a_few_readings_and_the_past_is_forgotten(seed):
    gp = _model()
    alarms = _stream(gp, 130, step_at=100, shift=1.0, seed=seed)  # 10 noise std
    # z² ≈ 100 per reading past the step, capped at 10: +8 each, over 30 at the fourth
    assert [t for t, _ in alarms] == [103]
    assert alarms[0][1] == 10  # the 4 readings after the change, and at least `keep`
    assert int(gp.num_observations[0]) == 10 + 26
    # refit on what is left, the model predicts the shifted system
    x = torch.tensor([[[0.3, 0.6]]], dtype=torch.float64)
    expected = math.sin(1.8) + 0.36 + 1.0
    assert float(gp.posterior(x).mean[0, 0]) == pytest.approx(expected, abs=0.3)


@pytest.mark.parametrize("seed", [0, 1])
def test_no_false_alarm_on_a_stationary_stream(seed):
    gp = _model()
    assert _stream(gp, 300, step_at=10**9, shift=0.0, seed=seed) == []
    assert int(gp.num_observations[0]) == 300


def test_the_bounded_model_forgets_on_an_alarm_too():
    gp = _model(capacity=40, budget=30)
    alarms = _stream(gp, 80, step_at=60, shift=1.0, seed=3)
    assert [t for t, _ in alarms] == [63] and alarms[0][1] == 10
    assert int(gp.num_observations[0]) == 10 + 16


def test_a_deferred_model_forgets_at_once_and_leaves_the_refit_to_its_caller():
    gp = _model(deferred=True)
    _stream(gp, 104, step_at=100, shift=1.0, seed=0)
    assert int(gp.num_observations[0]) == 10
    job = gp.refit_job()
    assert job is not None and job.members == [0] and job.fit == [True] and job.rows == [10]


def _readings(steps: int, *, step_at: int, shift: float, seed: int):
    """The readings `_stream` would teach: (x (1, 2), y (1,)) per step."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(steps):
        x = torch.rand(1, 2, generator=gen, dtype=torch.float64)
        f = torch.sin(6 * x[0, 0]) + x[0, 1] ** 2 + (shift if t >= step_at else 0.0)
        out.append((x, f + NOISE * torch.randn(1, generator=gen, dtype=torch.float64)))
    return out


@pytest.mark.parametrize("capacity", [None, 60])
def test_a_restart_mid_change_keeps_the_test_and_raises_the_same_alarm(capacity):
    """The live model refits now and then and is cut off two readings after a step (its CUSUM
    statistic > 0); a model resumed from its state and fed every reading again, without
    refits (as recovery does), has the same statistic and rows, and raises its alarm at the
    same reading as the uninterrupted model. Without the detector's part of the state, the
    resumed test starts over (its warmup) and finds nothing by then."""
    settings = {} if capacity is None else {"capacity": capacity, "budget": 50}
    readings = _readings(110, step_at=100, shift=1.0, seed=0)
    uninterrupted, alarms = _model(**settings), []
    for t, (x, y) in enumerate(readings):
        if uninterrupted.learn_one(x, y).changed:
            alarms.append(t)
        if t == 101:  # the last refit was at reading 99: the state is a valid snapshot
            cut = copy.deepcopy(uninterrupted)
    assert alarms == [103]
    state = cut.state()
    assert float(state["change_statistic"][0]) > 0 and int(state["change_since_zero"][0]) == 2

    def resumed(state: dict) -> tuple[IncrementalGP, list[int]]:
        gp, found = _model(**settings), []
        gp.resume(state)
        for t, (x, y) in enumerate(readings):
            if gp.learn_one(x, y, refit=False).changed:
                found.append(t)
            if t == 101 and all(name in state for name in CHANGE_FIELDS):
                assert gp.seen == cut.seen == [102]
                got, want = gp.state(), cut.state()
                for name in CHANGE_FIELDS:
                    torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12)
                for a, b in zip(gp.member_data(0), cut.member_data(0), strict=True):
                    torch.testing.assert_close(a, b, rtol=0, atol=0)
        return gp, found

    gp, found = resumed(state)
    assert found == alarms
    torch.testing.assert_close(gp.member_data(0)[1], uninterrupted.member_data(0)[1])
    _, without = resumed({k: v for k, v in state.items() if k not in CHANGE_FIELDS})
    assert without == []
