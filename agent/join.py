"""Feedback join: readings and oracle values, matched to their rounds, stored, then learned.

A reading names its round and node; `agent.identity` has checked that its device may report
that node. It is dropped as a duplicate when the store has already
seen (device, node, seq) or the round already has that node; it teaches the model as soon as the
node's row is complete (its value and its parents' values), also after the round closed
("late"). A batch's new readings are taught in one block update, one round or several.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from agent import acks, telemetry
from agent.rounds import LiveRound, RoundStatus, Verdict
from connectors.schemas import Oracle, Reading
from connectors.store import NewReading
from core.gp import LearnReport
from core.spec import ExperimentSpec

if TYPE_CHECKING:
    from agent.experiment import Experiment

__all__ = [
    "IMPLAUSIBLE_SPANS",
    "ORACLE_SLACK",
    "implausible",
    "log_refit",
    "observe",
    "on_oracle",
    "on_readings",
    "oracle_problem",
    "save_snapshot",
]

IMPLAUSIBLE_SPANS = 1e6  # a reading this many typical ranges away is a fault, not data
# Relative room for a simulator's numerically searched optimum: E[y | a] may exceed it by this
# much (times max(1, |optimum|)) before the oracle message is refused.
ORACLE_SLACK = 1e-3

Fresh = dict[int, dict[str, Any]]  # round -> node -> value (an array node's: numpy), this batch


def on_readings(exp: Experiment, readings: Iterable[Reading]) -> list[Verdict]:
    """Join a batch of readings: store them, then update the model once per round.

    One durable commit per batch holds the readings and what teaching writes (round closes,
    model snapshots): a commit (an fsync) costs more than the rest of a small batch. The
    batch's new readings are stored with one statement (`Store.add_readings`); should one of
    them be stored already (a device repeating a sequence number the in-memory checks cannot
    see), that statement is undone and the batch is stored one reading at a time. Nothing is
    acknowledged to the broker before this returns, so should the commit fail, the broker
    still holds every reading of the batch for the next life.
    """
    now = exp.clock()
    readings = list(readings)
    fresh: Fresh = {}
    with exp.store.transaction():
        verdicts = _admit_batch(exp, readings, fresh, now)
        if verdicts is None:
            taken: set[tuple[int, str]] = set()
            verdicts = [_admit(exp, reading, fresh, taken, now) for reading in readings]
        if fresh:
            # the round timers run on the monotonic clock; the store took wall time
            _teach(exp, [(exp.rounds[n], values) for n, values in fresh.items()], exp.ticks())
    return verdicts


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A reading that passed every check but the store's: what storing and teaching need."""

    reading: Reading
    live: LiveRound
    value: Any  # float, or an array node's numpy array
    scalar: float  # the value, or the array's mean

    def row(self, now: float) -> NewReading:
        reading = self.reading
        return NewReading(
            reading.round,
            reading.node,
            self.scalar,
            reading.seq,
            reading.device_id,
            now,
            measured_at=reading.at,  # the device's clock: when it measured, beside when it came
            variance=reading.variance,
            replications=reading.replications,
            array=self.value if isinstance(self.value, np.ndarray) else None,
        )


def _admit_batch(
    exp: Experiment, readings: list[Reading], fresh: Fresh, now: float
) -> list[Verdict] | None:
    """Check every reading, store the new ones with one statement, and their verdicts; None
    (nothing written) if the store already held one of them."""
    checked: list[Verdict | _Candidate] = []
    taken: set[tuple[int, str]] = set()
    for reading in readings:
        outcome = _check(exp, reading, taken)
        if isinstance(outcome, _Candidate):
            taken.add((reading.round, reading.node))
        checked.append(outcome)
    candidates = [c for c in checked if isinstance(c, _Candidate)]
    if not exp.store.add_readings(exp.name, [c.row(now) for c in candidates]):
        return None
    return [c if isinstance(c, Verdict) else _stored(exp, c, fresh, now) for c in checked]


