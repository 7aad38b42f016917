"""What a replica taking an experiment over asks the device about again (`agent.fleet.
unanswered`): every open round, and every round whose feedback is incomplete and was still due
when the previous owner may have stopped storing — however many there are — but not rounds
whose feedback was due long before (a sensor that died an hour ago is not asked at every
takeover)."""

from __future__ import annotations

from agent.experiment import Experiment, RoundStatus
from agent.fleet import _ask_again, unanswered
from connectors.store import Store
from tests.test_agent_join import Clock, ack, chain_spec, reading


def _rounds(exp: Experiment, clock: Clock, count: int, nodes: str, seq: int) -> list[int]:
    """`count` rounds published, acknowledged and read on `nodes`; closed by their timeout
    where a node is missing."""
    numbers = []
    for _ in range(count):
        live = exp.propose()
        assert live is not None
        exp.mark_published(live.number)
        exp.on_ack(ack(exp, live.number))
        exp.on_readings([reading(exp, live.number, n, 0.1, seq + i) for i, n in enumerate(nodes)])
        seq += len(nodes)
        numbers.append(live.number)
    clock.now += exp.spec.schedule.round_timeout_s + 1
    exp.due(clock.now)
    return numbers


def test_every_round_still_due_is_asked_again_and_none_long_overdue() -> None:
    clock = Clock()
    exp = Experiment(chain_spec(), Store(":memory:"), seed=1, clock=clock)
    old = _rounds(exp, clock, 5, "AB", seq=0)  # C never came, an hour before the takeover
    clock.now += 3600
    recent = _rounds(exp, clock, 15, "AB", seq=100)  # more than the 10 asked before
    _rounds(exp, clock, 3, "ABC", seq=200)  # complete: nothing to ask
    acked = exp.propose()
    assert acked is not None
    exp.mark_published(acked.number)
    exp.on_ack(ack(exp, acked.number))
    waiting = exp.propose()  # published, no ack yet
    assert waiting is not None
    exp.mark_published(waiting.number)
    assert {exp.rounds[n].status for n in old + recent} == {RoundStatus.CLOSED}

    lapsed = clock.now - 30.0  # TTL + heartbeat + load before the takeover
    asked = [live.number for live in unanswered(exp, lapsed)]
    assert asked == [*recent, acked.number, waiting.number]
    # an owner far behind its input (its newest stored reading long ago) gets them all asked
    assert [live.number for live in unanswered(exp, clock.now - 4000)] == [
        *old,
        *recent,
        acked.number,
        waiting.number,
    ]

    attempt = waiting.action.attempt
    actions = _ask_again(exp, lapsed)  # the newest stored reading is recent: `lapsed` bounds
    assert [a.round for a in actions] == asked
    assert actions[-1].attempt == attempt + 1  # not acknowledged: a new attempt, recorded
    assert actions[-2].action_id == acked.action.action_id
    assert actions[-2].attempt == acked.action.attempt  # applied: the same attempt again
