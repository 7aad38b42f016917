"""One experiment inside the service: its state, and the verbs the runtime calls.

No I/O happens here: the async runtime (`agent.runtime`) feeds decoded messages in and publishes
what comes out. Every accepted input is written to the store *before* it changes the model or
the ledger, so a restart can replay it (`agent.recovery`).

`Experiment` holds the state and the round transitions (track, publish, close, end, finish);
the work behind each verb is done by a collaborator, a module of functions over the experiment:

    propose                  agent.decide     policy, explorer fallback, vetting, record + reserve
    on_ack                   agent.acks       acks, late charges, device overspend
    on_readings, on_oracle   agent.join       admit, dedupe, teach in one block
    due, next_deadline       agent.timers     timeouts, from a lower bound on the earliest timer
    (on construction)        agent.recovery   rebuild from the store
    (every step)             agent.telemetry  metrics and `RoundEvent`s
    (round done, bounded)    agent.retire     a closed round leaves memory; the store keeps it

The round lifecycle is drawn in `agent.rounds`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable

import structlog
import torch

from agent import acks, decide, join, recovery, telemetry, timers
from agent.acks import BUSY
from agent.regret import RegretTracker
from agent.retire import RoundBook, is_closed_complete, stand_in_readings
from agent.rounds import EventSink, LiveRound, RoundEvent, RoundStatus, Verdict
from agent.timers import OpenRounds
from connectors.metrics import AgentMetrics
from connectors.schemas import Ack, Action, Oracle, Reading, Recommended
from connectors.store import Store
from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies.base import Policy
from policies.random_search import RandomPolicy
from policies.registry import make_policy

# The most the node GPs' factors of one process may take when its experiments with
# `schedule.max_rounds` make room for all their rows at the start (`NetworkModel.reserve_rounds`);
# a process with several experiments gives each its share (`reserve_share`), so a fleet replica
# of 100 does not reserve 100 times this. Past its share an experiment's buffers grow as they
# fill, a spare made beside the learning (`agent.runtime`) taking most of each growth.
# The default of the service's `reserve_mb` setting (agent/config.py).
RESERVE_BYTES = 256 * 2**20


def reserve_share(experiments: int, total_bytes: int = RESERVE_BYTES) -> int:
    """Bytes of factor one of `experiments` experiments in a process may reserve at its start,
    when the process may reserve `total_bytes` in all."""
    return total_bytes // max(1, experiments)


# The round types are re-exported: code written before the split imports them from here.
__all__ = [
    "BUSY",
    "RESERVE_BYTES",
    "EventSink",
    "Experiment",
    "LiveRound",
    "RoundEvent",
    "RoundStatus",
    "Verdict",
    "reserve_share",
]


class Experiment:
    """One experiment's state machine (synchronous; the runtime serializes calls).

    Args:
        spec: the experiment spec.
        store: the durable store (written before anything is acknowledged or published).
        metrics: the Prometheus series to update (optional in tests and benchmarks).
        seed: seeds the policy's random numbers (None: the spec's `initial_design.seed`).
        clock: seconds since the epoch, for what is stored and sent (injectable for tests).
        ticks: monotonic seconds, for timeouts and durations (`agent.timers`); default
            `time.monotonic`, or `clock` itself when a test injects a clock and no ticks.
        on_event: receives a `RoundEvent` for every lifecycle step.
        background_refits: the model only appends rows when it learns; refits wait for the
            caller to run them beside it (the service does, `agent.refits`). False: they run
            inside `on_readings`.
        reserve_bytes: the most the node GPs' factors may reserve at the start for an
            experiment with `schedule.max_rounds` (a process's `RESERVE_BYTES`, or its share
            of it: `reserve_share`).
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        store: Store,
        *,
        metrics: AgentMetrics | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.time,
        ticks: Callable[[], float] | None = None,
        on_event: EventSink | None = None,
        device: str = "cpu",
        background_refits: bool = False,
        reserve_bytes: int = RESERVE_BYTES,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.store = store
        self.metrics = metrics
        self.clock = clock
        if ticks is None:
            ticks = time.monotonic if clock is time.time else clock
        self.ticks = ticks
        self.on_event = on_event or (lambda event: None)
        self.model = NetworkModel(spec, device=device, deferred_refits=background_refits)
        self.policy: Policy = make_policy(spec.policy.name, spec, spec.policy.settings)
        if background_refits and self.model.array_shapes:
            # field models built at their first reading, so the background refits fit them
            # before a decision needs them (issue 15: not inside the decision's cap)
            self.model.prepare_fields(*self.policy.field_model_settings())
        self.explorer: Policy = RandomPolicy(spec)
        if seed is None:
            seed = spec.initial_design.seed
        self.rng = torch.Generator().manual_seed(seed)
        # The rounds in memory: every one, or — a bounded model — those not retired yet
        # (`agent.retire`); round numbers come from a counter, not from the keys
        self.rounds = RoundBook(self._is_retired, self._stand_in)
        self._next_round = 0
        self.retiring = spec.model.capacity is not None
        # The policy's recommendation published last, and one waiting to be (`agent.recommend`)
        self.recommended: Recommended | None = None
        self.recommendation_due: Recommended | None = None
        self._oracles_expected = any(device.oracle for device in spec.served_by)
        self.open = OpenRounds(spec.schedule)  # the rounds not closed yet, and their timers
        self.acks_in = acks.AckArrivals()  # received, not yet handled: no expiry for their rounds
        # held by the driver while a worker thread changes the model (a batch learned, a
        # proposal's row and pending point), and by a refit while it copies the model's rows
        self.learning = asyncio.Lock()
        self.regret = RegretTracker(spec)
        self.finished_reason: str | None = None
        self.last_publish_at: float | None = None  # ticks: the rate limit counts from here
        self.last_close_at: float | None = None  # ticks: the next decision's latency, from here
        self.log = structlog.get_logger(__name__).bind(experiment=self.name)
        recovery.check_same_experiment(self)
        store.upsert_experiment(self.name, spec.model_dump(mode="json", by_alias=True))
        recovery.recover(self)
        for live in list(self.rounds.values()):  # recovered rounds already done leave memory
            self.maybe_retire(live)
        schedule = spec.schedule
        if schedule.max_rounds is not None:
            # the node GPs' buffers grow now, not in the middle of a batch of readings
            self.model.reserve_rounds(schedule.max_rounds, schedule.pipeline, reserve_bytes)

    # ------------------------------------------------------------------ state
    @property
    def next_round(self) -> int:
        """The number the next proposal gets: one past the highest round tracked (O(1))."""
        return self._next_round

    @property
    def open_rounds(self) -> list[LiveRound]:
        """Rounds not closed yet, in round order (a copy: safe to close them while iterating)."""
        return list(self.open)

    @property
    def in_flight(self) -> int:
        return len(self.open)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def budget_spent(self) -> float:
        return self.store.ledger(self.name).spent

    def tick_of(self, wall: float) -> float:
        """A wall-clock instant (stored, or in a message) on the monotonic clock, as of now."""
        if self.ticks is self.clock:
            return wall
        return self.ticks() - (self.clock() - wall)

    def can_propose(self, now: float) -> bool:
        """Whether a new round may start now (pipeline depth, round limit, rate limit); `now` on
        the monotonic clock (`ticks`)."""
        schedule = self.spec.schedule
        if self.finished or self.in_flight >= schedule.pipeline:
            return False
        if schedule.max_rounds is not None and self.next_round >= schedule.max_rounds:
            self.finish("max_rounds reached")
            return False
        if self._budget_exhausted():
            self.finish("budget spent: the rest pays for no action")
            return False
        if self.last_publish_at is not None and schedule.min_interval_s > 0:
            return now - self.last_publish_at >= schedule.min_interval_s
        return True

    def missing_readings(self) -> dict[int, list[str]]:
        """Acked rounds closed without every node's reading: round -> nodes still unread."""
        expected = set(self.model.reported)
        return {
            live.number: sorted(expected - set(live.readings))
            for live in self.rounds.values()
            if live.status is RoundStatus.CLOSED and not expected <= set(live.readings)
        }

    def _budget_exhausted(self) -> bool:
        """The total budget left cannot pay the fixed cost of any action.

        Policies may still find a free round (an observational one); an experiment whose budget
        is gone stops rather than observe forever.
        """
        total = self.spec.constraints.budget_total
        if total is None:
            return False
        spent = self.budget_spent()
        if spent > total:  # a device applied an expired action: nothing is left
            return True
        fixed = [a.cost for a in self.spec.actions if a.cost > 0]
        if self.spec.parameters is not None and self.spec.parameters.cost > 0:
            fixed.append(self.spec.parameters.cost)
        return bool(fixed) and total - spent < min(fixed) - 1e-12

    # ------------------------------------------------------------------ verbs
    def propose(self, *, deferred: bool = False) -> LiveRound | None:
        """Choose the next intervention, reserve its cost and record it; None when finished.

        Runs the policy (seconds, maybe): the runtime calls it in a worker thread and makes sure
        nothing else touches this experiment meanwhile. `deferred`: the regret estimate and the
        round's model row wait for `mark_published` (`decide.settle`), off the decision's path.
        """
        return decide.propose(self, deferred=deferred)

    def mark_published(self, number: int, at: float | None = None) -> None:
        """The action left for the broker (QoS 1 handed over) at `at` (`ticks`; default now).

        The decision's latency ends at `at` (the runtime passes when the publication returned,
        not when this worker call began: on a busy replica that is up to seconds later). The
        round's timers (its ack timeout) and the rate limit count from now, as they did: the
        driver reads the ack only after this call, so counting from `at` would spend the
        device's ack time on the replica's own queue (measured: rounds expired, acks unread).
        """
        live = self.rounds[number]
        now = self.ticks()
        handed = now if at is None else at
        first = live.published_at is None
        live.published_at = now
        self.open.timers_moved()
        self.last_publish_at = now
        if live.status is RoundStatus.PROPOSED:
            live.status = RoundStatus.PUBLISHED
            with self.store.transaction():
                self.store.set_round_status(self.name, number, RoundStatus.PUBLISHED, self.clock())
                self.store.bump_attempt(self.name, number)  # the store counts publications
        latency = None  # the decision's: from the last close to this action's first publication
        if first and self.last_close_at is not None:
            latency = handed - self.last_close_at
        live.log.info("round.published", attempt=live.action.attempt, decision_latency_s=latency)
        telemetry.published(self, live, latency)
        decide.settle(self, live)  # a deferred proposal's model part, now that it is out

    def republish(self, number: int) -> Action:
        """The same action (same id) with the next attempt number, recorded before sending."""
        live = self.rounds[number]
        live.action = live.action.next_attempt(at=self.clock())
        live.published_at = self.ticks()  # the ack timeout restarts with every publication
        self.open.timers_moved()
        self.store.bump_attempt(self.name, number)
        return live.action

    def on_ack(self, ack: Ack) -> Verdict:
        return acks.on_ack(self, ack)

    def on_readings(self, readings: Iterable[Reading]) -> list[Verdict]:
        """Join a batch of readings: store them, then update the model once per round."""
        readings = list(readings)
        verdicts = join.on_readings(self, readings)
        if self.retiring:  # a late reading may have completed a round closed by its timeout
            for number in {reading.round for reading in readings}:
                live = dict.get(self.rounds, number)  # in memory only: no stand-in
                if live is not None:
                    self.maybe_retire(live)
        return verdicts

    def on_oracle(self, oracle: Oracle) -> Verdict:
        if self._is_retired(oracle.round):
            # a retired round's oracle value is in (it retires no sooner): a duplicate, as
            # the tracker said while it held the value, or another action's id
            live = self.rounds.get(oracle.round)
            if live is None or live.action.action_id != oracle.action_id:
                return Verdict("rejected", "unknown_round")
            return Verdict("duplicate")
        verdict = join.on_oracle(self, oracle)
        live = dict.get(self.rounds, oracle.round)
        if verdict.outcome == "accepted" and live is not None:
            self.maybe_retire(live)
        return verdict

    def due(self, now: float) -> list[Action]:
        """Handle timeouts: actions to re-publish now (closed or expired rounds are handled);
        `now` on the monotonic clock (`ticks`)."""
        return timers.due(self, now)

    def next_deadline(self, now: float) -> float:
        """Seconds until something is due (an ack or round timeout, or the rate limit)."""
        return timers.next_deadline(self, now)

    # ------------------------------------------------------------------ round transitions
    def track(self, live: LiveRound) -> None:
        """Keep a round just proposed or recovered (an open one among the open rounds too)."""
        self.rounds[live.number] = live
        self._next_round = max(self._next_round, live.number + 1)
        if live.action.expires_at is not None:
            live.expires_tick = self.tick_of(live.action.expires_at)
        if live.is_open:
            self.open.add(live)

    def maybe_close(self, live: LiveRound, now: float) -> None:
        """Close an acked round every node has reported; `now` on the monotonic clock."""
        if live.status is RoundStatus.ACKED and set(self.model.reported) <= set(live.readings):
            self.close_round(live, now, "complete")

    def close_round(self, live: LiveRound, now: float, why: str) -> None:
        """An acked round is over: every node reported ("complete"), or its wait timed out;
        `now` on the monotonic clock."""
        self.forget_pending(live)
        live.status, live.closed_at = RoundStatus.CLOSED, now
        self.open.remove(live.number)
        self.store.set_round_status(self.name, live.number, RoundStatus.CLOSED, self.clock(), why)
        self.last_close_at = live.last_reading_at if why == "complete" else now
        missing = sorted(set(self.model.reported) - set(live.readings))
        reward = live.readings.get(self.model.reward_node)
        live.log.info("round.closed", why=why, missing=missing or None, reward=reward)
        telemetry.closed(self, live, now, why)
        self.maybe_retire(live)

    # ------------------------------------------------------------------ retired rounds
    def maybe_retire(self, live: LiveRound) -> bool:
        """A bounded model's round leaves memory once nothing can still arrive for it: closed
        with every reading in, and its oracle value in (or no device sends one). The store
        keeps it; the model may forget its row (`agent.retire`). Whether it retired."""
        if not self.retiring or live.number not in self.rounds:
            return False
        if not is_closed_complete(live, self.model.reported):
            return False
        if self._oracles_expected and live.number not in self.regret.expected:
            return False
        self.rounds.retire(live.number)
        self.regret.forget(live.number)
        self.model.release_round(live.model_round)
        return True

    def _is_retired(self, number: int) -> bool:
        """Whether a round number not in memory is one this experiment ran and retired."""
        return self.retiring and 0 <= number < self._next_round and number not in self.rounds

    def _stand_in(self, number: int) -> LiveRound | None:
        """A retired round as its messages' checks see it, from the store (`agent.retire`)."""
        row = self.store.get_round(self.name, number)
        if row is None:
            return None
        return LiveRound(
            number=row.round,
            action=recovery.stored_action(self, row, row.expires_at),
            target_set=tuple(row.target_set),
            cost=row.cost,
            acquisition=math.nan,
            policy="(retired)",
            model_round=-1,
            status=RoundStatus(row.status),
            proposed_at=row.proposed_at,
            acked_at=self.tick_of(row.status_at),
            closed_at=self.tick_of(row.status_at),
            readings=stand_in_readings(list(self.model.inputs)),
        )

    def end_round(self, live: LiveRound, status: RoundStatus, now: float, why: str) -> None:
        """A round that will not close (rejected, expired): its reservation is released; `now`
        on the monotonic clock."""
        self.forget_pending(live)
        wall = self.clock()
        with self.store.transaction():
            self.store.set_round_status(self.name, live.number, status, wall, why)
            self.store.release(self.name, live.number, wall)
        live.status, live.closed_at = status, now
        self.open.remove(live.number)
        live.log.warning("round.ended", status=status.value, why=why)
        telemetry.ended(self, live, status, why)

    def forget_pending(self, live: LiveRound) -> None:
        """Drop the round's pending point from the model (its readings came, or never will)."""
        if live.pending is not None:
            self.model.drop_pending(live.pending)
            live.pending = None

    def finish(self, reason: str) -> None:
        """Propose no more rounds (the first reason is kept); open rounds still run their course."""
        if self.finished_reason is None:
            self.finished_reason = reason
            self.log.info("experiment.finished", reason=reason)
            telemetry.finished(self, reason)