def _admit(
    exp: Experiment, reading: Reading, fresh: Fresh, taken: set[tuple[int, str]], now: float
) -> Verdict:
    """Check one reading and store it unless it is a duplicate; `fresh` collects new values,
    `taken` the (round, node) stored so far in this batch."""
    outcome = _check(exp, reading, taken)
    if isinstance(outcome, Verdict):
        return outcome
    if not exp.store.add_reading(exp.name, *outcome.row(now).arguments()):
        return Verdict("duplicate")
    taken.add((reading.round, reading.node))
    return _stored(exp, outcome, fresh, now)


def _check(exp: Experiment, reading: Reading, taken: set[tuple[int, str]]) -> Verdict | _Candidate:
    """A verdict for a reading that is not stored (rejected, or a duplicate the agent can see:
    its round has the node, or `taken` holds it), else what storing it needs."""
    live = exp.rounds.get(reading.round)
    if live is None:
        return Verdict("rejected", "unknown_round")
    if reading.node not in exp.model.inputs:
        return Verdict("rejected", "unknown_node")
    rejected = live.status is RoundStatus.REJECTED and live.acked_at is None
    from_actuator = reading.device_id == exp.spec.actuator_id
    if rejected and not from_actuator:
        # the actuator refused the action: another sensor's value shows no intervention
        return Verdict("rejected", "stale_round")
    value: Any = reading.value
    if reading.array is not None or exp.spec.node(reading.node).is_array:
        array, bad = array_value(exp.spec, reading)
        value, scalar = array, float(array.mean()) if array is not None else 0.0
    else:
        scalar = float(reading.value)  # type: ignore[arg-type]
        bad = implausible(exp.spec, reading.node, scalar)
    if bad:
        return Verdict("rejected", bad)
    if reading.states is not None and (bad := _states_problem(exp, reading)):
        return Verdict("rejected", bad)
    if reading.node in live.readings or (live.number, reading.node) in taken:
        return Verdict("duplicate")
    return _Candidate(reading, live, value, scalar)


def _states_problem(exp: Experiment, reading: Reading) -> str:
    """Why a reading's visited states are refused, else '': only the reward's reading carries
    them, for a policy that takes them (`Policy.states_shape`), in its (agents, obs)."""
    shape = exp.policy.states_shape()
    if shape is None or reading.node != exp.spec.reward.node:
        return "unexpected_states"
    assert reading.states is not None
    return "" if tuple(reading.states.shape[1:]) == shape else "wrong_shape"


def _stored(exp: Experiment, candidate: _Candidate, fresh: Fresh, now: float) -> Verdict:
    """A reading just stored: charge a round given up on, note replications, keep its value
    in `fresh` for teaching; its verdict."""
    reading, live = candidate.reading, candidate.live
    given_up = live.status in (RoundStatus.EXPIRED, RoundStatus.REJECTED)
    # Readings of an action the agent had given up on (expired), or the actuator's own readings
    # of one it said it would not apply (rejected): it was applied after all, so it is paid for
    # — charged before a partial trial settles what it used.
    if given_up and exp.store.charge(exp.name, live.number, now):
        expired = live.status is RoundStatus.EXPIRED
        why = "readings_after_expiry" if expired else "readings_after_rejection"
        acks.overspent(exp, live, why, None)
    if reading.variance is not None or reading.replications is not None:
        _replicated(exp, live, reading.node, reading.variance, reading.replications, now)
    fresh.setdefault(live.number, {})[reading.node] = candidate.value
    if reading.states is not None:
        states = reading.states.to_numpy()
        # in the batch's transaction, beside the reading: recovery replays both or neither
        if exp.store.add_states(exp.name, live.number, reading.device_id, states, now):
            exp.policy.observe_states(live.number, states)
    if given_up:
        return Verdict("late")
    return Verdict("late" if live.status is RoundStatus.CLOSED else "accepted")


def _replicated(
    exp: Experiment,
    live: LiveRound,
    node: str,
    variance: float | None,
    replications: int | None,
    now: float,
) -> None:
    """A mean over replications: the model learns it with its own noise, and a reward that
    averages fewer replications than were asked (q' < q) is charged q'·τ, the rest released."""
    exp.model.note_replications(live.model_round, node, variance, replications)
    fidelity = exp.spec.fidelity
    if fidelity is None or replications is None or node != exp.spec.reward.node:
        return
    asked = live.intervention.get(fidelity.replications_action, 0.0)
    if replications < asked:
        used = fidelity.cost(live.intervention.get(fidelity.action, 0.0), replications)
        exp.store.settle_used(exp.name, live.number, used, now)
        live.log.info("round.partial", replications=replications, asked=asked, cost=used)


