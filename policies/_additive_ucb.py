"""GP-UCB over an additive decomposition (paper 000, Alg. 4 lines 6–9), shared by `hagpucb` and
`addgpucb`.

The model is a `core.gp.additive.AdditiveGP` from the actions to the reward, kept by the policy
and fed every round of the history that has a reward (each round learned once, by an O(n²) row
append). The acquisition is the sum of the groups' own upper confidence bounds,

    UCB(θ) = Σ_i μ^(i)(θ^(i)) + β·σ^(i)(θ^(i)),

the additive GP-UCB of Kandasamy et al. (2015) that paper 000 builds on; it is separable over
groups that share no coordinate, so those are maximized separately, and groups that overlap are
maximized by block-coordinate ascent: the groups are coloured so that no two groups of a colour
share a coordinate (`networkx.greedy_color`), and each sweep updates one colour at a time, every
group of it at once, each over its own coordinates with the terms of every group it overlaps.
A group's update draws `candidates` points: half uniform in its box, half Gaussian steps around
the current values (a step that shrinks over the sweeps), plus the current values. Groups of one
colour are updated together from the same θ (Jacobi-style), so where two of them overlap a
common third group the sum may, rarely, drop a little in that sweep. The start is the best
observed point.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import networkx as nx
import torch
from pydantic import Field

from core.gp.additive import AdditiveGP
from core.network import NetworkModel
from core.spec import ExperimentSpec
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
        default=128, ge=4, le=4096, description="Points drawn per group and sweep."
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
        self._colours = _colour_classes(self.groups)
        self._neighbours = _overlaps(self.groups)

    def sync(self, model: NetworkModel) -> int:
        """Learn every round of the history with a reward not learned yet; returns how many."""
        reward = model.reward_node
        new = [
            i
            for i, record in enumerate(model.history)
            if i not in self._learned and reward in record.readings
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
        theta = self._start()
        for sweep in range(self.settings.sweeps):
            theta = self._sweep(theta, _STEPS[sweep], rng)
        value = float(self._acquisition(theta.unsqueeze(0))[0])
        intervention = dict(zip(self.names, theta.tolist(), strict=True))
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
                "groups": len(self.groups),
                "largest_group": max(len(g) for g in self.groups),
                "observations": self.gp.n,
                "learned_now": learned,
            },
        )

    # ------------------------------------------------------------------ acquisition
    def _start(self) -> torch.Tensor:
        if self.gp.n == 0:
            return self.bounds.mean(-1)
        targets = self.gp.train_targets
        return self.gp.train_inputs[int(targets.argmax())].clone()

    def _acquisition(self, x: torch.Tensor) -> torch.Tensor:
        """(m, D) -> (m,) Σ_i μ^(i) + β σ^(i)."""
        mean, var = self.gp.group_posterior(x)
        return (mean + self.settings.beta * var.clamp_min(1e-24).sqrt()).sum(0)

    def _sweep(self, theta: torch.Tensor, step: float, rng: torch.Generator) -> torch.Tensor:
        """One block-coordinate sweep: every colour class in turn, its groups at once."""
        for colour in self._colours:
            theta = self._update(theta, colour, step, rng)
        return theta

    def _update(
        self, theta: torch.Tensor, colour: Sequence[int], step: float, rng: torch.Generator
    ) -> torch.Tensor:
        """Best candidate values of each group of one colour (they share no coordinate)."""
        c = self.settings.candidates
        lower, span = self.bounds[:, 0], self.bounds[:, 1] - self.bounds[:, 0]
        points, owners, members = [], [], []
        for i in colour:
            cols = list(self.groups[i])
            cand = theta.expand(c, -1).clone()
            half = c // 2
            uniform = torch.rand(half, len(cols), generator=rng, dtype=theta.dtype)
            cand[:half, cols] = lower[cols] + uniform * span[cols]
            local = torch.randn(c - half - 1, len(cols), generator=rng, dtype=theta.dtype)
            moved = theta[cols] + local * step * span[cols]
            cand[half:-1, cols] = torch.minimum(
                torch.maximum(moved, lower[cols]), lower[cols] + span[cols]
            )
            for j in self._neighbours[i]:
                points.append(cand)
                owners.append(i)
                members.append(j)
        x = torch.stack(points)  # (pairs, c, D)
        mean, var = self.gp.group_posterior(x, members)
        terms = mean + self.settings.beta * var.clamp_min(1e-24).sqrt()  # (pairs, c)
        theta = theta.clone()
        totals: dict[int, torch.Tensor] = {}
        for row, owner in enumerate(owners):
            totals[owner] = totals.get(owner, 0.0) + terms[row]
        for owner, total in totals.items():
            best = int(total.argmax())
            first = owners.index(owner)
            cols = list(self.groups[owner])
            theta[cols] = x[first, best, cols]
        return theta

    def diagnostics(self) -> dict[str, Any]:
        return {"groups": [list(g) for g in self.groups]}


def _overlaps(groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each group, the groups sharing a coordinate with it (itself included)."""
    by_coordinate: dict[int, list[int]] = {}
    for i, group in enumerate(groups):
        for c in group:
            by_coordinate.setdefault(c, []).append(i)
    return [sorted({j for c in group for j in by_coordinate[c]}) for group in groups]


def _colour_classes(groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """Groups partitioned so that no two groups of a class share a coordinate."""
    graph = nx.Graph()
    graph.add_nodes_from(range(len(groups)))
    for i, neighbours in enumerate(_overlaps(groups)):
        graph.add_edges_from((i, j) for j in neighbours if j != i)
    colours = nx.greedy_color(graph, strategy="largest_first")
    classes: dict[int, list[int]] = {}
    for node, colour in colours.items():
        classes.setdefault(colour, []).append(node)
    return [sorted(members) for _, members in sorted(classes.items())]
