"""The next round: ask the policy, fall back to the explorer, vet, record and reserve.

A policy that fails (raises, or proposes NaN) or proposes something the constraints forbid is
logged and the explorer (random search within the constraints) proposes instead: a numerical
accident or a bug in one acquisition never stops the service. Before reserving, the agent checks
what it will publish (the proposal clamped to the bounds) against the constraints, at the cost
it recomputes itself: a policy's bug cannot overspend.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from agent import recommend, telemetry
from agent.regret import regret_bound
from agent.rounds import LiveRound
from agent.timers import ack_window
from agent.vetting import Vetted, Violation, vet
from connectors.schemas import Action
from connectors.store import BudgetExceeded
from core.spec import ExperimentSpec
from policies.base import Constraints, NothingAffordable, Policy, Proposal

if TYPE_CHECKING:
    from agent.experiment import Experiment

__all__ = ["propose", "settle"]

ERROR_SUMMARY_CHARS = 300  # of a failing policy's error message, in its one log line


def propose(exp: Experiment, *, deferred: bool = False) -> LiveRound | None:
    """Choose the next intervention, reserve its cost and record it; None when finished.

    `deferred`: the model's part of the round — the regret estimate (tens of ms, most of a
    proposal's cost with a cheap policy), then starting its row and its pending point — is left
    to `settle`, which the runtime calls once the action is published: it is off the decision's
    critical path, and computed on the same model as here (nothing touches the experiment in
    between: its driver awaits the publication, then settles before anything else).
    """
    started = time.perf_counter()
    number = exp.next_round
    policy = exp.explorer if number < exp.spec.design_rounds else exp.policy
    constraints = Constraints.from_spec(exp.spec, spent=exp.budget_spent())
    try:
        proposal, chosen_by = _ask(exp, policy, constraints)
        vetted, chosen_by = _admissible(exp, proposal, chosen_by, constraints)
    except NothingAffordable as reason:
        exp.finish(f"nothing affordable: {reason}")
        return None
    except Violation as violation:
        exp.finish(f"no admissible proposal: {violation}")
        return None
    policy_s = time.perf_counter() - started
    if not deferred:
        _bound_regret(exp, vetted.intervention)
    return _record(exp, number, proposal, vetted, chosen_by.name, policy_s, deferred=deferred)


def settle(exp: Experiment, live: LiveRound) -> None:
    """The model's part of a round `propose(deferred=True)` left: the regret estimate on the
    model as at the decision, then the round's row and (pipelined) its pending point — the
    order `propose` follows inline, so the estimate is the same. Once per round; a no-op for a
    round already settled."""
    if live.settled:
        return
    _bound_regret(exp, live.intervention)
    _start_model_round(exp, live)
    recommend.refresh(exp)  # what the policy would run if it stopped now (published, retained)


def _ask(exp: Experiment, policy: Policy, constraints: Constraints) -> tuple[Proposal, Policy]:
    """The policy's proposal and the policy; should it fail (raise, or propose a NaN
    value), the explorer's: a numerical accident in one acquisition never stops the service."""
    try:
        proposal = policy.propose(exp.model, constraints, exp.rng)
        bad = sorted(k for k, v in proposal.intervention.items() if math.isnan(v))
        if bad:
            raise ValueError(f"{policy.name} proposed NaN for {bad}")
        return proposal, policy
    except NothingAffordable:
        raise
    except Exception as error:
        if policy is exp.explorer:
            raise
        _failed(exp, policy, error)
        return exp.explorer.propose(exp.model, constraints, exp.rng), exp.explorer


def _failed(exp: Experiment, policy: Policy, error: Exception) -> None:
    """One warning line and a count; the traceback only at debug level (for whoever digs in).

    A policy that fails does so again, round after round (a numerical corner of its
    acquisition), and a traceback of a thousand lines per round would bury every other event.
    """
    kind = type(error).__name__
    summary = " ".join(str(error).split())
    exp.log.warning(
        "policy.failed",
        policy=policy.name,
        error=f"{kind}: {summary[:ERROR_SUMMARY_CHARS]}",
        fallback=exp.explorer.name,
    )
    exp.log.debug("policy.failed.traceback", policy=policy.name, exc_info=error)
    telemetry.policy_failed(exp, policy.name, kind)