def implausible(spec: ExperimentSpec, node_name: str, value: float) -> str:
    """A reason to reject a value, else ''.

    Outside the node's declared `valid_range`, or — without one — farther from its typical
    range (`bounds`) than IMPLAUSIBLE_SPANS times that range's width: no sensor of a
    system described by the spec reads that, and such a value would only wreck the model.
    """
    node = spec.node(node_name)
    low, high = node.valid_range or node.bounds
    if node.valid_range is None:
        reach = IMPLAUSIBLE_SPANS * (high - low)
        low, high = low - reach, high + reach
    return "" if low <= value <= high else "out_of_range"


def array_value(spec: ExperimentSpec, reading: Reading) -> tuple[np.ndarray | None, str]:
    """An array node's reading and '' — or None and why it is rejected: a scalar for an array
    node (`not_an_array`), an array for a scalar node (`unexpected_array`), another shape than
    the spec's (`wrong_shape`), an element outside the node's range (`out_of_range`, as
    `implausible` for a scalar). NaN and oversized arrays never get here: the codec refuses
    them (`invalid`, `oversized`)."""
    node = spec.node(reading.node)
    if reading.array is None:
        return None, "not_an_array"
    if node.shape is None:
        return None, "unexpected_array"
    array = reading.array.to_numpy()
    if list(array.shape) != list(node.shape):
        return None, "wrong_shape"
    low, high = node.valid_range or node.bounds
    if node.valid_range is None:
        reach = IMPLAUSIBLE_SPANS * (high - low)
        low, high = low - reach, high + reach
    if not bool(((array >= low) & (array <= high)).all()):
        return None, "out_of_range"
    return array, ""


def observe(
    exp: Experiment, live: LiveRound, values: dict[str, Any], *, refit: bool = True
) -> LearnReport | None:
    """Teach the model; a failure is logged, never fatal (the readings stay stored).

    Bad data that got past every check must not stop the service, nor — replayed from the
    store — its next start.
    """
    try:
        return exp.model.observe(live.model_round, values, refit=refit)
    except Exception:
        live.log.exception("model.update_failed", readings=values)
        return None


def _teach(exp: Experiment, batch: list[tuple[LiveRound, dict[str, Any]]], now: float) -> None:
    """Teach the model the new readings of a batch's rounds, several with one block update.

    `NetworkModel.observe_many` reads each node's factor once for the whole batch instead of
    once per round; everything else happens per round. Should the block fail, the rounds
    are taught one by one: a bad row must not stop the others.
    """
    for live, values in batch:
        exp.forget_pending(live)  # the real readings replace the round's pending points
        # an array node's entry is its mean: the round's record for logs and completeness
        live.readings.update(
            {k: float(v.mean()) if isinstance(v, np.ndarray) else v for k, v in values.items()}
        )
        live.last_reading_at = now
    if len(batch) == 1:
        _teach_round(exp, *batch[0], now)
        return
    started = time.perf_counter()
    try:
        report = exp.model.observe_many([(live.model_round, v) for live, v in batch])
    except Exception:
        exp.log.exception(
            "model.update_failed",
            rounds=[live.number for live, _ in batch],
            readings=[values for _, values in batch],
        )
        for live, values in batch:  # the readings are stored: teach what each round can
            _teach_round(exp, live, values, now)
        return
    _taught(exp, [live for live, _ in batch], report, time.perf_counter() - started, now)


def _teach_round(exp: Experiment, live: LiveRound, values: dict[str, Any], now: float) -> None:
    started = time.perf_counter()
    report = observe(exp, live, values)
    _taught(exp, [live], report, time.perf_counter() - started, now)


