"""What the multi-fidelity policies share (paper 001): the levers, the trials seen so far, the
(θ, τ) GP kept fitted on a schedule, the finite set Θ̄, the initial design, the recommendation.

A multi-fidelity spec (`spec.fidelity`) has θ (every action but two), τ and q. A trial is a
round whose reward reading arrived: θ, τ, q (the replications the device reported, else those
asked), the mean y and — when the device reported it — the variance of that mean.

Θ̄ is a Latin hypercube of θ fixed for the whole run (seeded by the spec), as the paper's
convergence theorem needs a fixed finite set; the θ already tried are added to it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import Field

from core.gp.fidelity import FidelityGP
from core.network import NetworkModel
from core.spec import ExperimentSpec, FidelitySpec
from policies.base import (
    Constraints,
    NothingAffordable,
    Policy,
    PolicySettings,
    Proposal,
    Recommendation,
)

__all__ = [
    "FidelityPolicy",
    "FidelitySettings",
    "Trials",
    "latin_hypercube",
    "recommend",
    "trials",
]

_TOL = 1e-12


def latin_hypercube(n: int, dim: int, generator: np.random.Generator) -> np.ndarray:
    """(n, dim) points of the unit cube, one in each of n slices per coordinate."""
    slices = np.stack([generator.permutation(n) for _ in range(dim)], axis=1)
    return (slices + generator.random((n, dim))) / n


@dataclass(frozen=True)
class Trials:
    """The trials seen so far: θ (n, d) declared units, τ (n,), q (n,), y (n,), variance (n,)
    of each mean (NaN where not reported)."""

    theta: torch.Tensor
    tau: torch.Tensor
    replications: torch.Tensor
    y: torch.Tensor
    variance: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.y.numel())


def trials(spec: ExperimentSpec, model: NetworkModel) -> Trials:
    """Every round of `model.history` whose reward reading arrived, in order."""
    fidelity = _fidelity(spec)
    reward = spec.reward.node
    names = spec.parameter_names
    rows = [r for r in model.history if reward in r.readings]
    theta = [[r.intervention.get(n, 0.0) for n in names] for r in rows]
    tau = [r.intervention.get(fidelity.action, fidelity.tau_max) for r in rows]
    asked = [r.intervention.get(fidelity.replications_action, fidelity.q_max) for r in rows]
    reps = [r.replications.get(reward, a) for r, a in zip(rows, asked, strict=True)]
    variance = [r.variances.get(reward, math.nan) for r in rows]
    f64 = torch.float64
    return Trials(
        torch.tensor(theta, dtype=f64).reshape(len(rows), len(names)),
        torch.tensor(tau, dtype=f64),
        torch.tensor(reps, dtype=f64),
        torch.tensor([r.readings[reward] for r in rows], dtype=f64),
        torch.tensor(variance, dtype=f64),
    )


def _fidelity(spec: ExperimentSpec) -> FidelitySpec:
    if spec.fidelity is None:
        raise ValueError("a multi-fidelity policy needs a spec with a `fidelity` section")
    return spec.fidelity


def theta_bounds(spec: ExperimentSpec) -> torch.Tensor:
    """(d, 2) bounds of θ."""
    return torch.tensor([spec.action(n).bounds for n in spec.parameter_names], dtype=torch.float64)


class FittedModel:
    """The (θ, τ) GP of an experiment, refit every `refit_every` new trials (and on the first
    two), rebuilt from the trials on every call so a restart or a late reading changes
    nothing but the data."""

    def __init__(self, spec: ExperimentSpec, refit_every: int, restarts: int, seed: int) -> None:
        self.spec, self.fidelity = spec, _fidelity(spec)
        self.refit_every, self.restarts, self.seed = refit_every, restarts, seed
        self._hyper = None
        self._fitted_at = 0

    def __call__(self, model: NetworkModel, *, refit: bool = True) -> FidelityGP:
        """The GP of the trials so far; `refit`: fit its hyperparameters first if due (else the
        last fitted ones, or the initial ones before any fit)."""
        seen = trials(self.spec, model)
        gp = FidelityGP(theta_bounds(self.spec), self.fidelity.tau_max, min(self.fidelity.levels))
        gp.learn(seen.theta, seen.tau, seen.replications, seen.y, seen.variance)
        if self._hyper is not None:
            gp.hyper = self._hyper
        due = self._hyper is None or seen.n - self._fitted_at >= self.refit_every
        if refit and seen.n >= 2 and due:
            gp.fit(restarts=self.restarts, seed=self.seed + seen.n)
            self._hyper, self._fitted_at = gp.hyper, seen.n
        return gp


def recommend(
    spec: ExperimentSpec, gp: FidelityGP, grid: torch.Tensor, seen: Trials
) -> tuple[dict[str, float], float]:
    """argmax_θ μ(θ, τ_max) over Θ̄ and the θ tried; the θ (by action name) and μ there."""
    fidelity = _fidelity(spec)
    points = torch.cat([grid, seen.theta]) if seen.n else grid
    mean = gp.mean(points, torch.full((points.shape[0],), fidelity.tau_max, dtype=torch.float64))
    best = int(torch.argmax(mean))
    values = dict(zip(spec.parameter_names, points[best].tolist(), strict=True))
    return values, float(mean[best])


class FidelitySettings(PolicySettings):
    """Settings of every multi-fidelity policy."""

    grid_size: int = Field(
        default=500, ge=2, description="Size of Θ̄, the Latin hypercube of θ searched."
    )
    design_per_level: int | None = Field(
        default=None,
        ge=0,
        description="Initial trials per fidelity level (at q_max, the same θ at each level). "
        "null: 2.5 × dim θ, rounded up (the authors' code).",
    )
    refit_every: int = Field(
        default=5, ge=1, description="Refit the GP's hyperparameters after this many trials."
    )
    restarts: int = Field(default=2, ge=0, description="Random starts of each refit.")


class FidelityPolicy(Policy):
    """A policy over θ, τ and q: the initial design, the fitted model and Θ̄, shared.

    Subclasses implement `decide(gp, seen, constraints)` and may narrow `design_levels`.
    """

    Settings = FidelitySettings

    def __init__(self, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(spec, settings)
        self.fidelity = _fidelity(spec)
        seed = spec.initial_design.seed
        self.generator = np.random.default_rng(seed)
        dim = len(spec.parameter_names)
        bounds = theta_bounds(spec)
        unit = torch.tensor(latin_hypercube(self.settings.grid_size, dim, self.generator))
        self.grid = bounds[:, 0] + unit * (bounds[:, 1] - bounds[:, 0])
        per_level = self.settings.design_per_level
        self.design_size = math.ceil(2.5 * dim) if per_level is None else per_level
        design = torch.tensor(latin_hypercube(max(self.design_size, 1), dim, self.generator))
        self.design = bounds[:, 0] + design * (bounds[:, 1] - bounds[:, 0])
        self.fitted = FittedModel(spec, self.settings.refit_every, self.settings.restarts, seed)

    def design_levels(self) -> list[float]:
        """The fidelities of the initial design."""
        return list(self.fidelity.levels)

    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        design = self.design_proposal(model, constraints)
        if design is not None:
            return design
        seen = trials(self.spec, model)
        gp = self.fitted(model)
        return self.decide(gp, seen, constraints)

    def design_proposal(self, model: NetworkModel, constraints: Constraints) -> Proposal | None:
        """The next trial of the initial design (at q_max), or None once it is played (or
        when its trial no longer fits the round cap)."""
        started = len(model.history)
        levels = self.design_levels()
        if started < self.design_size * len(levels):
            tau = levels[started % len(levels)]
            theta = self.design[started // len(levels)]
            q = self.fidelity.q_max
            if self.fits(tau, q, constraints):
                return self.proposal(theta, tau, q, math.nan, {"design": True})
        return None

    def decide(self, gp: FidelityGP, seen: Trials, constraints: Constraints) -> Proposal:
        raise NotImplementedError(type(self).__name__)

    # ------------------------------------------------------------------ helpers
    def fits(self, tau: float, q: float, constraints: Constraints) -> bool:
        cap = constraints.round_cap
        return self.fidelity.cost(tau, q) <= cap * (1 + _TOL) + _TOL

    def affordable(self, constraints: Constraints) -> list[tuple[float, int]]:
        """Every (τ, q) whose trial fits the round cap; NothingAffordable when none does."""
        pairs = [
            (tau, q)
            for tau in self.fidelity.levels
            for q in self.fidelity.replications
            if self.fits(tau, q, constraints)
        ]
        if not pairs:
            cheapest = self.fidelity.cost(min(self.fidelity.levels), self.fidelity.q_min)
            raise NothingAffordable(
                f"{self.name}: the cheapest trial costs {cheapest:g}, over the round cap "
                f"{constraints.round_cap:g}"
            )
        return pairs

    def candidates(self, seen: Trials) -> torch.Tensor:
        """Θ̄ and the θ tried, (g, d)."""
        return torch.cat([self.grid, seen.theta]) if seen.n else self.grid

    def proposal(
        self,
        theta: torch.Tensor,
        tau: float,
        q: int,
        value: float,
        diagnostics: dict[str, Any],
    ) -> Proposal:
        intervention = dict(zip(self.spec.parameter_names, theta.tolist(), strict=True))
        intervention[self.fidelity.action] = float(tau)
        intervention[self.fidelity.replications_action] = float(q)
        ordered = {name: intervention[name] for name in self.spec.action_names}
        used = tuple(n for n, v in ordered.items() if v != 0.0)
        cost = self.fidelity.cost(tau, q)
        info = {"policy": self.name, "tau": float(tau), "replications": int(q), **diagnostics}
        return Proposal(ordered, value, cost, used, info)

    def recommend(self, model: NetworkModel) -> tuple[dict[str, float], float]:
        """argmax_θ μ(θ, τ_max) and μ there."""
        seen = trials(self.spec, model)
        return recommend(self.spec, self.fitted(model), self.grid, seen)

    def recommendation(self, model: NetworkModel, *, refit: bool = False) -> Recommendation | None:
        """argmax_θ μ(θ, τ_max) over Θ̄ and the θ tried, on the hyperparameters of the last
        fit unless `refit` (a fit due is then run first); None before the first trial."""
        seen = trials(self.spec, model)
        if seen.n == 0:
            return None
        gp = self.fitted(model, refit=refit)
        values, predicted = recommend(self.spec, gp, self.grid, seen)
        return Recommendation(values, predicted, self.fidelity.tau_max, seen.n)
