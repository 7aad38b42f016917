"""The agent's own check of a proposal before it reserves money and publishes anything.

Policies keep the constraints; this module keeps them should a policy not (a bug). It clamps
the proposal to the declared bounds (what will really be sent), recomputes the cost of exactly
that with the spec's cost model, and checks it against the cardinality limit, the allowed
target sets, the per-round cap and what is left of the total budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from core.spec import ExperimentSpec
from policies.base import Constraints, intervention_cost

COST_TOL = 1e-12  # relative and absolute slack of cost checks (the policies' own tolerance)


class Violation(Exception):
    """A proposal whose published form breaks a constraint; `reason` is a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Vetted:
    """What will be published for a proposal: the clamped intervention, its cost, its actions."""

    intervention: dict[str, float]
    cost: float
    target_set: tuple[str, ...]


def clamp_to_bounds(spec: ExperimentSpec, intervention: Mapping[str, float]) -> dict[str, float]:
    """Each value clamped to its action's declared bounds: an actuator never receives more.

    Raises:
        Violation: ("unknown_action") the intervention names an action the spec does not declare.
    """
    unknown = sorted(set(intervention) - set(spec.action_names))
    if unknown:
        raise Violation("unknown_action", f"policy proposed an unknown action {unknown[0]!r}")
    clamped = {}
    for name, value in intervention.items():
        low, high = spec.action(name).bounds
        clamped[name] = min(max(float(value), low), high)
    return clamped


def vet(
    spec: ExperimentSpec, intervention: Mapping[str, float], constraints: Constraints
) -> Vetted:
    """Clamp, recompute the cost of exactly that, and check it against the constraints.

    Raises:
        Violation: an undeclared action, a target set the spec does not allow, more actions
            used than `max_interventions` (more blocks of a parameter vector changed from its
            default than `max_blocks`), a cost over the per-round or remaining budget.
    """
    safe = clamp_to_bounds(spec, intervention)
    hard = spec.intervention == "hard"
    used = tuple(name for name, value in safe.items() if hard or value != 0.0)
    cost = intervention_cost(spec, safe)
    if spec.fidelity is not None:
        _check_levels(spec, safe)
    if hard and spec.target_sets is not None:
        allowed = {frozenset(s) for s in spec.allowed_target_sets()}
        if frozenset(used) not in allowed:
            raise Violation("target_set", f"{sorted(used)} is not a declared target set")
    limit = constraints.max_interventions
    if limit is not None and len(used) > limit:
        raise Violation("max_interventions", f"{len(used)} actions used {used}, at most {limit}")
    if constraints.max_blocks is not None and spec.parameters is not None:
        changed = spec.parameters.changed_units(safe)
        if len(changed) > constraints.max_blocks:
            raise Violation(
                "max_interventions",
                f"{len(changed)} blocks of {spec.parameters.name} changed from its default "
                f"{changed[:5]}, at most {constraints.max_blocks}",
            )
    for reason, cap in (
        ("budget_per_round", constraints.budget_per_round),
        ("budget_remaining", constraints.budget_remaining),
    ):
        if cap is not None and cost > cap * (1 + COST_TOL) + COST_TOL:
            raise Violation(reason, f"cost {cost!r} of {safe} is over {cap!r}")
    return Vetted(safe, cost, used)


def _check_levels(spec: ExperimentSpec, intervention: Mapping[str, float]) -> None:
    """A multi-fidelity round asks for a declared length τ and replication count q."""
    fidelity = spec.fidelity
    assert fidelity is not None
    for name, levels in (
        (fidelity.action, fidelity.levels),
        (fidelity.replications_action, fidelity.replications),
    ):
        value = intervention.get(name)
        if value is None or not any(math.isclose(value, v, rel_tol=1e-12) for v in levels):
            raise Violation("fidelity_level", f"{name}={value} is not one of {list(levels)}")
