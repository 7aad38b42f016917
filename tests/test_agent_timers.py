"""The driver loop's bookkeeping: open rounds and the earliest timer, kept incrementally.

`Experiment.open_rounds` is kept as rounds open and close, and `next_deadline` / `due` work from a
lower bound on the earliest timer instead of scanning every open round on each turn of the loop.
Under random sequences of proposals, acks (applied and "busy"), readings and clock steps, these
tests compare both with a brute-force scan of every round: a late bound would mean a timeout
handled late, a stale open list a round driven after it closed.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.experiment import BUSY, Experiment, LiveRound, RoundStatus
from connectors.schemas import Ack
from connectors.store import Store
from tests.test_agent_join import Clock, ack, chain_spec, reading


def busy(exp: Experiment, number: int) -> Ack:
    return ack(exp, number).model_copy(update={"status": "rejected", "reason": BUSY})


def timers(exp: Experiment, live: LiveRound) -> list[float]:
    """Every moment `due` must act on this round, read from the round's fields."""
    schedule = exp.spec.schedule
    if live.status is RoundStatus.PUBLISHED:
        found = [live.published_at + schedule.ack_timeout_s]
        found += [t for t in (live.retry_at, live.action.expires_at) if t is not None]
        return found
    if live.status is RoundStatus.ACKED:
        return [live.acked_at + schedule.round_timeout_s]
    return []


def earliest(exp: Experiment) -> float:
    return min((t for live in exp.rounds.values() for t in timers(exp, live)), default=math.inf)


def check(exp: Experiment, now: float) -> None:
    scanned = sorted(
        (live for live in exp.rounds.values() if live.is_open), key=lambda live: live.number
    )
    assert exp.open_rounds == scanned
    assert exp.in_flight == len(scanned)
    # never later than the truth (earlier only wakes the loop for nothing)
    assert exp.next_deadline(now) <= max(earliest(exp) - now, 0.0) + 1e-9


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["propose", "ack", "busy", "readings", "partial", "wait"]),
        st.integers(0, 10**6),
        st.floats(0.0, 12.0),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPERATIONS)
def test_open_rounds_and_the_next_deadline_match_a_scan_of_every_round(operations):
    clock = Clock()
    spec = chain_spec()
    spec = spec.model_copy(
        update={"schedule": spec.schedule.model_copy(update={"pipeline": 4, "ack_retries": 1})}
    )
    with Store(":memory:") as store:
        exp = Experiment(spec, store, seed=0, clock=clock)
        seq = 0
        for kind, pick, seconds in operations:
            published = [r.number for r in exp.open_rounds if r.status is RoundStatus.PUBLISHED]
            acked = [r.number for r in exp.open_rounds if r.status is RoundStatus.ACKED]
            if kind == "propose" and exp.can_propose(clock.now):
                live = exp.propose()
                if live is not None:
                    exp.mark_published(live.number)
            elif kind in ("ack", "busy") and published:
                number = published[pick % len(published)]
                exp.on_ack((ack if kind == "ack" else busy)(exp, number))
            elif kind in ("readings", "partial") and acked:
                number = acked[pick % len(acked)]
                nodes = "ABC" if kind == "readings" else "AB"[: 1 + pick % 2]
                seq += 1
                exp.on_readings([reading(exp, number, n, 0.1 * seq, seq) for n in nodes])
            elif kind == "wait":
                clock.now += seconds
                for action in exp.due(clock.now):
                    exp.mark_published(action.round)
                # every timer that had come is handled: what is left lies ahead
                assert earliest(exp) > clock.now
            check(exp, clock.now)


def test_timeouts_follow_the_monotonic_clock_not_wall_time():
    """A wall clock stepped by days (NTP, an operator) neither fires nor holds back a timeout;
    what is stored and sent keeps wall time."""
    wall, ticks = Clock(), Clock()
    ticks.now = 5.0  # unrelated to the wall clock, as time.monotonic is
    store = Store(":memory:")
    exp = Experiment(chain_spec(), store, clock=wall, ticks=ticks)
    schedule = exp.spec.schedule
    live = exp.propose()
    exp.mark_published(live.number)
    assert live.action.expires_at == wall.now + schedule.ack_timeout_s * (schedule.ack_retries + 1)
    wall.now += 86_400.0  # a day forward: nothing is due
    assert exp.due(ticks.now) == []
    assert exp.next_deadline(ticks.now) == schedule.ack_timeout_s
    wall.now -= 3 * 86_400.0  # two days back: the ack timeout still fires on time
    ticks.now += schedule.ack_timeout_s
    (again,) = exp.due(ticks.now)
    assert again.action_id == live.action.action_id and again.attempt == 2
    assert again.issued_at == wall.now  # messages carry wall time
    exp.on_ack(ack(exp, live.number))
    ticks.now += schedule.round_timeout_s - 0.5
    wall.now += 10 * 86_400.0
    assert exp.due(ticks.now) == [] and exp.rounds[live.number].status is RoundStatus.ACKED
    ticks.now += 0.5
    exp.due(ticks.now)
    assert exp.rounds[live.number].status is RoundStatus.CLOSED
    (row,) = store.rounds(exp.name)
    assert row.status_at == wall.now  # the store keeps wall time


def test_expiry_is_kept_on_the_monotonic_clock():
    wall, ticks = Clock(), Clock()
    ticks.now = 0.0
    exp = Experiment(chain_spec(), Store(":memory:"), clock=wall, ticks=ticks)
    schedule = exp.spec.schedule
    window = schedule.ack_timeout_s * (schedule.ack_retries + 1)
    live = exp.propose()
    exp.mark_published(live.number)
    assert live.expires_tick == window
    wall.now += 10 * window  # the wall clock passes expires_at: the agent does not care
    ticks.now = window - 1e-6
    for action in exp.due(ticks.now):
        assert action.action_id == live.action.action_id
    assert exp.rounds[live.number].status is RoundStatus.PUBLISHED
    ticks.now = window
    exp.due(ticks.now)
    assert exp.rounds[live.number].status is RoundStatus.EXPIRED