def _taught(
    exp: Experiment, lives: list[LiveRound], report: LearnReport | None, seconds: float, now: float
) -> None:
    """After a model update of `lives` (in order): metrics, snapshot, regret, round closes."""
    if report is None:  # the update failed (logged): only the round lifecycle goes on
        for live in lives:
            exp.maybe_close(live, now)
        return
    telemetry.model_updated(exp, seconds, report.surprise.tolist())
    if report.changed:
        telemetry.model_changed(exp, report.changed, [live.number for live in lives])
    if report.rebuilt:
        save_snapshot(exp)
    if report.refit:
        log_refit(exp, report, lives)
    for live in lives:
        # the reward as read, or composed from its components (a decomposed reward)
        reward = exp.model.history[live.model_round].readings.get(exp.model.reward_node)
        if reward is not None and exp.regret.last_reward_round != live.number:
            exp.regret.observe_reward(live.number, reward)
            telemetry.export_regret(exp)
        exp.maybe_close(live, now)


def save_snapshot(exp: Experiment) -> None:
    """Store the GP state (hyperparameters, standardization) a rebuild changed: a restart
    (`agent.recovery`) replays the readings without refitting and loads this state after."""
    arrays = {k: v.detach().cpu().numpy() for k, v in exp.model.gp.state().items()}
    exp.store.save_snapshot(
        exp.name,
        exp.store.last_reading_id(exp.name),
        arrays,
        {"observations": exp.model.gp.num_observations.tolist()},
    )


def log_refit(
    exp: Experiment,
    report: LearnReport,
    lives: list[LiveRound] | None = None,
    fit_s: float | None = None,
) -> None:
    """One event per refit, bound to its round, or naming the batch's rounds (none: a refit
    run beside the loop, `agent.refits`, which reports how long its worker took)."""
    if lives is None:
        log = exp.log.bind(background=True, fit_s=fit_s)
    elif len(lives) == 1:
        log = lives[0].log
    else:
        log = exp.log.bind(rounds=[r.number for r in lives])
    log.info(
        "model.refit",
        nodes=[exp.model.order[j] for j in report.refit],
        failed=[exp.model.order[j] for j in report.refit_failed],
    )


def oracle_problem(exp: Experiment, expected: float, optimum: float) -> str:
    """A reason to refuse oracle values that break their own definition, else ''.

    The optimum is the maximum of E[y | a] over every admissible action, so no action's
    expected reward lies above it (beyond ORACLE_SLACK, for a simulator's numerical search).
    For a stationary system (`reward.optimum: fixed`) it is one number for the whole
    experiment; for one declared to drift (`per_round`) it is the message's own round's, so it
    may differ from round to round and each round's E[y] is held to its own. Both are values
    of the reward node, so they are held to its plausible range like a reading
    (`implausible`). (Non-finite numbers never get this far: the schema refuses them.)
    """
    reward = exp.spec.reward.node
    if implausible(exp.spec, reward, expected) or implausible(exp.spec, reward, optimum):
        return "out_of_range"
    if not all(map(math.isfinite, (expected, optimum))):  # a stored row, say
        return "out_of_range"
    if expected > optimum + ORACLE_SLACK * max(1.0, abs(optimum)):
        return "oracle_above_optimum"
    known = None if exp.regret.per_round else exp.regret.optimum
    if known is not None and abs(optimum - known) > ORACLE_SLACK * max(1.0, abs(known)):
        return "oracle_optimum_changed"
    return ""


def on_oracle(exp: Experiment, oracle: Oracle) -> Verdict:
    """A simulator's E[y | action] for a round (true regret): checked, stored once, exported.

    `agent.identity` has checked that its device is an oracle of the experiment.
    """
    live = exp.rounds.get(oracle.round)
    if live is None or live.action.action_id != oracle.action_id:
        return Verdict("rejected", "unknown_round")
    if exp.regret.expected.get(oracle.round) is not None:
        return Verdict("duplicate")
    problem = oracle_problem(exp, oracle.expected_reward, oracle.optimum)
    if problem:
        return Verdict("rejected", problem)
    if not exp.regret.observe_oracle(oracle.round, oracle.expected_reward, oracle.optimum):
        return Verdict("duplicate")
    exp.store.add_oracle(
        exp.name,
        oracle.round,
        oracle.action_id,
        oracle.expected_reward,
        oracle.optimum,
        exp.clock(),
    )
    telemetry.export_regret(exp)
    return Verdict("accepted")
