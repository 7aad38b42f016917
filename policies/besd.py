"""BESD (paper 001): the knowledge gradient per unit cost over θ, the fidelity τ and the
replication count q.

    (θⁿ, τⁿ, qⁿ) ∈ argmax_{θ ∈ Θ̄, τ ∈ 𝒯, q ∈ 𝒬}  νⁿ(θ, τ, q) / cost(τ, q),

    νⁿ(θ, τ, q) = E_n[max_{θ'} μⁿ⁺¹(θ', τ_max)] − max_{θ'} μⁿ(θ', τ_max),

the expected gain in the value of the recommendation argmax_θ μ(θ, τ_max) from one trial of q
replications of length τ at θ. ν is exact (`policies._kg.discrete_kg`) over the alternatives
θ': the `alternatives` points of Θ̄ and the tried θ with the highest mean at τ_max (the authors'
code keeps the best half of its random set). Every (θ, τ, q) of Θ̄ × 𝒯 × 𝒬 whose trial fits the
round cap is scored: q changes only the noise λ(q) of the trial, so one posterior covariance
per (θ, τ) serves every q. Without the division by cost, the rule would always pick τ_max and
q_max.

Exploitation fallback (the authors' code): when the best raw ν is below `fallback_kg` (no
trial is expected to change the recommendation), run the recommendation itself at τ_max with
q_min. The first rounds are the initial design (`policies._fidelity`): the same θ at every τ.

Pick `ei` or `lcb` instead for the paper's single-fidelity baselines, `mfkg` for BoTorch's
Monte-Carlo multi-fidelity knowledge gradient (no q lever).
"""

from __future__ import annotations

import math
import time

import torch
from pydantic import Field

from core.gp.fidelity import FidelityGP
from policies._fidelity import FidelityPolicy, FidelitySettings, Trials
from policies._kg import discrete_kg
from policies.base import Constraints, Proposal

__all__ = ["BESD"]


class BESDSettings(FidelitySettings):
    """Settings of BESD."""

    alternatives: int = Field(
        default=64,
        ge=1,
        description="θ' over which the maximum of the next posterior mean is taken: the best "
        "by posterior mean at τ_max.",
    )
    fallback_kg: float = Field(
        default=1e-7,
        ge=0,
        description="Below this raw knowledge gradient (in reward units) run the "
        "recommendation at τ_max with q_min instead.",
    )


class BESD(FidelityPolicy):
    """Knowledge gradient per unit cost over (θ, τ, q)."""

    name = "besd"
    Settings = BESDSettings

    def decide(self, gp: FidelityGP, seen: Trials, constraints: Constraints) -> Proposal:
        started = time.perf_counter()
        pairs = self.affordable(constraints)
        grid = self.candidates(seen)
        f64 = torch.float64
        tau_max = torch.full((grid.shape[0],), self.fidelity.tau_max, dtype=f64)
        mean = gp.mean(grid, tau_max)
        top = torch.topk(mean, min(self.settings.alternatives, grid.shape[0])).indices
        alternatives = grid[top]
        best_ratio, best_kg, best = -math.inf, 0.0, None
        for tau in sorted({t for t, _ in pairs}):
            qs = [q for t, q in pairs if t == tau]
            taus = torch.full((grid.shape[0],), tau, dtype=f64)
            for q in qs:
                noise = torch.full((grid.shape[0],), gp.noise_for(q), dtype=f64)
                a, b = gp.knowledge_inputs(alternatives, grid, taus, noise)
                kg = torch.from_numpy(discrete_kg(a.numpy(), b.numpy()))
                ratio = kg / self.fidelity.cost(tau, q)
                j = int(torch.argmax(ratio))
                if float(ratio[j]) > best_ratio:
                    best_ratio, best_kg, best = float(ratio[j]), float(kg[j]), (j, tau, q)
        assert best is not None  # `affordable` returned at least one pair
        j, tau, q = best
        seconds = time.perf_counter() - started
        if best_kg < self.settings.fallback_kg:
            return self._exploit(gp, grid, mean, constraints, seconds)
        info = {"kg": best_kg, "kg_seconds": seconds, "fallback": False}
        return self.proposal(grid[j], tau, q, best_ratio, info)

    def _exploit(
        self,
        gp: FidelityGP,
        grid: torch.Tensor,
        mean: torch.Tensor,
        constraints: Constraints,
        seconds: float,
    ) -> Proposal:
        """The recommendation at τ_max with q_min (the cheapest affordable pair if not)."""
        tau, q = self.fidelity.tau_max, self.fidelity.q_min
        if not self.fits(tau, q, constraints):
            tau, q = min(self.affordable(constraints), key=lambda p: self.fidelity.cost(*p))
        info = {"kg": 0.0, "kg_seconds": seconds, "fallback": True}
        return self.proposal(grid[int(torch.argmax(mean))], tau, q, 0.0, info)
