"""Random: a uniformly random admissible intervention (the floor every policy must beat).

It is also the agent's initial-design explorer and its fallback when another policy fails, so
every proposal keeps the same contract as the others (see `policies._supports`):

- Soft interventions: uniform over the admissible interventions. An action whose bounds
  exclude 0 cannot be switched off (it is *mandatory*), so it is in every support and counts
  toward `max_interventions`. The remaining room is filled with as many other actions as fit
  (the rest stay 0): a support's values may be 0, so its box holds every smaller support's, and
  the admissible set is the union of the boxes of the largest affordable supports. One of them
  is drawn with probability proportional to its box's volume (a uniform subset, accepted with
  probability volume / largest volume), then its values uniformly: a uniform point of the union.
  (Drawing the number of actions first would leave about a third of the rounds of a
  `max_interventions: 2` experiment with nothing used at all.)
- Hard interventions: a target set drawn uniformly among the allowed ones that fit the
  cardinality limit and whose cheapest point fits the round cap — the spec declares them as
  the alternatives to explore (an observational `[]` among them, when declared).
- Finite candidates: drawn uniformly among the admissible ones.
- A parameter vector under a block limit (`Constraints.max_blocks`): θ drawn uniformly, then
  all but `max_blocks` uniformly chosen blocks set back to θ's default (`policies._blocks`).
- Multi-fidelity specs (paper 001's RND): θ from a Latin hypercube of `lhs_size` points
  drawn in turn (a new one when used up), every trial at τ_max and q_max.
- Budget: values are drawn uniformly in their bounds; a draw over the round cap is pulled toward
  its cheapest point (each value as close to 0 as its bounds allow) by a random fraction of the
  largest affordable step, so it stays inside the bounds and fits the cap.

The proposal's cost is `intervention_cost` of exactly the returned intervention.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from core.network import NetworkModel
from policies._blocks import keep_units, random_units
from policies._supports import admissible_candidates, mandatory_actions
from policies.base import (
    Constraints,
    NothingAffordable,
    Policy,
    PolicySettings,
    Proposal,
    intervention_cost,
)

_TOL = 1e-12


def _fits(cost: float, cap: float) -> bool:
    """Within the round cap, up to rounding (the tolerance `policies._search` allows)."""
    return cost <= cap * (1 + _TOL) + _TOL


class RandomSettings(PolicySettings):
    max_draws: int = Field(
        default=1000,
        ge=1,
        description="Draws of an affordable soft support, over all sizes, before settling for "
        "the actions that cannot be switched off.",
    )
    lhs_size: int = Field(
        default=50,
        ge=1,
        description="Multi-fidelity specs: points of each Latin hypercube θ is drawn from.",
    )


class RandomPolicy(Policy):
    """Draw an admissible target set or support, then values uniformly within the budget."""

    name = "random"
    handles_arrays = True
    handles_field_parents = True
    handles_block_limits = True
    reads_model = True  # reads none: a time-aware model or a change detector cost it nothing
    Settings = RandomSettings

    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        spec = self.spec
        if spec.fidelity is not None:
            return self._fidelity_trial(constraints, rng)
        if spec.candidates is not None:
            points = admissible_candidates(model, constraints)
            pick = int(torch.randint(len(points), (1,), generator=rng))
            intervention = dict(zip(spec.action_names, points[pick].tolist(), strict=True))
        else:
            support = self._draw_support(constraints, rng)
            values = {name: self._uniform(name, rng) for name in support}
            values = self._fit_budget(values, constraints, rng)
            if constraints.max_blocks is not None:
                values = self._within_blocks(values, constraints.max_blocks, rng)
            if spec.intervention == "soft":
                intervention = {name: values.get(name, 0.0) for name in spec.action_names}
            else:
                intervention = values
        cost = intervention_cost(spec, intervention)
        if not _fits(cost, constraints.round_cap):  # the fit above rules this out
            raise RuntimeError(f"random: proposal cost {cost} exceeds the round cap")
        used = tuple(n for n, v in intervention.items() if self._used(v))
        return Proposal(intervention, math.nan, cost, used, {"policy": self.name})

    def _within_blocks(
        self, values: dict[str, float], limit: int, rng: torch.Generator
    ) -> dict[str, float]:
        """θ drawn in `limit` uniformly chosen blocks, its default everywhere else."""
        names = self.spec.parameter_vector
        theta = [values.get(n, 0.0) for n in names]
        kept = keep_units(self.spec, theta, random_units(self.spec, limit, rng))
        return dict(zip(names, kept, strict=True))

    def _fidelity_trial(self, constraints: Constraints, rng: torch.Generator) -> Proposal:
        fidelity = self.spec.fidelity
        assert fidelity is not None
        tau, q = fidelity.tau_max, fidelity.q_max
        cost = fidelity.cost(tau, q)
        if not _fits(cost, constraints.round_cap):
            raise NothingAffordable(
                f"random: a trial at τ_max, q_max costs {cost:g}, over the round cap "
                f"{constraints.round_cap:g}"
            )
        queue = getattr(self, "_latin", None)
        if not queue:
            queue = self._latin = self._latin_hypercube(rng)
        theta = queue.pop()
        intervention = {name: 0.0 for name in self.spec.action_names}
        intervention.update(theta)
        intervention[fidelity.action] = float(tau)
        intervention[fidelity.replications_action] = float(q)
        used = tuple(n for n, v in intervention.items() if v != 0.0)
        return Proposal(intervention, math.nan, cost, used, {"policy": self.name})

    def _latin_hypercube(self, rng: torch.Generator) -> list[dict[str, float]]:
        """`lhs_size` θ, one per slice of every coordinate, in random order."""
        n, names = self.settings.lhs_size, self.spec.parameter_names
        columns = []
        for name in names:
            low, high = self.spec.action(name).bounds
            slices = torch.randperm(n, generator=rng).to(torch.float64)
            jitter = torch.rand(n, generator=rng, dtype=torch.float64)
            columns.append(low + (high - low) * (slices + jitter) / n)
        return [
            {name: float(column[i]) for name, column in zip(names, columns, strict=True)}
            for i in range(n)
        ]

    # ------------------------------------------------------------------ costs
    def _anchor(self, name: str) -> float:
        """The cheapest value of an action: as close to 0 as its bounds allow."""
        low, high = self.spec.action(name).bounds
        return min(max(0.0, low), high)

    def _min_cost(self, support: tuple[str, ...]) -> float:
        """The cost of a support at its cheapest point (fixed costs paid, as in `_supports`)."""
        actions = [self.spec.action(name) for name in support]
        return sum(a.cost + a.cost_per_unit * abs(self._anchor(a.name)) for a in actions)

    def _uniform(self, name: str, rng: torch.Generator) -> float:
        low, high = self.spec.action(name).bounds
        return low + (high - low) * float(torch.rand(1, generator=rng, dtype=torch.float64))

    def _used(self, value: float) -> bool:
        return self.spec.intervention == "hard" or value != 0.0

    # ------------------------------------------------------------------ budget
    def _fit_budget(
        self, values: dict[str, float], constraints: Constraints, rng: torch.Generator
    ) -> dict[str, float]:
        """Pull a draw over the round cap toward its cheapest point until it fits.

        A uniform draw over a box rarely fits a tight budget (vaccine doses, say). Along the
        segment anchor → value every |v_i| is linear (anchor and value share a sign), so the
        largest affordable fraction t_max has a closed form; a uniform fraction of it keeps the
        draw random. The anchor is inside the bounds, hence so is every point of the segment.
        Fixed costs are counted for the whole support (an upper bound: a soft value that ends
        at 0 pays nothing), as the support was drawn affordable at its anchor.
        """
        cap = constraints.round_cap
        if not math.isfinite(cap) or intervention_cost(self.spec, values) <= cap:
            return values
        support = tuple(values)
        base = self._min_cost(support)
        unit = {name: self.spec.action(name).cost_per_unit for name in support}
        extra = sum(unit[n] * (abs(v) - abs(self._anchor(n))) for n, v in values.items())
        room = cap - base - _TOL * max(1.0, abs(cap))  # stay strictly inside
        most = min(max(room / extra, 0.0), 1.0) if extra > 0 else 1.0
        fraction = most * float(torch.rand(1, generator=rng, dtype=torch.float64))
        fitted = {}
        for name, value in values.items():
            anchor = self._anchor(name)
            low, high = self.spec.action(name).bounds
            fitted[name] = min(max(anchor + (value - anchor) * fraction, low), high)
        return fitted

    # ------------------------------------------------------------------ supports
    def _draw_support(self, constraints: Constraints, rng: torch.Generator) -> tuple[str, ...]:
        limit, cap = constraints.max_interventions, constraints.round_cap
        if self.spec.intervention == "hard":
            sets = [
                tuple(s)
                for s in self.spec.allowed_target_sets()
                if (limit is None or len(s) <= limit) and _fits(self._min_cost(tuple(s)), cap)
            ]
            if not sets:
                raise NothingAffordable(
                    f"random: no allowed target set has at most {limit} actions and fits the "
                    f"round cap {cap:g}"
                )
            return sets[int(torch.randint(len(sets), (1,), generator=rng))]
        names = self.spec.action_names
        must = mandatory_actions(self.spec)
        if limit is not None and len(must) > limit:
            raise NothingAffordable(
                f"random: {len(must)} actions cannot be switched off ({', '.join(must)}: their "
                f"bounds exclude 0), more than max_interventions = {limit}"
            )
        if not _fits(self._min_cost(tuple(must)), cap):
            raise NothingAffordable(
                f"random: the actions that cannot be switched off ({', '.join(must)}) cost at "
                f"least {self._min_cost(tuple(must)):g}, over the round cap {cap:g}"
            )
        optional = [n for n in names if n not in must]
        room = len(optional) if limit is None else min(limit - len(must), len(optional))
        if room == len(optional) and _fits(self._min_cost(tuple(names)), cap):
            return tuple(names)
        span = {n: self.spec.action(n).bounds[1] - self.spec.action(n).bounds[0] for n in names}
        draws = max(self.settings.max_draws // (room + 1), 1)
        for size in range(room, 0, -1):  # the largest affordable supports
            largest = math.prod(sorted((span[n] for n in optional), reverse=True)[:size])
            for _ in range(draws):
                order = torch.randperm(len(optional), generator=rng)[:size].tolist()
                chosen = [optional[i] for i in order]
                volume = math.prod(span[n] for n in chosen) / largest
                accept = float(torch.rand(1, generator=rng, dtype=torch.float64)) < volume
                support = tuple(n for n in names if n in must or n in chosen)
                if accept and _fits(self._min_cost(support), cap):
                    return support
        return tuple(must)  # affordable, checked above
