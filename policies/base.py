"""The one interface every policy keeps: `propose(model, constraints, rng) -> Proposal`.

A policy reads the model (never mutates it), respects the constraints, and returns one
intervention with its acquisition value and cost. It never does I/O. Its settings come from the
experiment spec (`policy.settings`) and are validated by the policy's own pydantic model, so a
typo in a setting is an error that names it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from core.gp.field import FieldModelKind
from core.network import NetworkModel
from core.plain_errors import plain_problems
from core.spec import ExperimentSpec


class PolicySettings(BaseModel):
    """Base of every policy's settings model: unknown settings are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NothingAffordable(RuntimeError):
    """No admissible intervention fits the remaining budget: the policy declines to propose."""


@dataclass(frozen=True)
class Constraints:
    """Limits a proposal must respect this round.

    Attributes:
        max_interventions: at most this many actions used (nonzero for soft, in the target set
            for hard); None = no limit.
        budget_per_round: cap on this round's cost; None = no cap.
        budget_remaining: what is left of the total budget (after reservations); None = no cap.
        max_blocks: a parameter vector's cardinality: at most this many of its blocks
            (`ParametersSpec.units`) differ from its default; None = no limit. The spec's
            `max_interventions` becomes this one (not `max_interventions`) for a parameter vector.
    """

    max_interventions: int | None = None
    budget_per_round: float | None = None
    budget_remaining: float | None = None
    max_blocks: int | None = None

    @classmethod
    def from_spec(cls, spec: ExperimentSpec, spent: float = 0.0) -> Constraints:
        limits = spec.constraints
        remaining = None if limits.budget_total is None else max(limits.budget_total - spent, 0.0)
        if spec.parameters is not None:
            return cls(None, limits.budget_per_round, remaining, limits.max_interventions)
        return cls(limits.max_interventions, limits.budget_per_round, remaining)

    @property
    def round_cap(self) -> float:
        """The most one round may cost now (inf when unconstrained)."""
        caps = [c for c in (self.budget_per_round, self.budget_remaining) if c is not None]
        return min(caps, default=math.inf)


def intervention_cost(spec: ExperimentSpec, intervention: Mapping[str, float]) -> float:
    """Cost of an intervention: each used action's fixed cost plus its per-unit cost.

    Soft: an action is used when its value is nonzero. Hard: every action in the target set.
    A multi-fidelity experiment (`spec.fidelity`) pays its own model instead: setup + unit · q · τ.
    A parameter vector (`spec.parameters`) costs its `cost` once per round that sets it.
    """
    if spec.fidelity is not None:
        fidelity = spec.fidelity
        tau = float(intervention.get(fidelity.action, 0.0))
        replications = float(intervention.get(fidelity.replications_action, 0.0))
        return fidelity.cost(tau, replications)
    total = 0.0
    if spec.parameters is not None and any(
        name in intervention for name in spec.parameter_vector[:1]
    ):
        total += spec.parameters.cost  # θ costs once per round, whatever its values
    for name, value in intervention.items():
        action = spec.action(name)
        used = spec.intervention == "hard" or value != 0.0
        total += (action.cost if used else 0.0) + action.cost_per_unit * abs(float(value))
    return total


@dataclass(frozen=True)
class Proposal:
    """One proposed intervention.

    Attributes:
        intervention: action name -> value in declared units. Soft: every action (0 = none).
            Hard: exactly the actions of the chosen target set (empty: observational round).
        acquisition_value: the policy's score of it (comparable within a policy only).
        cost: its cost under the spec's cost model.
        target_set: the actions used.
        diagnostics: timings and optimizer facts for logs (seconds, restarts, timed_out, ...).
    """

    intervention: dict[str, float]
    acquisition_value: float
    cost: float
    target_set: tuple[str, ...]
    diagnostics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Recommendation:
    """What a policy would run now if it had to stop: its current best setting.

    Attributes:
        values: the setting, action name -> value (a multi-fidelity spec: θ only).
        predicted: the model's predicted reward of it (at `fidelity` where there is one).
        fidelity: the fidelity the prediction is for (τ_max), or None.
        trials: how many rounds' feedback the model held.
    """

    values: dict[str, float]
    predicted: float
    fidelity: float | None
    trials: int


