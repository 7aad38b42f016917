"""Rebuild an experiment from the store: same rounds, same budget, same model.

Every accepted input is stored before it changes the model or the ledger, so replaying the
store in arrival order brings a restarted agent back to where it stopped: rounds with their
status, readings taught (without refits), the last GP state snapshot, oracle values, and the
pending points of rounds still in flight.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from agent import join
from agent.decide import packed_vectors
from agent.rounds import OPEN_STATUSES, LiveRound, RoundStatus
from agent.timers import ack_window
from connectors.schemas import Action
from connectors.store import RoundRow, Snapshot

if TYPE_CHECKING:
    from agent.experiment import Experiment

__all__ = [
    "STRUCTURAL_FIELDS",
    "check_same_experiment",
    "recover",
    "start_windows",
    "stored_action",
]

# Parts of a spec that define what the stored data mean; a restart may change the rest.
STRUCTURAL_FIELDS = (
    "intervention",
    "nodes",
    "actions",
    "target_sets",
    "candidates",
    "reward",
    "model",
)


# Structural fields added since experiments were first stored, with the value a spec stored
# before them meant: (section, field) -> value.
_ADDED_DEFAULTS = {("reward", "optimum"): "fixed"}


def check_same_experiment(exp: Experiment) -> None:
    """Refuse to continue a stored experiment whose graph or model the spec has changed."""
    stored = exp.store.experiment_spec(exp.name)
    if stored is None:
        return
    stored = dict(stored)
    for (section, field), value in _ADDED_DEFAULTS.items():
        if isinstance(stored.get(section), dict) and field not in stored[section]:
            stored[section] = {**stored[section], field: value}
    current = exp.spec.model_dump(mode="json", by_alias=True)
    changed = [key for key in STRUCTURAL_FIELDS if stored.get(key) != current.get(key)]
    if changed:
        raise ValueError(
            f"experiment {exp.name!r} exists in the store with different {changed}; "
            "give the changed experiment a new name (or use a new store)"
        )


def recover(exp: Experiment) -> None:
    """Continue a stored experiment: same rounds, same budget, same model."""
    rows = exp.store.rounds(exp.name)
    if not rows:
        return
    # Timers ran while the agent was down; they restart now, so that what the broker queued for
    # this session (acks, readings) is read before a round can expire or time out — and an
    # unacknowledged round's expiry window starts again with the first broker session
    # (`start_windows`): its ack may be queued for a session this life does not have yet.
    now = exp.clock()
    with exp.store.transaction():
        expiries = _renew_expiries(exp, rows, now)
    for row in rows:  # by round number, so open rounds stay in round order
        exp.track(_live_round(exp, row, expiries.get(row.round, row.expires_at)))
    published = [row.proposed_at for row in rows if row.attempt > 0]
    if published:  # the rate limit holds across restarts (a crash loop must not flood)
        exp.last_publish_at = exp.tick_of(max(published))
    resumed = _resume_kept_rows(exp)
    readings = _replay_readings(exp)
    _replay_states(exp)
    snapshot = _load_snapshot(exp, load=not resumed)
    for oracle in exp.store.oracles(exp.name):
        # stored by an agent that did not check them yet: the same checks as a live message
        problem = join.oracle_problem(exp, oracle.expected_reward, oracle.optimum)
        if problem:
            exp.log.warning("oracle.skipped", round=oracle.round, reason=problem)
            continue
        exp.regret.observe_oracle(oracle.round, oracle.expected_reward, oracle.optimum)
    if exp.spec.schedule.pipeline > 1:  # rounds still in flight are pending again
        for live in exp.open_rounds:
            if not live.readings:
                live.pending = exp.model.add_pending(live.intervention, live.model_round)
    exp.log.info(
        "experiment.recovered",
        rounds=len(rows),
        readings=readings,
        open_rounds=[r.number for r in exp.open_rounds],
        snapshot=snapshot.id if snapshot else None,
        budget_spent=exp.budget_spent(),
    )


def start_windows(exp: Experiment) -> list[int]:
    """Start the expiry windows of the recovered, unacknowledged rounds: this life's first
    broker session is up, its subscriptions acknowledged, so the acks the broker queued for
    the agent while it was down can arrive now (the runtime calls this then; worker thread).
    Returns the rounds whose windows started.

    Until then none of those rounds' timers runs (`LiveRound.awaits_session`, `agent.timers`):
    a window started at recovery could run out before the session that delivers the queued
    ack exists (a broker slow to answer, a connection retried), the round then expire — its
    reservation released and another round afforded — and the ack come after it, an
    overspend. Each window is now + `ack_window`, stored before the action goes out again with
    it (on the session's "reconnected", or a proposed round's first publication); never
    earlier than the one recovery gave it (`_renew_expiries`: moving an expiry later only
    makes the agent wait longer).
    """
    held = [live for live in exp.open_rounds if live.awaits_session]
    if not held:
        return []
    fresh = exp.clock() + ack_window(exp.spec.schedule)
    with exp.store.transaction():
        for live in held:
            if live.action.expires_at is None or live.action.expires_at < fresh:
                exp.store.set_expires_at(exp.name, live.number, fresh)
                live.action = live.action.model_copy(update={"expires_at": fresh})
                live.expires_tick = exp.tick_of(fresh)
    for live in held:
        live.awaits_session = False
    exp.open.timers_moved()
    exp.log.info(
        "recovery.windows_started", rounds=[live.number for live in held], expires_at=fresh
    )
    return [live.number for live in held]


def _renew_expiries(exp: Experiment, rows: list[RoundRow], now: float) -> dict[int, float]:
    """A new expiry window for every unacknowledged open round: round -> expires_at.

    The window restarts with this life, and again when its first broker session is up
    (`start_windows`; no timer of the round runs before that): a fleet replica taking the
    experiment over asks the device again with this one (`agent.fleet`), before its driver
    starts the windows. Moving an expiry later is always safe — the agent only waits longer
    before it releases the reservation — and it is stored before the action is published
    again with it.
    """
    fresh = now + ack_window(exp.spec.schedule)
    renewed = {}
    for row in rows:
        unacked = row.status in (RoundStatus.PROPOSED, RoundStatus.PUBLISHED)
        if unacked and (row.expires_at is None or row.expires_at < fresh):
            exp.store.set_expires_at(exp.name, row.round, fresh)
            renewed[row.round] = fresh
    return renewed


def stored_action(exp: Experiment, row: RoundRow, expires_at: float | None) -> Action:
    """The action a stored round sent (or will send), as the agent and its devices see it."""
    return Action(
        experiment=exp.name,
        round=row.round,
        action_id=row.action_id,
        intervention=row.intervention,
        kind=row.kind,
        issued_at=row.proposed_at,
        attempt=max(row.attempt, 1),
        expires_at=expires_at,
        vectors=packed_vectors(exp.spec),
    )


def _live_round(exp: Experiment, row: RoundRow, expires_at: float | None) -> LiveRound:
    """The stored round as the agent tracks it; its model round starts from what was applied.
    Its timers restart now, on the monotonic clock."""
    now = exp.ticks()
    status = RoundStatus(row.status)
    action = stored_action(exp, row, expires_at)
    # the model learns from what the device reported applied (clamped, say)
    applied = row.applied if row.applied is not None else row.intervention
    unacked = status in (RoundStatus.PROPOSED, RoundStatus.PUBLISHED)
    return LiveRound(
        number=row.round,
        action=action,
        target_set=tuple(row.target_set),
        cost=row.cost,
        acquisition=math.nan,
        policy="(recovered)",
        model_round=exp.model.start_round(applied),
        status=status,
        proposed_at=row.proposed_at,
        published_at=now if row.attempt > 0 else None,
        acked_at=now if status is RoundStatus.ACKED else None,
        closed_at=exp.tick_of(row.status_at) if status not in OPEN_STATUSES else None,
        awaits_session=unacked,
    )


def _replay_readings(exp: Experiment) -> int:
    """Teach the stored readings again, in arrival order: every node learns what it learned
    before. Returns how many were stored."""
    readings = exp.store.readings(exp.name)
    for reading in readings:
        live = exp.rounds[reading.round]
        if reading.is_array:  # the join checked it against the spec before storing it
            live.readings[reading.node] = reading.value
            join.observe(exp, live, {reading.node: reading.array()}, refit=False)
            continue
        if reason := join.implausible(exp.spec, reading.node, reading.value):
            # stored by an older, laxer agent: skipped, as the join would reject it today
            live.log.warning(
                "recovery.reading_skipped", node=reading.node, value=reading.value, reason=reason
            )
            continue
        live.readings[reading.node] = reading.value
        if reading.variance is not None or reading.replications is not None:
            exp.model.note_replications(
                live.model_round, reading.node, reading.variance, reading.replications
            )
        join.observe(exp, live, {reading.node: reading.value}, refit=False)
        if reading.node == exp.model.reward_node:
            exp.regret.observe_reward(reading.round, reading.value)
    return len(readings)


def _replay_states(exp: Experiment) -> None:
    """Hand the policy the stored traces of visited states again, in arrival order."""
    if exp.policy.states_shape() is None:
        return  # none were stored: the join refuses states such a policy does not take
    for row in exp.store.visited_states(exp.name):
        exp.policy.observe_states(row.round, row.array())


def _resume_kept_rows(exp: Experiment) -> bool:
    """A model whose rows depend on the hyperparameters of the moment — a budget
    (`model.capacity`) or a change detector (`model.change`) — starts from the rows the last
    snapshot kept, its counts and its change test (each node's CUSUM statistic), and the
    replay skips the readings those rows stand for: the replay then rebuilds the very state
    the agent had (its budget chosen, its changes dated with the hyperparameters of that
    snapshot), where a replay of every reading from scratch would choose with the initial
    ones and start each node's test again. True when the model was resumed from a snapshot
    (the replay then continued it: loading the snapshot again after it would set its refit
    schedule back by the readings replayed since)."""
    gp = exp.model.gp
    if gp is None or not gp.carries_rows:
        return False
    snapshot = exp.store.latest_snapshot(exp.name)
    if snapshot is None:
        return False
    gp.resume({k: torch.from_numpy(v.copy()) for k, v in snapshot.arrays.items()})
    return True


def _load_snapshot(exp: Experiment, *, load: bool = True) -> Snapshot | None:
    """Restore the GP state of the last snapshot (hyperparameters, standardization), if any
    (with `load` False only return it: the model was resumed from it)."""
    snapshot = exp.store.latest_snapshot(exp.name)
    if snapshot is not None and load:
        state = {k: torch.from_numpy(v.copy()) for k, v in snapshot.arrays.items()}
        exp.model.gp.load_state(state)
    return snapshot
