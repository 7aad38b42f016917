"""GP-UCB over an additive decomposition (paper 000, Alg. 4 lines 6–9), shared by `hagpucb` and
`addgpucb`.

The model is a `core.gp.additive.AdditiveGP` from the actions to the reward, kept by the policy
and fed every round of the history that has a reward (each round learned once, by an O(n²) row
append). The acquisition is the sum of the groups' own upper confidence bounds,

    UCB(θ) = Σ_i f_i(θ^(i)),   f_i = μ^(i)(θ^(i)) + β·σ^(i)(θ^(i)),

the additive GP-UCB of Kandasamy et al. (2015) that paper 000 builds on. Every f_i depends on
its group's few coordinates only, and the optimizer never leaves them: a candidate for group i
is |θ^(i)| numbers, and it is scored by the terms it changes — f_i and the f_j of the groups j
that share a coordinate with i — each costing O(n·|θ^(j)|) for its kernel row and O(n²) for
its variance, whatever D (`AdditiveGP.local_posterior`).

- Disjoint groups (no shared coordinate with any other): UCB is a sum of independent terms, so
  maximizing each f_i on its own maximizes the sum exactly; every such group is one row of a
  batched call.
- Overlapping groups: block-coordinate ascent. The groups are coloured so that two groups of a
  colour neither share a coordinate nor overlap a common group (a distance-2 colouring of the
  overlap graph, `networkx.greedy_color`); the terms one group's move changes are then disjoint
  from every other group's of its colour, so all groups of a colour move at once (one batched
  call) and the sum of their gains is the exact gain: UCB never decreases.
- A sweep updates every colour in turn. A group's update scores `candidates` values of its
  coordinates — half uniform in its box, half Gaussian steps around the current values (a step
  that shrinks over the sweeps: 0.2, 0.1, 0.05 … of the span), plus the current values — and
  keeps the best. The start is the best observed point.
- After the sweeps, a projected quasi-Newton polish (L-BFGS-B on the whole sum, all groups in
  one differentiable call: `polish` iterations, 0 = none) refines the continuous optimum; its
  point is kept only where UCB improved.
- Under a block limit (`Constraints.max_blocks`, at most k blocks of θ changed from its
  default), the optimum found without it is the target: starting from the default, the block
  whose target values raise UCB most moves, k times at most (`policies._blocks.greedy_units`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from pydantic import Field

from core.gp.additive import AdditiveGP
from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies._blocks import greedy_units, keep_units
from policies.base import Constraints, NothingAffordable, PolicySettings, Proposal
from policies.base import intervention_cost as _cost

_STEPS = (0.2, 0.1, 0.05, 0.02, 0.01)  # local step per sweep, fraction of each coordinate's span


class AdditiveUCBSettings(PolicySettings):
    """Settings of the additive GP-UCB phase."""

    beta: float = Field(
        default=2.0, ge=0, description="σ-multiplier of every group's bound (μ + β·σ)."
    )
    refit_every: int = Field(
        default=10,
        ge=1,
        description="Refit the additive GP's hyperparameters every this many new rewards.",
    )
    sweeps: int = Field(
        default=3, ge=1, le=len(_STEPS), description="Block-coordinate sweeps of the acquisition."
    )
    candidates: int = Field(
        default=64, ge=4, le=4096, description="Points drawn per group and sweep."
    )
    polish: int = Field(
        default=30,
        ge=0,
        le=1000,
        description="L-BFGS-B iterations of the final polish on the whole sum (0: none).",
    )


def check_parameter_experiment(spec: ExperimentSpec, name: str) -> None:
    """These policies search the box of a parameter vector: every action a coordinate of θ.

    Raises:
        ValueError: for any other spec (the registry's callers skip a policy that refuses one).
    """
    if spec.parameters is None or spec.action_names != spec.parameter_vector:
        raise ValueError(
            f"{name}: for a parameter-vector experiment (a `parameters` section, no other action)"
        )


def action_bounds(spec: ExperimentSpec) -> torch.Tensor:
    """(D, 2) bounds of every action, in `spec.action_names` order."""
    return torch.tensor([a.bounds for a in spec.actions], dtype=torch.float64)


class AdditiveUCB:
    """The additive model of one experiment and its acquisition optimizer.

    Args:
        spec: the experiment (soft actions, the box of their bounds).
        groups: coordinate groups, indices into `spec.action_names`.
        settings: see `AdditiveUCBSettings`.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        groups: Sequence[Sequence[int]],
        settings: AdditiveUCBSettings,
    ) -> None:
        self.spec, self.settings = spec, settings
        self.names = spec.action_names
        self.bounds = action_bounds(spec)
        std = spec.node(spec.reward.node).noise_std
        noise = None if std is None else max(float(std) ** 2, 1e-12)
        self.gp = AdditiveGP(
            self.bounds, groups, noise_variance=noise, refit_every=settings.refit_every
        )
        self.groups = self.gp.groups.groups
        self._learned: set[int] = set()
        self._plans = [_colour_plan(self.gp, colour) for colour in _colour_classes(self.groups)]

    def sync(self, model: NetworkModel) -> int:
        """Learn every round of the history with a reward not learned yet; returns how many."""
        reward = model.reward_node
        new = [  # by the round's index: a bounded model's history holds its newest rounds only
            record.index
            for record in model.history
            if record.index not in self._learned and reward in record.readings
        ]
        # One new round: appended (and refit on schedule). Many (the first call, a restart's
        # replayed history): appended without refits, then one refit.
        for index in new:
            record = model.history[index]
            x = torch.tensor(
                [float(record.intervention.get(n, 0.0)) for n in self.names], dtype=torch.float64
            )
            self.gp.learn_one(x, float(record.readings[reward]), refit=len(new) == 1)
            self._learned.add(index)
        if len(new) > 1 and self.gp.n >= self.gp.min_fit_points:
            self.gp.fit()
        return len(new)

    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        """Maximize the summed group bounds from the best observed point; see the module."""
        started = time.perf_counter()
        learned = self.sync(model)
        fitted = time.perf_counter()
        theta = self._start()  # (D + 1,) unit cube, the last entry the groups' zero padding
        for sweep in range(self.settings.sweeps):
            for plan in self._plans:
                self._update(theta, plan, _STEPS[sweep], rng)
        value = float(self._acquisition(theta))
        polished = False
        if self.settings.polish and self.gp.n:
            theta, value, polished = self._polish(theta, value)
        point = self.bounds[:, 0] + theta[:-1] * (self.bounds[:, 1] - self.bounds[:, 0])
        blocks = None
        if constraints.max_blocks is not None:
            point, value, blocks = self._within_blocks(point, constraints.max_blocks)
        intervention = dict(zip(self.names, point.tolist(), strict=True))
        cost = _cost(self.spec, intervention)
        if cost > constraints.round_cap * (1 + 1e-12) + 1e-12:
            raise NothingAffordable(f"a round costs {cost:g}, {constraints.round_cap:g} is left")
        return Proposal(
            intervention,
            value,
            cost,
            tuple(self.names),
            {
                "seconds": time.perf_counter() - started,
                "acquisition_seconds": time.perf_counter() - fitted,
                "groups": len(self.groups),
                "largest_group": max(len(g) for g in self.groups),
                "colours": len(self._plans),
                "polished": polished,
                "observations": self.gp.n,
                "learned_now": learned,
                **({} if blocks is None else {"blocks_changed": blocks}),
            },
        )

    def _within_blocks(
        self, point: torch.Tensor, limit: int
    ) -> tuple[torch.Tensor, float, list[str]]:
        """The optimum kept to `limit` blocks of θ changed from its default, chosen greedily
        by the acquisition (`policies._blocks.greedy_units`); its value and those blocks."""

        def score(batch: list[list[float]]) -> list[float]:
            with torch.no_grad():
                return [float(self._acquisition(self._unit_padded(row))) for row in batch]

        target = point.tolist()
        chosen = greedy_units(self.spec, target, limit, score)
        kept = keep_units(self.spec, target, chosen)
        return torch.tensor(kept, dtype=point.dtype), score([kept])[0], chosen

    def _unit_padded(self, values: Sequence[float]) -> torch.Tensor:
        """(D + 1,) unit-cube point of declared values, the last entry the groups' padding."""
        unit = self.gp.unit(torch.tensor(values, dtype=self.gp.dtype))
        return torch.cat([unit, unit.new_zeros(1)])

    # ------------------------------------------------------------------ acquisition
    def _start(self) -> torch.Tensor:
        dim = len(self.names)
        theta = torch.full((dim + 1,), 0.5, dtype=self.gp.dtype)
        if self.gp.n:
            best = self.gp.train_inputs[int(self.gp.train_targets.argmax())]
            theta[:dim] = self.gp.unit(best).clamp(0.0, 1.0)
        theta[dim] = 0.0
        return theta

    def _terms(self, theta: torch.Tensor) -> torch.Tensor:
        """(D + 1,) unit point -> (M,) every group's f_i (differentiable in theta)."""
        index = self.gp.groups.index
        members = torch.arange(index.shape[0])
        mean, var = self.gp.local_posterior(members, theta[index].unsqueeze(1))
        return (mean + self.settings.beta * var.clamp_min(1e-24).sqrt())[:, 0]

    def _acquisition(self, theta: torch.Tensor) -> torch.Tensor:
        """Σ_i f_i at one (D + 1,) unit point, without the constant y mean."""
        return self._terms(theta).sum()

    def _update(
        self, theta: torch.Tensor, plan: _ColourPlan, step: float, rng: torch.Generator
    ) -> None:
        """Move every group of one colour to its best candidate, in place (see the module)."""
        c, dtype = self.settings.candidates, theta.dtype
        current = theta[plan.index]  # (G, s), padded slots 0
        groups, width = current.shape
        half = c // 2
        uniform = torch.rand(groups, half, width, generator=rng, dtype=dtype)
        local = torch.randn(groups, c - half - 1, width, generator=rng, dtype=dtype)
        local = (current.unsqueeze(1) + step * local).clamp_(0.0, 1.0)
        cand = torch.cat([uniform, local, current.unsqueeze(1)], dim=1) * plan.real.unsqueeze(1)
        # each changed term's points: the owner's candidate where it holds the coordinate,
        # theta elsewhere (padded slots read theta's trailing 0)
        moved = cand[plan.pair_owner].gather(-1, plan.source.unsqueeze(1).expand(-1, c, -1))
        fixed = theta[plan.pair_index].unsqueeze(1)
        q = torch.where(plan.from_owner.unsqueeze(1), moved, fixed)
        mean, var = self.gp.local_posterior(plan.pair_group, q)
        terms = mean + self.settings.beta * var.clamp_min(1e-24).sqrt()  # (P, c)
        totals = terms.new_zeros(groups, c).index_add_(0, plan.pair_owner, terms)
        best = cand[torch.arange(groups), totals.argmax(-1)]  # (G, s)
        theta[plan.index[plan.real]] = best[plan.real]

    def _polish(self, theta: torch.Tensor, value: float) -> tuple[torch.Tensor, float, bool]:
        """L-BFGS-B on Σ_i f_i over the unit box from theta; keeps theta unless it improved."""
        import numpy as np
        from scipy.optimize import minimize

        dim = len(self.names)

        def objective(u: np.ndarray) -> tuple[float, np.ndarray]:
            x = torch.zeros(dim + 1, dtype=theta.dtype)
            x[:dim] = torch.from_numpy(u)
            x.requires_grad_(True)
            total = self._acquisition(x)
            (grad,) = torch.autograd.grad(total, x)
            return -float(total.detach()), -grad[:dim].numpy()

        result = minimize(
            objective,
            theta[:dim].numpy(),
            jac=True,
            method="L-BFGS-B",
            bounds=[(0.0, 1.0)] * dim,
            options={"maxiter": self.settings.polish},
        )
        if not np.all(np.isfinite(result.x)) or not -float(result.fun) > value:
            return theta, value, False
        out = theta.clone()
        out[:dim] = torch.from_numpy(np.clip(result.x, 0.0, 1.0))
        return out, float(self._acquisition(out)), True

    def diagnostics(self) -> dict[str, Any]:
        return {"groups": [list(g) for g in self.groups]}