class Policy(ABC):
    """A decision rule over a `NetworkModel`.

    Subclasses set `name` (the command-line name) and `Settings` (a `PolicySettings` model).
    """

    name: ClassVar[str]
    Settings: ClassVar[type[PolicySettings]] = PolicySettings
    # Whether the policy works on specs whose reward is a function of arrays (paper 002's
    # composite reward): the composite policies and those that only need the flat model or none.
    handles_arrays: ClassVar[bool] = False
    # Whether the policy works on specs where an array node is a parent of a scalar node (issue
    # 15): those whose rollouts pass the field's sample paths on (`NetworkModel.rollout`) and
    # those that need no node GP.
    handles_field_parents: ClassVar[bool] = False

    # Whether the policy's proposals draw the array nodes' sample paths (`field_draws`), so
    # that a runner should fit their field models beside the decisions, as the service does
    # (`NetworkModel.prepare_fields`; `bench.harness.episode`), not inside the first that needs it.
    draws_fields: ClassVar[bool] = False

    def field_model_settings(self) -> tuple[FieldModelKind, int]:
        """The kind and Adam steps of the array nodes' models this policy draws from (as its
        `NetworkModel.field_draws` calls ask), so that a service can build and fit them before
        the first decision (`NetworkModel.prepare_fields`)."""
        return "hogp", 50

    # Whether the policy keeps a limit on the blocks of a parameter vector changed per round
    # (`Constraints.max_blocks`); the others refuse such a spec.
    handles_block_limits: ClassVar[bool] = False
    # Whether the policy decides on the `NetworkModel`'s scalar GPs (node or flat), the ones
    # `model.time_scale` and `model.change` apply to; a policy with a model of its own doesn't.
    reads_model: ClassVar[bool] = False

    def __init__(self, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None) -> None:
        if spec.composite_reward and not self.handles_arrays:
            raise ValueError(
                f"{self.name}: the spec's reward is a function of arrays; policies for it: "
                "eicf, ucbcf, eimetric, gpucb, random"
            )
        field_parents = [
            node.name
            for node in spec.nodes
            if node.shape is None and any(p in spec.array_nodes for p in node.parents)
        ]
        if field_parents and not self.handles_field_parents:
            raise ValueError(
                f"{self.name}: array nodes feed the scalar nodes {field_parents}; policies "
                "for it: mcbo, eifn, eimetric, gpucb, random (eicf, ucbcf with a reward g "
                "of arrays)"
            )
        limited = spec.parameters is not None and spec.constraints.max_interventions is not None
        if limited and not self.handles_block_limits:
            from policies.registry import policy_classes  # the registry imports this module

            raise ValueError(
                f"{self.name}: does not keep a limit on the blocks of θ changed per round "
                "(constraints.max_interventions with parameters); policies that do: "
                + ", ".join(
                    sorted(c.name for c in policy_classes().values() if c.handles_block_limits)
                )
            )
        drifting = [
            f"model.{name}"
            for name in ("time_scale", "change")
            if getattr(spec.model, name) is not None
        ]
        if drifting and (not self.reads_model or spec.array_nodes):
            why = (
                "the array nodes' models would not use it"
                if spec.array_nodes
                else f"{self.name} decides on a model of its own, which would not use it"
            )
            raise ValueError(
                f"{' and '.join(drifting)}: {why}; it applies to the scalar node GPs "
                "(policies mcbo, eifn, eicbo, dgpucb, gpucb, random)"
            )
        self.spec = spec
        try:
            self.settings = self.Settings.model_validate(dict(settings or {}))
        except ValidationError as error:
            problems = "; ".join(plain_problems(error, self.Settings, prefix="policy.settings"))
            raise ValueError(f"{self.name}: {problems}") from None

    def states_shape(self) -> tuple[int, int] | None:
        """(agents, obs) of the visited states the policy learns from (a device's controller's,
        protocol `cbo.reading` version 4), or None: it takes none and the agent refuses them."""
        return None

    def observe_states(self, round: int, states: Any) -> None:
        """The states (numpy, (T, agents, obs)) a device's controller visited in `round`'s
        episode; called only where `states_shape()` is not None, once per stored trace (again
        by recovery, in arrival order)."""
        raise NotImplementedError(f"{self.name} takes no visited states")

    def recommendation(self, model: NetworkModel, *, refit: bool = False) -> Recommendation | None:
        """The setting to run if the experiment stopped now (published by the service, retained),
        or None: the policy keeps none (the default; the multi-fidelity policies do). `refit`:
        the policy may fit its hyperparameters first where a fit is due; without it the call
        stays cheap (it runs once per round, after the action was published)."""
        return None

    @abstractmethod
    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        """The next intervention.

        Raises:
            NothingAffordable: when no admissible intervention fits the constraints.
        """
