"""EI (paper 001's baseline): expected improvement of the recommendation's value, every trial
at τ_max with q_max (the most costly trial, so cost-unaware).

    EI(θ) = E_n[(f(θ, τ_max) − μ*)⁺],  μ* = max over the tried θ of μⁿ(θ, τ_max),

(the noisy-EI incumbent: the best posterior mean where data is, not the best noisy mean) over
Θ̄ and the tried θ. The initial design is at τ_max only. Multi-fidelity specs only; `eifn`
is the expected improvement of a function network.
"""

from __future__ import annotations

import torch

from core.gp.fidelity import FidelityGP
from policies._fidelity import FidelityPolicy, Trials
from policies.base import Constraints, NothingAffordable, Proposal

__all__ = ["ExpectedImprovement", "expected_improvement"]


def expected_improvement(mean: torch.Tensor, std: torch.Tensor, best: float) -> torch.Tensor:
    """(m,) E[(Y − best)⁺] for Y ~ N(mean, std²), elementwise."""
    std = std.clamp_min(1e-12)
    z = (mean - best) / std
    normal = torch.distributions.Normal(torch.zeros_like(z), torch.ones_like(z))
    return std * (z * normal.cdf(z) + normal.log_prob(z).exp())


class ExpectedImprovement(FidelityPolicy):
    """Expected improvement at τ_max and q_max."""

    name = "ei"

    def design_levels(self) -> list[float]:
        return [self.fidelity.tau_max]

    def full_trial(self, constraints: Constraints) -> tuple[float, int]:
        tau, q = self.fidelity.tau_max, self.fidelity.q_max
        if not self.fits(tau, q, constraints):
            raise NothingAffordable(
                f"{self.name}: a trial at τ_max, q_max costs {self.fidelity.cost(tau, q):g}, "
                f"over the round cap {constraints.round_cap:g}"
            )
        return tau, q

    def decide(self, gp: FidelityGP, seen: Trials, constraints: Constraints) -> Proposal:
        tau, q = self.full_trial(constraints)
        grid = self.candidates(seen)
        at_max = torch.full((grid.shape[0],), tau, dtype=torch.float64)
        mean, std = gp.mean(grid, at_max), gp.variance(grid, at_max).sqrt()
        if seen.n:
            tried = torch.full((seen.n,), tau, dtype=torch.float64)
            best = float(gp.mean(seen.theta, tried).max())
        else:
            best = float(mean.max())
        score = self.score(mean, std, best)
        j = int(torch.argmax(score))
        return self.proposal(grid[j], tau, q, float(score[j]), {})

    def score(self, mean: torch.Tensor, std: torch.Tensor, best: float) -> torch.Tensor:
        return expected_improvement(mean, std, best)
