"""Random: a uniformly random admissible intervention (the floor every policy must beat)."""

from __future__ import annotations

import math

import torch

from core.network import NetworkModel
from policies.base import (
    Constraints,
    NothingAffordable,
    Policy,
    PolicySettings,
    Proposal,
    intervention_cost,
)


class RandomSettings(PolicySettings):
    max_draws: int = 1000  # rejection sampling attempts against the budget before giving up


class RandomPolicy(Policy):
    """Draw a target set and values uniformly; reject draws that break the constraints.

    Soft interventions with a cardinality limit c draw a random support of at most c actions
    (the others stay 0). A finite candidate set is sampled uniformly.
    """

    name = "random"
    Settings = RandomSettings

    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        for _ in range(self.settings.max_draws):
            intervention = self._fit_budget(self._draw(constraints, rng), constraints, rng)
            cost = intervention_cost(self.spec, intervention)
            if cost <= constraints.round_cap + 1e-12:
                used = tuple(n for n, v in intervention.items() if self._used(v))
                return Proposal(intervention, math.nan, cost, used, {"policy": self.name})
        raise NothingAffordable(
            f"no affordable intervention in {self.settings.max_draws} random draws "
            f"(round cap {constraints.round_cap:g})"
        )

    def _fit_budget(
        self, intervention: dict[str, float], constraints: Constraints, rng: torch.Generator
    ) -> dict[str, float]:
        """Shrink values toward 0 when their per-unit cost breaks the round cap.

        A uniform draw over a box rarely fits a tight budget (vaccine doses, say); scaling the
        per-unit-cost part to fit, times a uniform factor, keeps the draw random and affordable.
        """
        if self.spec.candidates is not None or constraints.round_cap == float("inf"):
            return intervention
        spec = self.spec
        fixed = intervention_cost(
            spec, {k: v for k, v in intervention.items() if spec.action(k).cost_per_unit == 0}
        )
        variable = intervention_cost(spec, intervention) - fixed
        room = constraints.round_cap - fixed
        if variable <= room or variable <= 0 or room <= 0:
            return intervention
        factor = room / variable * float(torch.rand(1, generator=rng, dtype=torch.float64))
        shrunk = dict(intervention)
        for name, value in intervention.items():
            action = spec.action(name)
            if action.cost_per_unit > 0 and action.bounds[0] <= 0.0 <= action.bounds[1]:
                shrunk[name] = value * factor
        return shrunk

    def _used(self, value: float) -> bool:
        return self.spec.intervention == "hard" or value != 0.0

    def _draw(self, constraints: Constraints, rng: torch.Generator) -> dict[str, float]:
        spec = self.spec
        if spec.candidates is not None:
            pick = int(torch.randint(len(spec.candidates), (1,), generator=rng))
            return dict(zip(spec.action_names, spec.candidates[pick], strict=True))
        support = self._draw_support(constraints, rng)
        values = {}
        for name in support:
            low, high = spec.action(name).bounds
            values[name] = low + (high - low) * float(
                torch.rand(1, generator=rng, dtype=torch.float64)
            )
        if spec.intervention == "soft":
            return {name: values.get(name, 0.0) for name in spec.action_names}
        return values

    def _draw_support(self, constraints: Constraints, rng: torch.Generator) -> tuple[str, ...]:
        limit = constraints.max_interventions
        if self.spec.intervention == "hard":
            sets = [s for s in self.spec.allowed_target_sets() if limit is None or len(s) <= limit]
            if not sets:
                raise NothingAffordable(f"no allowed target set has at most {limit} actions")
            return sets[int(torch.randint(len(sets), (1,), generator=rng))]
        names = self.spec.action_names
        if limit is None or limit >= len(names):
            return tuple(names)
        size = int(torch.randint(limit + 1, (1,), generator=rng))
        order = torch.randperm(len(names), generator=rng)[:size].tolist()
        return tuple(names[i] for i in sorted(order))
