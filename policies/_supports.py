"""Admissible regions of the action space under cardinality and budget constraints.

A `Region` is what one inner optimization searches: a support (soft: the actions allowed to be
nonzero; hard: the target set, whose nodes are set), a box of values for those actions and one
linear per-unit cost constraint. Every admissible intervention lies in some region, and every
point of a region (after `Region.feasible`) is admissible:

- Hard interventions: the spec's target sets with at most `max_interventions` actions.
- Soft interventions: supports of at most `max_interventions` actions (every action when there is
  no limit). An action whose bounds exclude 0 cannot be switched off, so it is in every support.
  Values inside a support may be 0, so a support that the budget does not constrain covers all
  its subsets: those subsets are dropped (see `_prune_dominated`).
- Budget: a region's fixed cost (the `cost` of each action in it) must fit the round cap
  (`Constraints.round_cap`, the smaller of the per-round cap and the remaining total budget);
  the per-unit costs then give Σ_i cpu_i·|v_i| ≤ cap − fixed. On a box that does not straddle 0
  in a priced coordinate |v_i| = s_i·v_i with a fixed sign s_i, so the constraint is linear
  (BoTorch's `inequality_constraints`). A priced action whose bounds straddle 0 splits the
  region into two sign orthants — only when the budget can bind in that region at all.
- Enumeration is capped: when more than `max_enumerate` supports would be listed, all supports
  up to the largest size that fits half the cap are kept and the rest of the cap is filled with
  random supports of the largest admissible size (drawn with the policy's generator). The search
  loop (`policies._search`) additionally screens regions when there are more than it optimizes.

Under hard interventions the cost of a target set is paid even for a value of 0; under soft ones
an action is used (and paid, and counted) only when its value is nonzero, and the region's fixed
cost is an upper bound of the cost of its points.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies.base import Constraints, NothingAffordable

_TOL = 1e-9


@dataclass(frozen=True)
class Region:
    """One support with a box of values and a linear per-unit budget.

    Attributes:
        actions: the actions in use (soft: the support; hard: the target set), spec order.
        hard: whether the actions set their nodes (do()).
        columns: (F,) long, the spec columns of `actions` — the free variables.
        lower, upper: (F,) bounds of the free values (one sign orthant where the box was split).
        unit_cost: (F,) cost per unit of |value|.
        fixed_cost: total `cost` of the actions in use.
        cap: the round cap (inf when unconstrained).
        num_actions: A, the length of a full action vector.
    """

    actions: tuple[str, ...]
    hard: bool
    columns: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    unit_cost: torch.Tensor
    fixed_cost: float
    cap: float
    num_actions: int

    @property
    def dim(self) -> int:
        return len(self.actions)

    @property
    def set_actions(self) -> tuple[str, ...]:
        """The actions whose nodes are set (hard), for `NetworkModel.rollout`."""
        return self.actions if self.hard else ()

    @property
    def key(self) -> tuple:
        """Identifies the region across rounds (for warm starts)."""
        signs = torch.sign(self.lower + self.upper).tolist()
        return (self.actions, self.hard, tuple(signs))

    @property
    def anchor(self) -> torch.Tensor:
        """(F,) the cheapest point: each value as close to 0 as its bounds allow."""
        return torch.minimum(torch.maximum(torch.zeros_like(self.lower), self.lower), self.upper)

    @property
    def slack(self) -> float:
        """What the per-unit costs may spend: cap − fixed cost."""
        return self.cap - self.fixed_cost

    @property
    def binding(self) -> bool:
        """Whether the per-unit budget can cut into the box."""
        if not math.isfinite(self.cap):
            return False
        worst = torch.maximum(self.lower.abs(), self.upper.abs())
        return float((self.unit_cost * worst).sum()) > self.slack + _TOL

    def embed(self, values: torch.Tensor) -> torch.Tensor:
        """(..., F) free values -> (..., A) action vectors (0 outside the support)."""
        out = values.new_zeros((*values.shape[:-1], self.num_actions))
        return out.index_copy(-1, self.columns.to(values.device), values)

    def cost(self, values: torch.Tensor) -> torch.Tensor:
        """(..., F) -> (...) cost bound of the points (fixed cost + per-unit costs)."""
        return self.fixed_cost + (values.abs() * self.unit_cost.to(values)).sum(-1)

    def feasible(self, values: torch.Tensor) -> torch.Tensor:
        """Clamp to the box, then pull points over budget toward `anchor` until they fit.

        Differentiable almost everywhere (used as the parameterization of gradient ascent).
        Inside one orthant the cost is linear along the segment anchor→v, so the largest
        feasible fraction of the segment has a closed form.
        """
        lower, upper = self.lower.to(values), self.upper.to(values)
        values = torch.maximum(torch.minimum(values, upper), lower)
        if not self.binding:
            return values
        anchor = self.anchor.to(values)
        unit = self.unit_cost.to(values)
        base = float((unit * anchor.abs()).sum())
        extra = ((values.abs() - anchor.abs()) * unit).sum(-1, keepdim=True)
        room = self.slack - base - 1e-12 * max(1.0, abs(self.cap))  # stay strictly inside
        fraction = torch.where(extra > room, room / extra.clamp_min(1e-300), 1.0).clamp(0.0, 1.0)
        return anchor + (values - anchor) * fraction

    def inequality_constraints(self) -> list[tuple[torch.Tensor, torch.Tensor, float]] | None:
        """BoTorch form Σ coef·x[idx] ≥ rhs of Σ cpu·|v| ≤ slack, when it can bind."""
        if not self.binding:
            return None
        priced = (self.unit_cost > 0).nonzero().flatten()
        sign = torch.where(self.lower + self.upper >= 0, 1.0, -1.0).to(self.lower)
        coefficients = -(self.unit_cost * sign)[priced]
        return [(priced, coefficients, -self.slack)]

    def sample(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """(count, F) uniform points of the box, made feasible."""
        u = torch.rand(count, self.dim, generator=generator, dtype=self.lower.dtype)
        u = u.to(self.lower.device)
        return self.feasible(self.lower + (self.upper - self.lower) * u)


@dataclass(frozen=True)
class _Prices:
    lower: torch.Tensor  # (A,)
    upper: torch.Tensor
    fixed: list[float]
    unit: torch.Tensor


def _prices(model: NetworkModel) -> _Prices:
    spec = model.spec
    bounds = model.action_bounds()
    unit = torch.tensor([a.cost_per_unit for a in spec.actions], dtype=bounds.dtype)
    return _Prices(bounds[:, 0], bounds[:, 1], [a.cost for a in spec.actions], unit.to(bounds))


def mandatory_actions(spec: ExperimentSpec) -> list[str]:
    """Soft actions whose bounds exclude 0: they cannot be switched off."""
    return [a.name for a in spec.actions if not a.bounds[0] <= 0.0 <= a.bounds[1]]


def admissible_regions(
    model: NetworkModel,
    constraints: Constraints,
    *,
    max_enumerate: int = 4096,
    generator: torch.Generator | None = None,
) -> list[Region]:
    """Every region an admissible intervention can lie in (see the module docstring).

    Raises:
        NothingAffordable: when no support fits the cardinality limit and the round cap.
    """
    spec = model.spec
    prices = _prices(model)
    limit = constraints.max_interventions
    cap = constraints.round_cap
    if spec.intervention == "hard":
        supports = [
            tuple(s) for s in spec.allowed_target_sets() if limit is None or len(s) <= limit
        ]
        supports = list(
            dict.fromkeys(tuple(sorted(s, key=spec.action_names.index)) for s in supports)
        )
    else:
        supports = _soft_supports(spec, limit, cap, prices, max_enumerate, generator)
    regions: list[Region] = []
    for support in supports:
        regions.extend(_regions_of(model, support, prices, cap))
    if spec.intervention == "soft":
        regions = _prune_dominated(regions)
    if not regions:
        raise NothingAffordable(
            f"no admissible intervention fits: at most {limit} actions, round cap {cap:g}"
        )
    return regions


def _soft_supports(
    spec: ExperimentSpec,
    limit: int | None,
    cap: float,
    prices: _Prices,
    max_enumerate: int,
    generator: torch.Generator | None,
) -> list[tuple[str, ...]]:
    names = spec.action_names
    must = mandatory_actions(spec)
    optional = [n for n in names if n not in must]
    room = len(optional) if limit is None else limit - len(must)
    if room < 0:
        return []
    fixed = dict(zip(names, prices.fixed, strict=True))
    base_cost = sum(fixed[n] for n in must)
    if limit is None and not math.isfinite(cap):
        return [tuple(names)]  # nothing constrains the support: the full one covers every other
    room = min(room, len(optional))
    sizes = list(range(room + 1))
    counts = [math.comb(len(optional), k) for k in sizes]
    chosen: list[tuple[str, ...]] = []
    if sum(counts) <= max_enumerate:
        for k in sizes:
            chosen.extend(itertools.combinations(optional, k))
    else:
        budget = max_enumerate // 2
        small = 0
        while small + 1 < len(sizes) and sum(counts[: small + 2]) <= budget:
            small += 1
        for k in sizes[: small + 1]:
            chosen.extend(itertools.combinations(optional, k))
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        seen = set(chosen)
        for _ in range(4 * max_enumerate):
            if len(chosen) >= max_enumerate:
                break
            pick = torch.randperm(len(optional), generator=gen)[:room].tolist()
            support = tuple(optional[i] for i in sorted(pick))
            if support not in seen:
                seen.add(support)
                chosen.append(support)
    supports = []
    for extra in chosen:
        support = tuple(n for n in names if n in must or n in extra)
        if base_cost + sum(fixed[n] for n in extra) <= cap + _TOL:
            supports.append(support)
    return supports


def _regions_of(
    model: NetworkModel, support: Sequence[str], prices: _Prices, cap: float
) -> list[Region]:
    """The region(s) of one support: none if unaffordable, split into sign orthants if needed."""
    spec = model.spec
    columns = torch.tensor([spec.action_names.index(a) for a in support], dtype=torch.long)
    fixed_cost = sum(prices.fixed[i] for i in columns.tolist())
    lower, upper = prices.lower[columns], prices.upper[columns]
    unit = prices.unit[columns]
    region = Region(
        tuple(support),
        spec.intervention == "hard",
        columns,
        lower,
        upper,
        unit,
        fixed_cost,
        cap,
        len(spec.action_names),
    )
    if fixed_cost + float((unit * region.anchor.abs()).sum()) > cap + _TOL:
        return []
    if not region.binding:
        return [region]
    straddle = ((lower < 0) & (upper > 0) & (unit > 0)).nonzero().flatten().tolist()
    regions = []
    for signs in itertools.product((1.0, -1.0), repeat=len(straddle)):
        low, high = lower.clone(), upper.clone()
        for i, sign in zip(straddle, signs, strict=True):
            if sign > 0:
                low[i] = 0.0
            else:
                high[i] = 0.0
        part = Region(
            tuple(support),
            region.hard,
            columns,
            low,
            high,
            unit,
            fixed_cost,
            cap,
            region.num_actions,
        )
        regions.append(part)
    return regions


def _prune_dominated(regions: list[Region]) -> list[Region]:
    """Drop a soft region that a region with one more action contains.

    T ⊂ S = T ∪ {j} (0 within j's bounds) contains T's feasible set when every v_T that T admits
    also fits S's budget: min(slack_T, Σ_T cpu·max|v|) ≤ slack_S. Checking one-action extensions
    suffices: if a larger S dominates T, so does every support between them. Regions split into
    sign orthants are kept as they are (they may dominate others).
    """
    by_support: dict[frozenset[str], list[Region]] = {}
    for region in regions:
        by_support.setdefault(frozenset(region.actions), []).append(region)
    names = {name for region in regions for name in region.actions}
    kept = []
    for region in regions:
        support = frozenset(region.actions)
        if len(by_support[support]) > 1:
            kept.append(region)
            continue
        worst = torch.maximum(region.lower.abs(), region.upper.abs())
        need = min(region.slack, float((region.unit_cost * worst).sum()))
        dominated = False
        for extra in names - support:
            # Any one orthant of the larger support holds v_extra = 0 on its boundary.
            for other in by_support.get(support | {extra}, []):
                k = other.actions.index(extra)
                if other.lower[k] <= 0.0 <= other.upper[k] and need <= other.slack + _TOL:
                    dominated = True
                    break
            if dominated:
                break
        if not dominated:
            kept.append(region)
    return kept


def admissible_candidates(model: NetworkModel, constraints: Constraints) -> torch.Tensor:
    """(N, A) the spec's finite candidates that fit the cardinality limit and the round cap.

    Raises:
        NothingAffordable: when none fits.
    """
    spec = model.spec
    points = torch.tensor(spec.candidates, dtype=model.dtype, device=model.device)
    prices = _prices(model)
    used = points != 0
    fixed = torch.tensor(prices.fixed, dtype=points.dtype, device=points.device)
    cost = (used * fixed).sum(-1) + (points.abs() * prices.unit).sum(-1)
    keep = cost <= constraints.round_cap + _TOL
    if constraints.max_interventions is not None:
        keep &= used.sum(-1) <= constraints.max_interventions
    if not keep.any():
        raise NothingAffordable(
            f"none of the {len(points)} candidates fits: at most "
            f"{constraints.max_interventions} actions, round cap {constraints.round_cap:g}"
        )
    return points[keep]
