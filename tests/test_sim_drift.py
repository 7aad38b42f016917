"""Issue 22's drifting environments: every round's oracle against Monte Carlo, its optimum
against the oracle, and the drift itself (the optimum moves, the season turns)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.schemas import Action
from sim._device_plan import Actuator, Noise
from sim.dropwave_drift import PERIOD, DropwaveDrift
from sim.registry import make_environment
from sim.sir_school_terms import HOLIDAY_WEEKS, SchoolTermsSIR, in_holiday
from sim.sir_seasonal import SeasonalSIR, seasonal_r0


def _monte_carlo_agrees(env, intervention, seed: int, draws: int = 100_000) -> None:
    gen = torch.Generator().manual_seed(seed)
    reward = env.sample(intervention, draws, gen)[env.reward_node].numpy()
    oracle = env.expected_reward(intervention)
    error = np.std(reward) / math.sqrt(reward.size)
    assert error > 0
    assert abs(np.mean(reward) - oracle) <= 5 * error, intervention


@pytest.mark.parametrize("round_", [0, 137, 500, 999])
def test_dropwave_drift_oracle_agrees_with_monte_carlo(round_):
    env = make_environment("dropwave-drift").at(round_)
    assert env.round == round_
    for k, a in enumerate([(0.1, 0.9), (0.45, 0.62), (0.8, 0.3)]):
        _monte_carlo_agrees(env, {"a0": a[0], "a1": a[1]}, seed=k)
    _monte_carlo_agrees(env, env.optimum.intervention, seed=7)


@settings(max_examples=60, deadline=None)
@given(round_=st.integers(0, 3 * PERIOD), a0=st.floats(0, 1), a1=st.floats(0, 1))
def test_dropwave_drift_optimum_dominates_its_round(round_, a0, a1):
    env = DropwaveDrift().at(round_)
    best = env.optimum
    assert env.expected_reward(best.intervention) == pytest.approx(best.value, abs=1e-12)
    assert env.expected_reward({"a0": a0, "a1": a1}) <= best.value + 1e-12


def test_the_dropwave_optimum_moves_slowly_and_comes_back():
    env = DropwaveDrift()
    path = [env.at(t).optimum.intervention for t in range(0, PERIOD + 1, 10)]
    steps = [math.dist(tuple(p.values()), tuple(q.values())) for p, q in itertools.pairwise(path)]
    assert max(steps) < 0.02 and min(steps) > 0.01  # ~0.0013 of the box per round
    assert path[0] == pytest.approx(path[-1])
    assert math.dist(tuple(path[0].values()), tuple(path[len(path) // 2].values())) > 0.39


@pytest.mark.parametrize("week", [0, 13, 26])
def test_sir_seasonal_oracle_agrees_with_monte_carlo(week):
    env = make_environment("sir-seasonal").at(week)
    assert env.r0 == pytest.approx(seasonal_r0(week))
    rng = np.random.default_rng(week)
    plans = [dict(zip(env.action_names, x, strict=True)) for x in env.random_feasible(2, rng)]
    for k, plan in enumerate([*plans, env.optimum.intervention]):
        _monte_carlo_agrees(env, plan, seed=k, draws=20_000)


def test_the_season_changes_what_a_campaign_is_worth():
    env = SeasonalSIR()
    winter, summer = env.at(0), env.at(26)
    assert env.at(52) is winter  # one system per week of the year
    assert winter.optimum.value < summer.optimum.value - 0.3  # more sick days in winter
    plan = summer.optimum.intervention
    assert winter.expected_reward(plan) <= winter.optimum.value + 1e-9


@pytest.mark.parametrize("week", [0, 2, 30])  # Christmas holiday, term, summer holiday
def test_sir_school_terms_oracle_agrees_with_monte_carlo(week):
    env = make_environment("sir-school-terms").at(week + 52)
    assert env.holiday == (week in HOLIDAY_WEEKS)
    rng = np.random.default_rng(week)
    plans = [dict(zip(env.action_names, x, strict=True)) for x in env.random_feasible(2, rng)]
    for k, plan in enumerate([*plans, env.optimum.intervention]):
        _monte_carlo_agrees(env, plan, seed=k, draws=20_000)


def test_the_school_calendar_moves_the_best_use_of_the_vaccine():
    env = SchoolTermsSIR()
    assert env.at(0) is env.at(52) is env.at(30) and env.at(2) is env.at(60)
    assert sum(in_holiday(t) for t in range(52)) == 13
    term, holiday = env.at(2), env.at(0)
    assert not term.holiday and holiday.holiday
    assert term.r0_now == pytest.approx(1.8) and holiday.r0_now < 0.8 * term.r0_now
    best_term, best_holiday = term.optimum.intervention, holiday.optimum.intervention
    # term: every dose to the school-age group; holiday: to the 20-49 group
    assert best_term["vacc_0_19"] > 0.35 and best_term["vacc_20_49"] < 0.01
    assert best_holiday["vacc_20_49"] > 0.23 and best_holiday["vacc_0_19"] < 0.01
    for system, other in ((term, best_holiday), (holiday, best_term)):
        # each regime's best plan is feasible, and the other's loses > 0.1 sick days a person
        assert bool(system.feasible(list(system.optimum.intervention.values())))
        assert system.expected_reward(other) < system.optimum.value - 0.1
    # only the school-age group's contacts changed, and C stays reciprocal
    changed = ~np.isclose(term.contacts, holiday.contacts)
    assert changed[0].all() and changed[:, 0].all() and not changed[1:, 1:].any()
    pop = holiday.population
    np.testing.assert_allclose(pop[:, None] * holiday.contacts, (pop[:, None] * holiday.contacts).T)


def test_the_device_plays_the_round_of_a_drifting_environment():
    """`cbo-agent sim dropwave-drift`: round t's readings and oracle are env.at(t)'s, so the
    agent's cumulative regret is the dynamic regret."""
    env = DropwaveDrift()
    optimum = float(env.optimum.value)
    actuator = Actuator(env, "d", Noise(), seed=1, seq_start=0, optimum=optimum)
    applied = {"a0": 0.5, "a1": 0.7}
    for t in (0, PERIOD // 4, PERIOD // 2):
        plan = actuator.apply(Action.issue("e", t, applied, "soft"))
        system = env.at(t)
        assert plan.oracle.optimum == pytest.approx(float(system.optimum.value))
        assert plan.oracle.expected_reward == pytest.approx(float(system.expected_reward(applied)))
    # the centre moved a quarter turn: the same action is worth something else
    early = actuator.apply(Action.issue("e", 0, applied, "soft")).oracle.expected_reward
    late = actuator.apply(Action.issue("e", PERIOD // 4, applied, "soft")).oracle.expected_reward
    assert early != pytest.approx(late)
