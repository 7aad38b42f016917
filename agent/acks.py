"""Acknowledgements: a device applied an action, refused it, or has no room for it yet.

Every action carries `expires_at`, the moment the agent gives up on it; devices must not apply
it from then on. Should one do so anyway (an "applied" ack or readings for an expired round),
the cost is charged again — past the budget if need be — and counted as a device overspend:
the agent never spends beyond the budget by itself, and what a device did is recorded, not
hidden. The same holds for an action the actuator rejected (its reservation released) and then
reports applied after all, or sends readings of: a rejection never silently un-spends.

An ack counts as in time when the agent *received* it before `expires_at` — when the MQTT
reader routed it to the experiment's inbox — not when the experiment got round to handling it:
on a busy replica an ack can wait in the inbox for seconds behind the experiment's own work, and
that wait must not expire its round (`AckArrivals`, read by `agent.timers`).

Only the experiment's actuator's acks reach this module (`agent.identity` refuses the others).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent import telemetry
from agent.rounds import LiveRound, RoundStatus, Verdict
from connectors.schemas import Ack

if TYPE_CHECKING:
    from agent.experiment import Experiment

__all__ = ["BUSY", "BUSY_RETRY_S", "AckArrivals", "on_ack", "overspent"]

BUSY = "busy"  # an ack reason from a device with too many actions in flight: retry later
BUSY_RETRY_S = 1.0


class AckArrivals:
    """Acks received and not yet handled: round -> when each arrived (monotonic ticks, in
    arrival order).

    The runtime notes an ack when its MQTT reader routes it to the experiment's inbox
    (`arrived`, on the event loop) and forgets it once the experiment has handled it (`handled`,
    in the driver's worker call); `agent.timers` asks, before it expires a round, whether an ack
    of it arrived before the round's expiry (`arrived_before`, in a worker thread). One lock
    makes each a single step: an ack stamped after `due` read its clock is stamped no earlier
    than that, so a round whose expiry `due` saw passed is held only for an ack received in time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, deque[float]] = {}

    def arrived(self, round_: int, ticks: Callable[[], float]) -> None:
        with self._lock:
            self._waiting.setdefault(round_, deque()).append(ticks())

    def handled(self, round_: int) -> None:
        """One ack of the round (the earliest waiting: the inbox keeps arrival order) is done."""
        with self._lock:
            waiting = self._waiting.get(round_)
            if waiting:
                waiting.popleft()
                if not waiting:
                    del self._waiting[round_]

    def arrived_before(self, round_: int, deadline: float) -> bool:
        """Whether an ack of the round waiting to be handled was received before `deadline`."""
        with self._lock:
            waiting = self._waiting.get(round_)
            return bool(waiting) and waiting[0] < deadline

    def __len__(self) -> int:
        with self._lock:
            return sum(len(waiting) for waiting in self._waiting.values())


def on_ack(exp: Experiment, ack: Ack) -> Verdict:
    live = exp.rounds.get(ack.round)
    if live is None or live.action.action_id != ack.action_id:
        return Verdict("rejected", "unknown_round")
    if live.status in (RoundStatus.ACKED, RoundStatus.CLOSED):
        return Verdict("duplicate")
    if live.status is RoundStatus.EXPIRED and ack.status == "applied":
        return _applied_after_expiry(exp, live, ack)
    if live.status is RoundStatus.REJECTED and ack.status == "applied":
        return _applied_after_rejection(exp, live, ack)
    if not live.is_open:
        return Verdict("late")
    now = exp.ticks()  # the round's timers; what is stored takes wall time
    if ack.status == "rejected" and ack.reason == BUSY:
        live.retry_at = now + BUSY_RETRY_S  # the device will take it when it has room
        exp.open.timers_moved()
        return Verdict("accepted")
    if ack.status == "rejected":
        exp.end_round(live, RoundStatus.REJECTED, now, f"device rejected: {ack.reason}")
        return Verdict("accepted")
    _acknowledge(exp, live, ack, now)
    return Verdict("accepted")


def _acknowledge(exp: Experiment, live: LiveRound, ack: Ack, now: float) -> None:
    """The device applied the action: the reservation is settled, the round waits for readings."""
    applied = _applied(exp, live, ack)
    wall = exp.clock()
    with exp.store.transaction():
        exp.store.set_round_status(exp.name, live.number, RoundStatus.ACKED, wall)
        exp.store.settle(exp.name, live.number, wall)
        if applied is not None:
            exp.store.set_applied(exp.name, live.number, applied)
    live.status, live.acked_at = RoundStatus.ACKED, now
    exp.open.timers_moved()
    if applied is not None:
        exp.model.history[live.model_round].intervention = applied
    exp.maybe_close(live, now)


def _applied(exp: Experiment, live: LiveRound, ack: Ack) -> dict[str, float] | None:
    """What the device applied, when it differs from the action (clamped, say) and names
    only declared actions; None otherwise. The model learns from what happened."""
    if not ack.applied or ack.applied == live.action.intervention:
        return None
    unknown = sorted(set(ack.applied) - set(exp.spec.action_names))
    if unknown:
        live.log.warning("ack.applied_ignored", applied=ack.applied, unknown=unknown)
        return None
    live.log.info("ack.applied_differs", sent=live.action.intervention, applied=ack.applied)
    return dict(ack.applied)


def _applied_after_expiry(exp: Experiment, live: LiveRound, ack: Ack) -> Verdict:
    """An "applied" ack for a round the agent had given up on: the action happened, so it
    is paid for (charged again, past the budget if need be) and the model learns it."""
    if live.acked_at is not None:
        return Verdict("duplicate")
    if _charge_applied(exp, live, ack):
        expires_at = live.action.expires_at
        late = expires_at is not None and ack.at >= expires_at
        overspent(exp, live, "applied_after_expiry" if late else "ack_after_expiry", ack.at)
    return Verdict("late")


def _charge_applied(exp: Experiment, live: LiveRound, ack: Ack) -> bool:
    """Pay for an action applied after the agent let it go (expired or rejected): charge it,
    record what was applied and let the model learn it. Whether a charge was made (False when
    the round had already been paid for)."""
    applied = _applied(exp, live, ack)
    with exp.store.transaction():
        charged = exp.store.charge(exp.name, live.number, exp.clock())
        if applied is not None:
            exp.store.set_applied(exp.name, live.number, applied)
    live.acked_at = exp.ticks()
    if applied is not None:
        exp.model.history[live.model_round].intervention = applied
    return charged


def _applied_after_rejection(exp: Experiment, live: LiveRound, ack: Ack) -> Verdict:
    """The actuator rejected the action (its reservation was released) and now says it applied
    it: the action happened, so it is paid for and counted as an overspend; the round's
    readings teach the model from now on (`agent.join`)."""
    if live.acked_at is not None:
        return Verdict("duplicate")
    if _charge_applied(exp, live, ack):
        overspent(exp, live, "applied_after_rejection", ack.at)
    return Verdict("late")


def overspent(exp: Experiment, live: LiveRound, reason: str, applied_at: float | None) -> None:
    """Log and count a cost charged after its round expired or its action was rejected (an
    ack, or readings: `agent.join`)."""
    total = exp.spec.constraints.budget_total
    spent = exp.budget_spent()
    live.log.warning(
        "budget.device_overspend",
        reason=reason,
        cost=live.cost,
        expires_at=live.action.expires_at,
        applied_at=applied_at,
        budget_spent=spent,
        budget_total=total,
        over_budget=total is not None and spent > total,
    )
    telemetry.device_overspend(exp, reason)
    telemetry.export_budget(exp)