def _admissible(
    exp: Experiment, proposal: Proposal, policy: Policy, constraints: Constraints
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
        return _vet(exp, proposal, constraints), policy
    except Violation as violation:
        _refuse(exp, policy, proposal, violation)
        if policy is not exp.explorer:
            fallback = exp.explorer.propose(exp.model, constraints, exp.rng)
            return _admissible(exp, fallback, exp.explorer, constraints)
        if violation.reason == "unknown_action":
            raise ValueError(violation.detail) from None
        raise


def _vet(exp: Experiment, proposal: Proposal, constraints: Constraints) -> Vetted:
    """`vet` of the proposal, logging every value the clamp moved."""
    vetted = vet(exp.spec, proposal.intervention, constraints)
    for name, value in proposal.intervention.items():
        if vetted.intervention[name] != value:
            exp.log.warning(
                "action.clamped", action=name, proposed=value, sent=vetted.intervention[name]
            )
    return vetted


def _refuse(exp: Experiment, policy: Policy, proposal: Proposal, violation: Violation) -> None:
    exp.log.warning(
        "proposal.rejected",
        policy=policy.name,
        reason=violation.reason,
        detail=violation.detail,
        intervention=proposal.intervention,
        reported_cost=proposal.cost,
        fallback=None if policy is exp.explorer else exp.explorer.name,
    )
    telemetry.proposal_rejected(exp, violation.reason)


def _bound_regret(exp: Experiment, intervention: dict[str, float]) -> None:
    """Add this round's model-based regret bound: UCB at the best candidate − LCB here."""
    bound = regret_bound(exp.model, intervention, exp.rng)
    if bound is not None:
        exp.regret.add_upper_increment(*bound)


def packed_vectors(spec: ExperimentSpec) -> tuple[str, ...]:
    """The parameter vector whose coordinates travel packed in the action (protocol v3)."""
    return (spec.parameters.name,) if spec.parameters is not None else ()


def _record(
    exp: Experiment,
    number: int,
    proposal: Proposal,
    vetted: Vetted,
    policy: str,
    policy_s: float,
    *,
    deferred: bool = False,
) -> LiveRound | None:
    """Store the round and reserve its cost in one transaction, then track it; None (and the
    experiment finished) when the ledger refuses the reservation."""
    now = exp.clock()
    action = Action.issue(
        exp.name,
        number,
        vetted.intervention,
        kind=exp.spec.intervention,
        at=now,
        expires_at=now + ack_window(exp.spec.schedule),
        vectors=packed_vectors(exp.spec),
    )
    if not math.isclose(vetted.cost, proposal.cost, rel_tol=1e-9, abs_tol=1e-9):
        # logged before the reservation, which may fail: no round (nor its log) exists yet
        exp.log.warning(
            "proposal.cost_corrected", round=number, reported=proposal.cost, cost=vetted.cost
        )
    try:
        _reserve(exp, action, vetted, now)
    except BudgetExceeded as reason:
        exp.finish(f"budget exhausted: {reason}")
        return None
    live = _start(exp, action, vetted, proposal, policy, now, deferred=deferred)
    telemetry.export_budget(exp)
    live.log.info(
        "round.proposed",
        policy=policy,
        intervention=live.intervention,
        cost=vetted.cost,
        acquisition=proposal.acquisition_value,
        policy_s=round(policy_s, 4),
        expires_at=action.expires_at,
        diagnostics=_short(proposal.diagnostics),
    )
    telemetry.proposed(exp, live, policy_s)
    return live


def _start(
    exp: Experiment,
    action: Action,
    vetted: Vetted,
    proposal: Proposal,
    policy: str,
    now: float,
    *,
    deferred: bool = False,
) -> LiveRound:
    """Track the reserved round; the model starts its row (pipelined: a pending point too),
    now or, `deferred`, in `settle` (the row it will have is known: the next one)."""
    live = LiveRound(
        number=action.round,
        action=action,
        target_set=vetted.target_set,
        cost=vetted.cost,
        acquisition=proposal.acquisition_value,
        policy=policy,
        model_round=len(exp.model.history),
        proposed_at=now,
        settled=False,
    )
    exp.track(live)
    if not deferred:
        _start_model_round(exp, live)
    return live


def _start_model_round(exp: Experiment, live: LiveRound) -> None:
    """The round's row in the model (pipelined: a pending point too); the round is settled."""
    index = exp.model.start_round(live.intervention)
    assert index == live.model_round, "a model row was started between propose and settle"
    if exp.spec.schedule.pipeline > 1:  # other rounds will be proposed before this returns
        live.pending = exp.model.add_pending(live.intervention, live.model_round)
    live.settled = True


def _reserve(exp: Experiment, action: Action, vetted: Vetted, now: float) -> None:
    """The round and its reservation, durable together (raises BudgetExceeded)."""
    with exp.store.transaction():
        exp.store.add_round(
            exp.name,
            action.round,
            action.action_id,
            action.intervention,
            list(vetted.target_set),
            vetted.cost,
            exp.spec.intervention,
            now,
            expires_at=action.expires_at,
        )
        exp.store.reserve(
            exp.name, action.round, vetted.cost, exp.spec.constraints.budget_total, now
        )


def _short(diagnostics: dict) -> dict:
    """Diagnostics small enough for a log line."""
    return {k: v for k, v in diagnostics.items() if isinstance(v, int | float | str | bool)}
