"""mfkg: BoTorch's Monte-Carlo multi-fidelity knowledge gradient per unit cost
(`qMultiFidelityKnowledgeGradient` with `InverseCostWeightedUtility`), the modern library
answer to paper 001's question, which the paper does not compare against.

    (θⁿ, τⁿ) ∈ argmax  E_n[max_{θ'} μⁿ⁺¹(θ', τ_max)] − max_{θ'} μⁿ(θ', τ_max)  /  cost(τ, q)

with the expectation over `fantasies` fantasized outcomes (one-shot optimization: the inner
maximizers are optimized jointly with the candidate), the fantasized model projected to
τ_max for the inner maximum. The model is BoTorch's `SingleTaskMultiFidelityGP` over
(θ scaled to [0, 1]ᵈ, τ / τ_max), the linear-truncated fidelity kernel, standardized outcomes,
homoscedastic noise inferred, refit from scratch every round on every trial (its own model,
not the product-kernel GP of `besd`). θ is optimized continuously by BoTorch's multi-start
L-BFGS-B, τ over the affordable levels of 𝒯 (`optimize_acqf_mixed`, one fixed τ at a time).

The cost model is `AffineFidelityCostModel`: setup + unit · q · τ is affine in τ for a fixed q.
The q lever has no place in BoTorch's acquisition (q changes the noise of a trial, not its
input), so every trial uses one q, `replications` (default q_max, like `ei` and `lcb`); the
initial design is `besd`'s (the same θ at every level, q_max). `current_value`, the value of
the recommendation now, is the largest posterior mean at τ_max over Θ̄ and the tried θ.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from pydantic import Field

from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies._fidelity import FidelityPolicy, FidelitySettings, theta_bounds, trials
from policies.base import Constraints, NothingAffordable, Proposal

__all__ = ["MultiFidelityKG"]


class MFKGSettings(FidelitySettings):
    """Settings of mfkg."""

    replications: int | None = Field(
        default=None,
        ge=1,
        description="Replications q of every trial after the design (one of the spec's); "
        "null: q_max.",
    )
    fantasies: int = Field(
        default=16, ge=1, description="Fantasized outcomes of the Monte-Carlo expectation."
    )
    acquisition_restarts: int = Field(
        default=4, ge=1, description="L-BFGS-B starts per fidelity level."
    )
    raw_samples: int = Field(
        default=64, ge=1, description="Random points the starts are chosen from, per level."
    )
    maxiter: int = Field(default=50, ge=1, description="L-BFGS-B iterations per start.")


class MultiFidelityKG(FidelityPolicy):
    """BoTorch's multi-fidelity knowledge gradient per unit cost over θ and τ."""

    name = "mfkg"
    Settings = MFKGSettings

    def __init__(self, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(spec, settings)
        q = self.settings.replications
        if q is None:
            q = self.fidelity.q_max
        elif q not in self.fidelity.replications:
            raise ValueError(
                f"mfkg: replications {q} is not one of the spec's {self.fidelity.replications}"
            )
        self.q = int(q)
        self.bounds = theta_bounds(spec)

    def cost_model(self) -> Any:
        """BoTorch's affine cost of a trial at normalized τ (column d) with q = `self.q`."""
        from botorch.models.cost import AffineFidelityCostModel

        d = self.bounds.shape[0]
        fixed = self.fidelity.cost(0.0, self.q)
        weight = self.fidelity.cost(self.fidelity.tau_max, self.q) - fixed
        return AffineFidelityCostModel(fidelity_weights={d: weight}, fixed_cost=fixed)

    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        design = self.design_proposal(model, constraints)
        if design is not None:
            return design
        started = time.perf_counter()
        levels = [t for t in self.fidelity.levels if self.fits(t, self.q, constraints)]
        if not levels:
            cheapest = self.fidelity.cost(min(self.fidelity.levels), self.q)
            raise NothingAffordable(
                f"mfkg: the cheapest trial costs {cheapest:g}, over the round cap "
                f"{constraints.round_cap:g}"
            )
        seen = trials(self.spec, model)
        theta, tau, value = self._optimize(seen, levels, rng)
        seconds = time.perf_counter() - started
        return self.proposal(theta, tau, self.q, value, {"acquisition_seconds": seconds})

    def _optimize(
        self, seen: Any, levels: list[float], rng: torch.Generator
    ) -> tuple[torch.Tensor, float, float]:
        """(θ (d,) declared units, τ, acquisition value) of the best candidate."""
        from botorch.acquisition import PosteriorMean, qMultiFidelityKnowledgeGradient
        from botorch.acquisition.cost_aware import InverseCostWeightedUtility
        from botorch.acquisition.utils import project_to_target_fidelity
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskMultiFidelityGP
        from botorch.models.transforms.outcome import Standardize
        from botorch.optim import optimize_acqf_mixed
        from gpytorch.mlls import ExactMarginalLogLikelihood

        f64 = torch.float64
        low, width = self.bounds[:, 0], self.bounds[:, 1] - self.bounds[:, 0]
        d = self.bounds.shape[0]
        tau_max = self.fidelity.tau_max
        x = torch.cat([(seen.theta - low) / width, (seen.tau / tau_max).unsqueeze(-1)], dim=-1)
        y = seen.y.unsqueeze(-1)
        # BoTorch draws its starts and fantasies from torch's global generator: seed it from
        # the round's generator so a run is reproducible.
        torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=rng)))
        gp = SingleTaskMultiFidelityGP(
            x.to(f64), y.to(f64), data_fidelities=[d], outcome_transform=Standardize(m=1)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fit warnings: BoTorch retries by itself
            fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
        grid = (self.candidates(seen) - low) / width
        at_max = torch.cat([grid, torch.ones(grid.shape[0], 1, dtype=f64)], dim=-1)
        with torch.no_grad():
            current = float(PosteriorMean(gp)(at_max.unsqueeze(1)).max())
        target = {d: 1.0}
        acquisition = qMultiFidelityKnowledgeGradient(
            model=gp,
            num_fantasies=self.settings.fantasies,
            current_value=torch.tensor(current, dtype=f64),
            cost_aware_utility=InverseCostWeightedUtility(cost_model=self.cost_model()),
            project=lambda z: project_to_target_fidelity(z, target_fidelities=target, d=d + 1),
        )
        unit = torch.stack([torch.zeros(d + 1, dtype=f64), torch.ones(d + 1, dtype=f64)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optimizer warnings: the best start still counts
            candidate, value = optimize_acqf_mixed(
                acquisition,
                bounds=unit,
                q=1,
                num_restarts=self.settings.acquisition_restarts,
                raw_samples=self.settings.raw_samples,
                fixed_features_list=[{d: t / tau_max} for t in levels],
                options={"batch_limit": 4, "maxiter": self.settings.maxiter},
            )
        point = candidate.reshape(-1)
        theta = low + point[:d].clamp(0.0, 1.0) * width
        tau = min(levels, key=lambda t: abs(t / tau_max - float(point[d])))
        return theta, float(tau), float(value) if math.isfinite(float(value)) else math.nan
