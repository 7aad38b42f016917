"""When the driver loop must act: ack and round timeouts, busy retries, expiries, the rate limit.

The loop asks `next_deadline` how long it may sleep and calls `due` when it wakes. Both start
from `OpenRounds.earliest_timer`, a lower bound kept as rounds open, move and close, so a turn of
the loop costs O(1) instead of a scan of every open round.

Every instant here is on the experiment's monotonic clock (`Experiment.ticks`), never wall time:
a wall clock stepped by NTP or by hand must not expire a round early nor hold it forever. Wall
time appears only in what is stored and sent (`expires_at` in an action, for devices).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from agent.rounds import LiveRound, RoundStatus
from connectors.schemas import Action
from core.spec import ScheduleSpec

if TYPE_CHECKING:
    from agent.experiment import Experiment

__all__ = ["OpenRounds", "ack_window", "due", "next_deadline", "round_timers"]


def ack_window(schedule: ScheduleSpec) -> float:
    """How long an action may go unacknowledged: every ack timeout, retries included."""
    return schedule.ack_timeout_s * (schedule.ack_retries + 1)


def round_timers(live: LiveRound, schedule: ScheduleSpec) -> list[float]:
    """When `due` has something to do for this round (the same conditions it checks)."""
    if live.awaits_session:  # a recovered round's timers start with the first session
        return []
    if live.status is RoundStatus.PUBLISHED and live.published_at is not None:
        timers = [live.published_at + schedule.ack_timeout_s]
        if live.retry_at is not None:
            timers.append(live.retry_at)
        if live.expires_tick is not None:
            timers.append(live.expires_tick)
        return timers
    if live.status is RoundStatus.ACKED and live.acked_at is not None:
        return [live.acked_at + schedule.round_timeout_s]
    return []


class OpenRounds:
    """Rounds not closed yet, in round order, with a lower bound on their earliest timer.

    Kept exactly — a round is added when proposed or recovered open (rounds come in number
    order) and removed where it closes or ends — so the driver loop's checks never scan closed
    rounds. The bound is None when unknown. A round leaving can only make the true earliest
    timer later, so it keeps the bound; a round joining, or a timer set or moved
    (`timers_moved`), clears it.
    """

    def __init__(self, schedule: ScheduleSpec) -> None:
        self.schedule = schedule
        self._rounds: dict[int, LiveRound] = {}
        self._floor: float | None = None

    def add(self, live: LiveRound) -> None:
        self._rounds[live.number] = live
        self._floor = None

    def remove(self, number: int) -> None:
        self._rounds.pop(number, None)

    def __len__(self) -> int:
        return len(self._rounds)

    def __iter__(self) -> Iterator[LiveRound]:
        return iter(self._rounds.values())

    def timers_moved(self) -> None:
        self._floor = None

    def earliest_timer(self) -> float:
        """A lower bound on the earliest timer of an open round (math.inf: none); O(1) unless a
        timer moved since the last call."""
        if self._floor is None:
            self._floor = min(
                (t for live in self for t in round_timers(live, self.schedule)), default=math.inf
            )
        return self._floor


def next_deadline(exp: Experiment, now: float) -> float:
    """Seconds until something is due (an ack or round timeout, or the rate limit); `now` on
    the monotonic clock."""
    schedule = exp.spec.schedule
    deadlines = [exp.open.earliest_timer()]
    can_start = exp.in_flight < schedule.pipeline and not exp.finished
    if can_start and exp.last_publish_at is not None and schedule.min_interval_s > 0:
        deadlines.append(exp.last_publish_at + schedule.min_interval_s)
    return max(min(deadlines) - now, 0.0)


def due(exp: Experiment, now: float) -> list[Action]:
    """Handle timeouts: actions to re-publish now (closed or expired rounds are handled);
    `now` on the monotonic clock."""
    if now < exp.open.earliest_timer():
        return []
    exp.open.timers_moved()  # rounds re-published or closed below move the earliest timer
    again: list[Action] = []
    for live in exp.open_rounds:  # a copy: rounds close while we go
        if live.awaits_session:
            # recovered and unacknowledged: its ack may be queued for the broker session this
            # life has not had yet (`agent.recovery.start_windows`)
            continue
        if live.status is RoundStatus.PUBLISHED and live.published_at is not None:
            action = _unacknowledged(exp, live, now)
            if action is not None:
                again.append(action)
        elif (
            live.status is RoundStatus.ACKED
            and live.acked_at is not None
            and now - live.acked_at >= exp.spec.schedule.round_timeout_s
        ):
            exp.close_round(live, now, "timeout")
    return again


def _unacknowledged(exp: Experiment, live: LiveRound, now: float) -> Action | None:
    """A published round still without its ack: expire it, or the action to publish again now
    (None: not yet). Until it expires, the action goes out again now and then. A round expires
    when no ack of it was *received* by its expiry (`acks.AckArrivals`): one that arrived in
    time and waits to be handled holds it open."""
    schedule = exp.spec.schedule
    expires_at = live.expires_tick
    if expires_at is not None and now >= expires_at:
        if exp.acks_in.arrived_before(live.number, expires_at):
            # its ack was received in time and waits in the inbox behind the experiment's
            # own work: the driver handles it next (this timer keeps it from sleeping)
            return None
        exp.end_round(live, RoundStatus.EXPIRED, now, "no ack by expires_at")
        return None
    retry = live.retry_at is not None and now >= live.retry_at
    if now - live.published_at < schedule.ack_timeout_s and not retry:
        return None
    live.retry_at = None
    exp.open.timers_moved()
    if expires_at is None and live.action.attempt > schedule.ack_retries:
        exp.end_round(live, RoundStatus.EXPIRED, now, "no ack")
        return None
    return exp.republish(live.number)
