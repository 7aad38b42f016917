"""What an experiment reports outside: its Prometheus series and a `RoundEvent` per step.

The series exist only when the experiment was given `metrics` (the service always does; tests and
benchmarks may not); events go to its `on_event` sink (the demo's live view). Nothing here
changes the experiment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agent.rounds import LiveRound, RoundEvent, RoundStatus

if TYPE_CHECKING:
    from agent.experiment import Experiment

# `cbo_model_drift` counts a reading as a misfit beyond this many predictive standard deviations
# when the spec sets no `model.misfit_z` (the GP's own default).
DRIFT_Z = 4.0

__all__ = [
    "closed",
    "device_overspend",
    "ended",
    "export_budget",
    "export_regret",
    "finished",
    "model_changed",
    "model_updated",
    "policy_failed",
    "proposal_rejected",
    "proposed",
    "published",
]


def export_budget(exp: Experiment) -> None:
    if not exp.metrics:
        return  # reading the ledger costs a query: only for a series
    spent = exp.budget_spent()
    total = exp.spec.constraints.budget_total
    remaining = math.inf if total is None else max(total - spent, 0.0)
    exp.metrics.set_budget(exp.name, spent=spent, remaining=remaining)


def export_regret(exp: Experiment) -> None:
    if not exp.metrics:
        return
    tracker = exp.regret
    if tracker.has_oracle:
        exp.metrics.set_regret(exp.name, cumulative=tracker.cumulative, simple=tracker.simple)
    if tracker.upper_estimate is not None:
        exp.metrics.set_regret_upper_estimate(exp.name, tracker.upper_estimate)
    if tracker.last_reward is not None:
        exp.metrics.set_reward(exp.name, last=tracker.last_reward, best=tracker.best_reward)


def model_updated(exp: Experiment, seconds: float, surprise: Sequence[float] = ()) -> None:
    """A GP update took `seconds`; every node's observation count may have moved, and the nodes
    that learned (a finite `surprise`, |y − μ|/σ per node, their largest) were or were not
    surprised by what they learned (`cbo_model_drift`)."""
    if not exp.metrics:
        return
    exp.metrics.observe_gp_update(exp.name, seconds)
    counts = exp.model.gp.num_observations.tolist()
    for node, count in zip(exp.model.order, counts, strict=True):
        exp.metrics.set_observations(exp.name, node, count)
    threshold = exp.spec.model.misfit_z or DRIFT_Z
    for node, value in zip(exp.model.order, surprise, strict=False):
        if math.isfinite(value):
            exp.metrics.observe_fit(exp.name, node, value > threshold)


def model_changed(exp: Experiment, members: Sequence[int], rounds: Sequence[int]) -> None:
    """The change detector (`model.change`) of these node GPs raised an alarm while learning
    `rounds`: each forgot its readings from before the change and is due for a refit."""
    nodes = [exp.model.order[j] for j in members]
    exp.log.warning("model.change", nodes=nodes, rounds=list(rounds))
    if exp.metrics:
        for node in nodes:
            exp.metrics.observe_change(exp.name, node)


def proposal_rejected(exp: Experiment, reason: str) -> None:
    if exp.metrics:
        exp.metrics.proposal_rejected(exp.name, reason)


def policy_failed(exp: Experiment, policy: str, error: str) -> None:
    if exp.metrics:
        exp.metrics.policy_failed(exp.name, policy, error)


def device_overspend(exp: Experiment, reason: str) -> None:
    if exp.metrics:
        exp.metrics.device_overspend(exp.name, reason)


def proposed(exp: Experiment, live: LiveRound, policy_s: float) -> None:
    """The round was recorded and its cost reserved; the policy computed for `policy_s`."""
    if exp.metrics:
        exp.metrics.observe_policy(exp.name, policy_s)
    exp.on_event(
        RoundEvent("proposed", exp.name, live.number, live.intervention, decision_seconds=policy_s)
    )


def published(exp: Experiment, live: LiveRound, latency: float | None) -> None:
    """The action left; `latency` is the decision latency of its first publication (else None)."""
    if exp.metrics and latency is not None:
        exp.metrics.observe_decision(exp.name, latency)
    exp.on_event(
        RoundEvent(
            "published", exp.name, live.number, live.intervention, decision_latency_s=latency
        )
    )


def closed(exp: Experiment, live: LiveRound, now: float, why: str) -> None:
    if exp.metrics:
        exp.metrics.round_completed(exp.name)
        if live.published_at is not None:
            exp.metrics.observe_round_wait(exp.name, now - live.published_at)
    exp.on_event(
        RoundEvent(
            "closed",
            exp.name,
            live.number,
            live.intervention,
            reward=live.readings.get(exp.model.reward_node),
            expected_reward=exp.regret.expected.get(live.number),
            cumulative_regret=exp.regret.cumulative,
            regret_upper_estimate=exp.regret.upper_estimate,
            detail=why,
        )
    )


def ended(exp: Experiment, live: LiveRound, status: RoundStatus, why: str) -> None:
    """The round ended without closing (rejected, expired): its reservation was released."""
    export_budget(exp)
    exp.on_event(RoundEvent(status.value, exp.name, live.number, live.intervention, detail=why))


def finished(exp: Experiment, reason: str) -> None:
    exp.on_event(RoundEvent("finished", exp.name, None, detail=reason))