@dataclass(frozen=True)
class _ColourPlan:
    """The index arithmetic of one colour's update, built once per decomposition.

    Attributes:
        index: (G, s) long, the owners' coordinates (padding → D, theta's trailing 0).
        real: (G, s) bool, which slots are coordinates.
        pair_owner: (P,) long, for each changed term, the position of its owner in the colour.
        pair_group: (P,) long, the group whose term it is.
        pair_index: (P, s) long, that group's coordinates.
        from_owner: (P, s) bool, which of its slots the owner moves.
        source: (P, s) long, the owner's slot for each moved slot (0 elsewhere).
    """

    index: torch.Tensor
    real: torch.Tensor
    pair_owner: torch.Tensor
    pair_group: torch.Tensor
    pair_index: torch.Tensor
    from_owner: torch.Tensor
    source: torch.Tensor


def _colour_plan(gp: AdditiveGP, colour: Sequence[int]) -> _ColourPlan:
    groups, index = gp.groups.groups, gp.groups.index
    neighbours = _overlaps(groups)
    width = index.shape[1]
    owner_pos, pair_group, from_owner, source = [], [], [], []
    for position, i in enumerate(colour):
        slot_of = {c: k for k, c in enumerate(groups[i])}
        for j in neighbours[i]:
            owner_pos.append(position)
            pair_group.append(j)
            slots = [slot_of.get(c, -1) for c in groups[j]] + [-1] * (width - len(groups[j]))
            from_owner.append([k >= 0 for k in slots])
            source.append([max(k, 0) for k in slots])
    owners = torch.tensor(list(colour), dtype=torch.long)
    pairs = torch.tensor(pair_group, dtype=torch.long)
    return _ColourPlan(
        index=index[owners],
        real=index[owners] < gp.dim,
        pair_owner=torch.tensor(owner_pos, dtype=torch.long),
        pair_group=pairs,
        pair_index=index[pairs],
        from_owner=torch.tensor(from_owner, dtype=torch.bool),
        source=torch.tensor(source, dtype=torch.long),
    )


def _overlaps(groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each group, the groups sharing a coordinate with it (itself included)."""
    by_coordinate: dict[int, list[int]] = {}
    for i, group in enumerate(groups):
        for c in group:
            by_coordinate.setdefault(c, []).append(i)
    return [sorted({j for c in group for j in by_coordinate[c]}) for group in groups]


def _colour_classes(groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """Groups partitioned so that two groups of a class neither share a coordinate nor both
    share one with a third group (a distance-2 colouring of the overlap graph)."""
    neighbours = _overlaps(groups)
    graph = nx.Graph()
    graph.add_nodes_from(range(len(groups)))
    for i, near in enumerate(neighbours):
        reach = {k for j in near for k in neighbours[j]}  # within two overlaps of i
        graph.add_edges_from((i, k) for k in reach if k != i)
    colours = nx.greedy_color(graph, strategy="largest_first")
    classes: dict[int, list[int]] = {}
    for node, colour in colours.items():
        classes.setdefault(colour, []).append(node)
    return [sorted(members) for _, members in sorted(classes.items())]
