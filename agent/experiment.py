"""One experiment inside the service: round lifecycle, feedback join, budget and regret.

No I/O happens here: the async runtime (`agent.runtime`) feeds decoded messages in and publishes
what comes out. Every accepted input is written to the store *before* it changes the model or
the ledger, so a restart can replay it (see `agent.recovery`).

Round lifecycle:

    proposed --publish--> published --ack applied--> acked --all readings / timeout--> closed
                              |  \\--ack rejected--> rejected (budget released)
                              \\--no ack by expires_at--> expired (budget released)

Every action carries `expires_at`, the moment the agent gives up on it; devices must not apply
it from then on. Should one do so anyway (an "applied" ack or readings for an expired round),
the cost is charged again — past the budget if need be — and counted as a device overspend:
the agent never spends beyond the budget by itself, and what a device did is recorded, not
hidden.

Before reserving, the agent checks what it will publish (the proposal clamped to the bounds)
against the constraints, at the cost it recomputes itself: a policy's bug cannot overspend.

Feedback join: a reading names its round and node. It is dropped as a duplicate when the store
has already seen (device, node, seq) or the round already has that node; it teaches the model as
soon as the node's row is complete (its value and its parents' values), also after the round
closed ("late"). A round closes when every node has reported, or when its wait times out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

import structlog
import torch

from agent.regret import RegretTracker, regret_bound
from agent.vetting import Vetted, Violation, vet
from connectors.metrics import AgentMetrics
from connectors.schemas import Ack, Action, Oracle, Reading
from connectors.store import BudgetExceeded, RoundRow, Store
from core.gp import LearnReport
from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies.base import Constraints, NothingAffordable, Policy, Proposal
from policies.random_search import RandomPolicy
from policies.registry import make_policy

Outcome = Literal["accepted", "duplicate", "late", "rejected"]
BUSY = "busy"  # an ack reason from a device with too many actions in flight: retry later
BUSY_RETRY_S = 1.0


class RoundStatus(StrEnum):
    PROPOSED = "proposed"
    PUBLISHED = "published"
    ACKED = "acked"
    CLOSED = "closed"
    REJECTED = "rejected"
    EXPIRED = "expired"


OPEN_STATUSES = frozenset({RoundStatus.PROPOSED, RoundStatus.PUBLISHED, RoundStatus.ACKED})
# Parts of a spec that define what the stored data mean; a restart may change the rest.
IMPLAUSIBLE_SPANS = 1e6  # a reading this many typical ranges away is a fault, not data
STRUCTURAL_FIELDS = (
    "intervention",
    "nodes",
    "actions",
    "target_sets",
    "candidates",
    "reward",
    "model",
)


@dataclass(frozen=True)
class Verdict:
    """What became of one incoming message."""

    outcome: Outcome
    reason: str = ""


@dataclass
class LiveRound:
    """A round as the agent tracks it."""

    number: int
    action: Action
    target_set: tuple[str, ...]
    cost: float
    acquisition: float
    policy: str
    model_round: int
    status: RoundStatus = RoundStatus.PROPOSED
    proposed_at: float = 0.0
    published_at: float | None = None
    acked_at: float | None = None
    closed_at: float | None = None
    last_reading_at: float | None = None
    retry_at: float | None = None  # a device said "busy": re-publish then
    pending: int | None = None  # the model's pending-point handle while the round is in flight
    readings: dict[str, float] = field(default_factory=dict)

    @property
    def intervention(self) -> dict[str, float]:
        return dict(self.action.intervention)

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES


@dataclass(frozen=True)
class RoundEvent:
    """Something a person watching the agent wants to see (the demo's live view, logs)."""

    kind: Literal["proposed", "published", "closed", "rejected", "expired", "finished"]
    experiment: str
    round: int | None
    intervention: dict[str, float] = field(default_factory=dict)
    reward: float | None = None
    expected_reward: float | None = None
    cumulative_regret: float | None = None
    regret_upper_estimate: float | None = None
    decision_seconds: float | None = None
    decision_latency_s: float | None = None
    detail: str = ""


EventSink = Callable[[RoundEvent], None]


class Experiment:
    """One experiment's state machine (synchronous; the runtime serializes calls).

    Args:
        spec: the experiment spec.
        store: the durable store (written before anything is acknowledged or published).
        metrics: the Prometheus series to update (optional in tests and benchmarks).
        seed: seeds the policy's random numbers (None: the spec's `initial_design.seed`).
        clock: seconds since the epoch (injectable for tests).
        on_event: receives a `RoundEvent` for every lifecycle step.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        store: Store,
        *,
        metrics: AgentMetrics | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.time,
        on_event: EventSink | None = None,
        device: str = "cpu",
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.on_event = on_event or (lambda event: None)
        self.model = NetworkModel(spec, device=device)
        self.policy: Policy = make_policy(spec.policy.name, spec, spec.policy.settings)
        self.explorer: Policy = RandomPolicy(spec)
        if seed is None:
            seed = spec.initial_design.seed
        self.rng = torch.Generator().manual_seed(seed)
        self.rounds: dict[int, LiveRound] = {}
        # Rounds not yet closed, by number; kept exactly (added when proposed or recovered open,
        # removed where a round closes), so the driver loop's checks never scan closed rounds.
        self._open: dict[int, LiveRound] = {}
        # A lower bound on the earliest timer (ack timeout, retry, expiry, round timeout) of an
        # open round, or None when unknown. A round closing can only make the true earliest
        # timer later, so it keeps the bound; a timer set or moved clears it (`_timers_moved`).
        self._timer_floor: float | None = None
        self.regret = RegretTracker(spec)
        self.finished_reason: str | None = None
        self._last_publish_at: float | None = None
        self._last_close_at: float | None = None
        self.log = structlog.get_logger("agent.experiment").bind(experiment=self.name)
        self._check_same_experiment()
        store.upsert_experiment(self.name, spec.model_dump(mode="json", by_alias=True))
        self._recover()

    # ------------------------------------------------------------------ recovery
    def _check_same_experiment(self) -> None:
        """Refuse to continue a stored experiment whose graph or model the spec has changed."""
        stored = self.store.experiment_spec(self.name)
        if stored is None:
            return
        current = self.spec.model_dump(mode="json", by_alias=True)
        changed = [key for key in STRUCTURAL_FIELDS if stored.get(key) != current.get(key)]
        if changed:
            raise ValueError(
                f"experiment {self.name!r} exists in the store with different {changed}; "
                "give the changed experiment a new name (or use a new store)"
            )

    def _recover(self) -> None:
        """Continue a stored experiment: same rounds, same budget, same model."""
        rows = self.store.rounds(self.name)
        if not rows:
            return
        # Timers ran while the agent was down; they restart now, so that what the broker queued
        # for this session (acks, readings) is read before a round can expire or time out.
        now = self.clock()
        with self.store.transaction():
            expiries = self._renew_expiries(rows, now)
        for row in rows:
            status = RoundStatus(row.status)
            action = Action(
                experiment=self.name,
                round=row.round,
                action_id=row.action_id,
                intervention=row.intervention,
                kind=row.kind,
                issued_at=row.proposed_at,
                attempt=max(row.attempt, 1),
                expires_at=expiries.get(row.round, row.expires_at),
            )
            # the model learns from what the device reported applied (clamped, say)
            applied = row.applied if row.applied is not None else row.intervention
            self.rounds[row.round] = LiveRound(
                number=row.round,
                action=action,
                target_set=tuple(row.target_set),
                cost=row.cost,
                acquisition=math.nan,
                policy="(recovered)",
                model_round=self.model.start_round(applied),
                status=status,
                proposed_at=row.proposed_at,
                published_at=now if row.attempt > 0 else None,
                acked_at=now if status is RoundStatus.ACKED else None,
                closed_at=row.status_at if status not in OPEN_STATUSES else None,
            )
            if status in OPEN_STATUSES:
                self._open[row.round] = self.rounds[row.round]
        self._open = dict(sorted(self._open.items()))
        published = [row.proposed_at for row in rows if row.attempt > 0]
        if published:  # the rate limit holds across restarts (a crash loop must not flood)
            self._last_publish_at = max(published)
        readings = self.store.readings(self.name)
        for reading in readings:  # arrival order: every node learns what it learned before
            live = self.rounds[reading.round]
            if reason := self._implausible(reading.node, reading.value):  # an older, laxer agent
                self.log.warning(
                    "recovery.reading_skipped",
                    round=reading.round,
                    node=reading.node,
                    value=reading.value,
                    reason=reason,
                )
                continue
            live.readings[reading.node] = reading.value
            self._observe(live, {reading.node: reading.value}, refit=False)
            if reading.node == self.model.reward_node:
                self.regret.observe_reward(reading.round, reading.value)
        snapshot = self.store.latest_snapshot(self.name)
        if snapshot is not None:
            state = {k: torch.from_numpy(v.copy()) for k, v in snapshot.arrays.items()}
            self.model.gp.load_state(state)
        for oracle in self.store.oracles(self.name):
            self.regret.observe_oracle(oracle.round, oracle.expected_reward, oracle.optimum)
        if self.spec.schedule.pipeline > 1:  # rounds still in flight are pending again
            for live in self.open_rounds:
                if not live.readings:
                    live.pending = self.model.add_pending(live.intervention)
        self.log.info(
            "experiment.recovered",
            rounds=len(rows),
            readings=len(readings),
            open_rounds=[r.number for r in self.open_rounds],
            snapshot=snapshot.id if snapshot else None,
            budget_spent=self.budget_spent(),
        )

    def _renew_expiries(self, rows: list[RoundRow], now: float) -> dict[int, float]:
        """A new expiry window for every unacknowledged open round: round -> expires_at.

        Like the ack timers, the window restarts with this life (so what the broker queued for
        the session is read before the round can expire). Moving an expiry later is always
        safe — the agent only waits longer before it releases the reservation — and it is
        stored before the action is published again with it.
        """
        fresh = now + self._ack_window()
        renewed = {}
        for row in rows:
            unacked = row.status in (RoundStatus.PROPOSED, RoundStatus.PUBLISHED)
            if unacked and (row.expires_at is None or row.expires_at < fresh):
                self.store.set_expires_at(self.name, row.round, fresh)
                renewed[row.round] = fresh
        return renewed

    def _ack_window(self) -> float:
        """How long an action may go unacknowledged: every ack timeout, retries included."""
        schedule = self.spec.schedule
        return schedule.ack_timeout_s * (schedule.ack_retries + 1)

    def _save_model_state(self) -> None:
        """Snapshot the GP state (hyperparameters, standardization) after a rebuild changed it."""
        arrays = {k: v.detach().cpu().numpy() for k, v in self.model.gp.state().items()}
        self.store.save_snapshot(
            self.name,
            self.store.last_reading_id(self.name),
            arrays,
            {"observations": self.model.gp.num_observations.tolist()},
        )

    # ------------------------------------------------------------------ state
    @property
    def next_round(self) -> int:
        return max(self.rounds, default=-1) + 1

    @property
    def open_rounds(self) -> list[LiveRound]:
        """Rounds not closed yet, in round order (a copy: safe to close them while iterating)."""
        return list(self._open.values())

    @property
    def in_flight(self) -> int:
        return len(self._open)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def budget_spent(self) -> float:
        return self.store.ledger(self.name).spent

    def can_propose(self, now: float) -> bool:
        """Whether a new round may start now (pipeline depth, round limit, rate limit)."""
        schedule = self.spec.schedule
        if self.finished or self.in_flight >= schedule.pipeline:
            return False
        if schedule.max_rounds is not None and self.next_round >= schedule.max_rounds:
            self._finish("max_rounds reached")
            return False
        if self._budget_exhausted():
            self._finish("budget spent: the rest pays for no action")
            return False
        if self._last_publish_at is not None and schedule.min_interval_s > 0:
            return now - self._last_publish_at >= schedule.min_interval_s
        return True

    def missing_readings(self) -> dict[int, list[str]]:
        """Acked rounds closed without every node's reading: round -> nodes still unread."""
        expected = set(self.model.order)
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
        return bool(fixed) and total - spent < min(fixed) - 1e-12

    def next_deadline(self, now: float) -> float:
        """Seconds until something is due (an ack or round timeout, or the rate limit)."""
        schedule = self.spec.schedule
        deadlines = [self._earliest_timer()]
        can_start = self.in_flight < schedule.pipeline and not self.finished
        if can_start and self._last_publish_at is not None and schedule.min_interval_s > 0:
            deadlines.append(self._last_publish_at + schedule.min_interval_s)
        return max(min(deadlines) - now, 0.0)

    def _earliest_timer(self) -> float:
        """A lower bound on the earliest timer of an open round (math.inf: none); O(1) unless a
        timer moved since the last call or the bound has passed."""
        if self._timer_floor is None:
            self._timer_floor = min(
                (t for live in self._open.values() for t in self._timers(live)), default=math.inf
            )
        return self._timer_floor

    def _timers(self, live: LiveRound) -> list[float]:
        """When `due` has something to do for this round (the same conditions it checks)."""
        schedule = self.spec.schedule
        if live.status is RoundStatus.PUBLISHED and live.published_at is not None:
            timers = [live.published_at + schedule.ack_timeout_s]
            if live.retry_at is not None:
                timers.append(live.retry_at)
            if live.action.expires_at is not None:
                timers.append(live.action.expires_at)
            return timers
        if live.status is RoundStatus.ACKED and live.acked_at is not None:
            return [live.acked_at + schedule.round_timeout_s]
        return []

    def _timers_moved(self) -> None:
        self._timer_floor = None

    # ------------------------------------------------------------------ decisions
    def propose(self) -> LiveRound | None:
        """Choose the next intervention, reserve its cost and record it; None when finished.

        Runs the policy (seconds, maybe): the runtime calls it in a worker thread and makes sure
        nothing else touches this experiment meanwhile.
        """
        started = time.perf_counter()
        number = self.next_round
        policy = self.explorer if number < self.spec.initial_design.rounds else self.policy
        constraints = Constraints.from_spec(self.spec, spent=self.budget_spent())
        try:
            proposal, chosen_by = self._ask(policy, constraints)
            vetted, chosen_by = self._admissible(proposal, chosen_by, constraints)
        except NothingAffordable as reason:
            self._finish(f"nothing affordable: {reason}")
            return None
        except Violation as violation:
            self._finish(f"no admissible proposal: {violation}")
            return None
        policy_s = time.perf_counter() - started
        self._bound_regret(vetted.intervention)
        return self._record(number, proposal, vetted, chosen_by.name, policy_s)

    def _ask(self, policy: Policy, constraints: Constraints) -> tuple[Proposal, Policy]:
        """The policy's proposal and the policy; should it fail (raise, or propose a NaN
        value), the explorer's: a numerical accident in one acquisition never stops the service."""
        try:
            proposal = policy.propose(self.model, constraints, self.rng)
            bad = sorted(k for k, v in proposal.intervention.items() if math.isnan(v))
            if bad:
                raise ValueError(f"{policy.name} proposed NaN for {bad}")
            return proposal, policy
        except NothingAffordable:
            raise
        except Exception:
            if policy is self.explorer:
                raise
            self.log.exception("policy.failed", policy=policy.name, fallback=self.explorer.name)
            return self.explorer.propose(self.model, constraints, self.rng), self.explorer

    def _admissible(
        self, proposal: Proposal, policy: Policy, constraints: Constraints
    ) -> tuple[Vetted, Policy]:
        """The proposal as it will be published, checked; else the explorer's, checked.

        Defense in depth: the policies keep the constraints, and this check keeps them should a
        policy not (a bug). A violating proposal is logged and counted, and the explorer
        proposes instead, as for a failing policy.

        Raises:
            Violation: the explorer's proposal violates too (the round is not published).
            ValueError: the explorer proposed an action the spec does not declare.
        """
        try:
            return self._vet(proposal, constraints), policy
        except Violation as violation:
            self._refuse(policy, proposal, violation)
            if policy is not self.explorer:
                fallback = self.explorer.propose(self.model, constraints, self.rng)
                return self._admissible(fallback, self.explorer, constraints)
            if violation.reason == "unknown_action":
                raise ValueError(violation.detail) from None
            raise

    def _vet(self, proposal: Proposal, constraints: Constraints) -> Vetted:
        """`vet` of the proposal, logging every value the clamp moved."""
        vetted = vet(self.spec, proposal.intervention, constraints)
        for name, value in proposal.intervention.items():
            if vetted.intervention[name] != value:
                self.log.warning(
                    "action.clamped", action=name, proposed=value, sent=vetted.intervention[name]
                )
        return vetted

    def _refuse(self, policy: Policy, proposal: Proposal, violation: Violation) -> None:
        self.log.warning(
            "proposal.rejected",
            policy=policy.name,
            reason=violation.reason,
            detail=violation.detail,
            intervention=proposal.intervention,
            reported_cost=proposal.cost,
            fallback=None if policy is self.explorer else self.explorer.name,
        )
        if self.metrics:
            self.metrics.proposal_rejected(self.name, violation.reason)

    def _bound_regret(self, intervention: dict[str, float]) -> None:
        """Add this round's model-based regret bound: UCB at the best candidate − LCB here."""
        bound = regret_bound(self.model, intervention, self.rng)
        if bound is not None:
            self.regret.add_upper_increment(*bound)

    def _record(
        self, number: int, proposal: Proposal, vetted: Vetted, policy: str, policy_s: float
    ) -> LiveRound | None:
        now = self.clock()
        action = Action.issue(
            self.name,
            number,
            vetted.intervention,
            kind=self.spec.intervention,
            at=now,
            expires_at=now + self._ack_window(),
        )
        if not math.isclose(vetted.cost, proposal.cost, rel_tol=1e-9, abs_tol=1e-9):
            self.log.warning(
                "proposal.cost_corrected", round=number, reported=proposal.cost, cost=vetted.cost
            )
        try:
            with self.store.transaction():
                self.store.add_round(
                    self.name,
                    number,
                    action.action_id,
                    action.intervention,
                    list(vetted.target_set),
                    vetted.cost,
                    self.spec.intervention,
                    now,
                    expires_at=action.expires_at,
                )
                self.store.reserve(
                    self.name, number, vetted.cost, self.spec.constraints.budget_total, now
                )
        except BudgetExceeded as reason:
            self._finish(f"budget exhausted: {reason}")
            return None
        live = LiveRound(
            number=number,
            action=action,
            target_set=vetted.target_set,
            cost=vetted.cost,
            acquisition=proposal.acquisition_value,
            policy=policy,
            model_round=self.model.start_round(action.intervention),
            proposed_at=now,
        )
        self.rounds[number] = live
        self._open[number] = live
        if self.spec.schedule.pipeline > 1:  # other rounds will be proposed before this returns
            live.pending = self.model.add_pending(live.intervention)
        if self.metrics:
            self.metrics.observe_policy(self.name, policy_s)
            self._export_budget()
        self.log.info(
            "round.proposed",
            round=number,
            policy=policy,
            intervention=live.intervention,
            cost=vetted.cost,
            acquisition=proposal.acquisition_value,
            policy_s=round(policy_s, 4),
            expires_at=action.expires_at,
            diagnostics=_short(proposal.diagnostics),
        )
        self.on_event(
            RoundEvent("proposed", self.name, number, live.intervention, decision_seconds=policy_s)
        )
        return live

    def mark_published(self, number: int) -> None:
        """The action left for the broker (QoS 1 handed over)."""
        live = self.rounds[number]
        now = self.clock()
        first = live.published_at is None
        live.published_at = now
        self._timers_moved()
        self._last_publish_at = now
        if live.status is RoundStatus.PROPOSED:
            live.status = RoundStatus.PUBLISHED
            with self.store.transaction():
                self.store.set_round_status(self.name, number, RoundStatus.PUBLISHED, now)
                self.store.bump_attempt(self.name, number)  # the store counts publications
        latency = None
        if first and self._last_close_at is not None:
            latency = now - self._last_close_at
            if self.metrics:
                self.metrics.observe_decision(self.name, latency)
        self.log.info(
            "round.published", round=number, attempt=live.action.attempt, decision_latency_s=latency
        )
        self.on_event(
            RoundEvent(
                "published", self.name, number, live.intervention, decision_latency_s=latency
            )
        )

    def republish(self, number: int) -> Action:
        """The same action (same id) with the next attempt number, recorded before sending."""
        live = self.rounds[number]
        now = self.clock()
        live.action = live.action.next_attempt(at=now)
        live.published_at = now  # the ack timeout restarts with every publication
        self._timers_moved()
        self.store.bump_attempt(self.name, number)
        return live.action

    # ------------------------------------------------------------------ feedback
    def on_ack(self, ack: Ack) -> Verdict:
        live = self.rounds.get(ack.round)
        if live is None or live.action.action_id != ack.action_id:
            return Verdict("rejected", "unknown_round")
        if live.status in (RoundStatus.ACKED, RoundStatus.CLOSED):
            return Verdict("duplicate")
        if live.status is RoundStatus.EXPIRED and ack.status == "applied":
            return self._applied_after_expiry(live, ack)
        if not live.is_open:
            return Verdict("late")
        now = self.clock()
        if ack.status == "rejected" and ack.reason == BUSY:
            live.retry_at = now + BUSY_RETRY_S  # the device will take it when it has room
            self._timers_moved()
            return Verdict("accepted")
        if ack.status == "rejected":
            self._end(live, RoundStatus.REJECTED, now, f"device rejected: {ack.reason}")
            return Verdict("accepted")
        applied = self._applied(live, ack)
        with self.store.transaction():
            self.store.set_round_status(self.name, live.number, RoundStatus.ACKED, now)
            self.store.settle(self.name, live.number, now)
            if applied is not None:
                self.store.set_applied(self.name, live.number, applied)
        live.status, live.acked_at = RoundStatus.ACKED, now
        self._timers_moved()
        if applied is not None:
            self.model.history[live.model_round].intervention = applied
        self._maybe_close(live, now)
        return Verdict("accepted")

    def _applied(self, live: LiveRound, ack: Ack) -> dict[str, float] | None:
        """What the device applied, when it differs from the action (clamped, say) and names
        only declared actions; None otherwise. The model learns from what happened."""
        if not ack.applied or ack.applied == live.action.intervention:
            return None
        unknown = sorted(set(ack.applied) - set(self.spec.action_names))
        if unknown:
            self.log.warning(
                "ack.applied_ignored", round=live.number, applied=ack.applied, unknown=unknown
            )
            return None
        self.log.info(
            "ack.applied_differs",
            round=live.number,
            sent=live.action.intervention,
            applied=ack.applied,
        )
        return dict(ack.applied)

    def _applied_after_expiry(self, live: LiveRound, ack: Ack) -> Verdict:
        """An "applied" ack for a round the agent had given up on: the action happened, so it
        is paid for (charged again, past the budget if need be) and the model learns it."""
        if live.acked_at is not None:
            return Verdict("duplicate")
        now = self.clock()
        applied = self._applied(live, ack)
        with self.store.transaction():
            charged = self.store.charge(self.name, live.number, now)
            if applied is not None:
                self.store.set_applied(self.name, live.number, applied)
        live.acked_at = now
        if applied is not None:
            self.model.history[live.model_round].intervention = applied
        if charged:
            expires_at = live.action.expires_at
            late = expires_at is not None and ack.at >= expires_at
            self._overspent(live, "applied_after_expiry" if late else "ack_after_expiry", ack.at)
        return Verdict("late")

    def _overspent(self, live: LiveRound, reason: str, applied_at: float | None) -> None:
        """Log and count a cost charged after its round expired (see `_applied_after_expiry`)."""
        total = self.spec.constraints.budget_total
        spent = self.budget_spent()
        self.log.warning(
            "budget.device_overspend",
            round=live.number,
            reason=reason,
            cost=live.cost,
            expires_at=live.action.expires_at,
            applied_at=applied_at,
            budget_spent=spent,
            budget_total=total,
            over_budget=total is not None and spent > total,
        )
        if self.metrics:
            self.metrics.device_overspend(self.name, reason)
        self._export_budget()

    def on_readings(self, readings: Iterable[Reading]) -> list[Verdict]:
        """Join a batch of readings: store them, then update the model once per round.

        One durable commit per batch holds the readings and what teaching writes (round closes,
        model snapshots): a commit (an fsync) costs more than the rest of a small batch. Nothing
        is acknowledged to the broker before this returns, so should the commit fail, the
        broker still holds every reading of the batch for the next life.
        """
        now = self.clock()
        verdicts: list[Verdict] = []
        fresh: dict[int, dict[str, float]] = {}
        with self.store.transaction():
            for reading in readings:
                verdict = self._admit(reading, fresh, now)
                verdicts.append(verdict)
            if fresh:
                self._teach([(self.rounds[n], values) for n, values in fresh.items()], now)
        return verdicts

    def _admit(self, reading: Reading, fresh: dict[int, dict[str, float]], now: float) -> Verdict:
        live = self.rounds.get(reading.round)
        if live is None:
            return Verdict("rejected", "unknown_round")
        if reading.node not in self.model.inputs:
            return Verdict("rejected", "unknown_node")
        if live.status is RoundStatus.REJECTED:
            return Verdict("rejected", "stale_round")  # the device refused the action
        bad = self._implausible(reading.node, reading.value)
        if bad:
            return Verdict("rejected", bad)
        if reading.node in live.readings or reading.node in fresh.get(live.number, {}):
            return Verdict("duplicate")
        stored = self.store.add_reading(
            self.name,
            reading.round,
            reading.node,
            reading.value,
            reading.seq,
            reading.device_id,
            now,
        )
        if not stored:
            return Verdict("duplicate")
        fresh.setdefault(live.number, {})[reading.node] = reading.value
        if live.status is RoundStatus.EXPIRED:
            # readings of an action the agent had given up on: it was applied after all
            if self.store.charge(self.name, live.number, now):
                self._overspent(live, "readings_after_expiry", None)
            return Verdict("late")
        return Verdict("late" if live.status is RoundStatus.CLOSED else "accepted")

    def _implausible(self, node_name: str, value: float) -> str:
        """A reason to reject a value, else ''.

        Outside the node's declared `valid_range`, or — without one — farther from its typical
        range (`bounds`) than IMPLAUSIBLE_SPANS times that range's width: no sensor of a
        system described by the spec reads that, and such a value would only wreck the model.
        """
        node = self.spec.node(node_name)
        low, high = node.valid_range or node.bounds
        if node.valid_range is None:
            reach = IMPLAUSIBLE_SPANS * (high - low)
            low, high = low - reach, high + reach
        return "" if low <= value <= high else "out_of_range"

    def _observe(
        self, live: LiveRound, values: dict[str, float], *, refit: bool = True
    ) -> LearnReport | None:
        """Teach the model; a failure is logged, never fatal (the readings stay stored).

        Bad data that got past every check must not stop the service, nor — replayed from the
        store — its next start.
        """
        try:
            return self.model.observe(live.model_round, values, refit=refit)
        except Exception:
            self.log.exception("model.update_failed", round=live.number, readings=values)
            return None

    def _teach(self, batch: list[tuple[LiveRound, dict[str, float]]], now: float) -> None:
        """Teach the model the new readings of a batch's rounds, several with one block update.

        `NetworkModel.observe_many` reads each node's factor once for the whole batch instead of
        once per round; everything else happens per round. Should the block fail, the rounds
        are taught one by one: a bad row must not stop the others.
        """
        for live, values in batch:
            self._forget_pending(live)  # the real readings replace the round's pending points
            live.readings.update(values)
            live.last_reading_at = now
        if len(batch) == 1:
            self._teach_round(*batch[0], now)
            return
        started = time.perf_counter()
        try:
            report = self.model.observe_many([(live.model_round, v) for live, v in batch])
        except Exception:
            self.log.exception(
                "model.update_failed",
                rounds=[live.number for live, _ in batch],
                readings=[values for _, values in batch],
            )
            for live, values in batch:  # the readings are stored: teach what each round can
                self._teach_round(live, values, now)
            return
        self._taught([live for live, _ in batch], report, time.perf_counter() - started, now)

    def _teach_round(self, live: LiveRound, values: dict[str, float], now: float) -> None:
        started = time.perf_counter()
        report = self._observe(live, values)
        self._taught([live], report, time.perf_counter() - started, now)

    def _taught(
        self, lives: list[LiveRound], report: LearnReport | None, seconds: float, now: float
    ) -> None:
        """After a model update of `lives` (in order): metrics, snapshot, regret, round closes."""
        if report is None:  # the update failed (logged): only the round lifecycle goes on
            for live in lives:
                self._maybe_close(live, now)
            return
        if self.metrics:
            self.metrics.observe_gp_update(self.name, seconds)
            for node, count in zip(self.model.order, report_counts(self.model), strict=True):
                self.metrics.set_observations(self.name, node, count)
        if report.rebuilt:
            self._save_model_state()
        if report.refit:
            numbers = [live.number for live in lives]
            where = {"round": numbers[0]} if len(numbers) == 1 else {"rounds": numbers}
            self.log.info(
                "model.refit",
                **where,
                nodes=[self.model.order[j] for j in report.refit],
                failed=[self.model.order[j] for j in report.refit_failed],
            )
        for live in lives:
            # the reward as read, or composed from its components (a decomposed reward)
            reward = self.model.history[live.model_round].readings.get(self.model.reward_node)
            if reward is not None and self.regret.last_reward_round != live.number:
                self.regret.observe_reward(live.number, reward)
                self._export_regret()
            self._maybe_close(live, now)

    def on_oracle(self, oracle: Oracle) -> Verdict:
        live = self.rounds.get(oracle.round)
        if live is None or live.action.action_id != oracle.action_id:
            return Verdict("rejected", "unknown_round")
        if not self.regret.observe_oracle(oracle.round, oracle.expected_reward, oracle.optimum):
            return Verdict("duplicate")
        self.store.add_oracle(
            self.name,
            oracle.round,
            oracle.action_id,
            oracle.expected_reward,
            oracle.optimum,
            self.clock(),
        )
        self._export_regret()
        return Verdict("accepted")

    # ------------------------------------------------------------------ time
    def due(self, now: float) -> list[Action]:
        """Handle timeouts: actions to re-publish now (closed or expired rounds are handled)."""
        if now < self._earliest_timer():
            return []
        self._timers_moved()  # rounds re-published or closed below move the earliest timer
        schedule = self.spec.schedule
        again: list[Action] = []
        for live in self.open_rounds:
            if live.status is RoundStatus.PUBLISHED and live.published_at is not None:
                expires_at = live.action.expires_at
                if expires_at is not None and now >= expires_at:
                    self._end(live, RoundStatus.EXPIRED, now, "no ack by expires_at")
                    continue
                retry = live.retry_at is not None and now >= live.retry_at
                if now - live.published_at < schedule.ack_timeout_s and not retry:
                    continue
                live.retry_at = None
                self._timers_moved()
                if expires_at is None and live.action.attempt > schedule.ack_retries:
                    self._end(live, RoundStatus.EXPIRED, now, "no ack")
                else:  # until it expires, the action goes out again now and then
                    again.append(self.republish(live.number))
            elif (
                live.status is RoundStatus.ACKED
                and live.acked_at is not None
                and now - live.acked_at >= schedule.round_timeout_s
            ):
                self._close(live, now, "timeout")
        return again

    def _maybe_close(self, live: LiveRound, now: float) -> None:
        if live.status is RoundStatus.ACKED and set(self.model.order) <= set(live.readings):
            self._close(live, now, "complete")

    def _close(self, live: LiveRound, now: float, why: str) -> None:
        self._forget_pending(live)
        live.status, live.closed_at = RoundStatus.CLOSED, now
        self._open.pop(live.number, None)
        self.store.set_round_status(self.name, live.number, RoundStatus.CLOSED, now, why)
        self._last_close_at = live.last_reading_at if why == "complete" else now
        missing = sorted(set(self.model.order) - set(live.readings))
        if self.metrics:
            self.metrics.round_completed(self.name)
            if live.published_at is not None:
                self.metrics.observe_round_wait(self.name, now - live.published_at)
        self.log.info(
            "round.closed",
            round=live.number,
            why=why,
            missing=missing or None,
            reward=live.readings.get(self.model.reward_node),
        )
        self.on_event(
            RoundEvent(
                "closed",
                self.name,
                live.number,
                live.intervention,
                reward=live.readings.get(self.model.reward_node),
                expected_reward=self.regret.expected.get(live.number),
                cumulative_regret=self.regret.cumulative,
                regret_upper_estimate=self.regret.upper_estimate,
                detail=why,
            )
        )

    def _forget_pending(self, live: LiveRound) -> None:
        if live.pending is not None:
            self.model.drop_pending(live.pending)
            live.pending = None

    def _end(self, live: LiveRound, status: RoundStatus, now: float, why: str) -> None:
        self._forget_pending(live)
        with self.store.transaction():
            self.store.set_round_status(self.name, live.number, status, now, why)
            self.store.release(self.name, live.number, now)
        live.status, live.closed_at = status, now
        self._open.pop(live.number, None)
        self._export_budget()
        self.log.warning(f"round.{status}", round=live.number, why=why)
        self.on_event(
            RoundEvent(status.value, self.name, live.number, live.intervention, detail=why)
        )

    def _finish(self, reason: str) -> None:
        if self.finished_reason is None:
            self.finished_reason = reason
            self.log.info("experiment.finished", reason=reason)
            self.on_event(RoundEvent("finished", self.name, None, detail=reason))

    # ------------------------------------------------------------------ metrics
    def _export_budget(self) -> None:
        if not self.metrics:
            return
        spent = self.budget_spent()
        total = self.spec.constraints.budget_total
        remaining = math.inf if total is None else max(total - spent, 0.0)
        self.metrics.set_budget(self.name, spent=spent, remaining=remaining)

    def _export_regret(self) -> None:
        if not self.metrics:
            return
        tracker = self.regret
        if tracker.has_oracle:
            self.metrics.set_regret(self.name, cumulative=tracker.cumulative, simple=tracker.simple)
        if tracker.upper_estimate is not None:
            self.metrics.set_regret_upper_estimate(self.name, tracker.upper_estimate)
        if tracker.last_reward is not None:
            self.metrics.set_reward(self.name, last=tracker.last_reward, best=tracker.best_reward)


def report_counts(model: NetworkModel) -> list[int]:
    return model.gp.num_observations.tolist()


def _short(diagnostics: dict) -> dict:
    """Diagnostics small enough for a log line."""
    return {k: v for k, v in diagnostics.items() if isinstance(v, int | float | str | bool)}
