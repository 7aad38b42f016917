"""A GP that knows time: the round a reading was taken is one more input of its kernel.

`TemporalGP` holds an `IncrementalGP` (or, with a capacity, a `BoundedGP`) over inputs (x, τ),
τ = t / `time_scale` for the round t, with one more ARD lengthscale ℓ_τ. With the `rbf` kernel
the covariance is exactly a product,

    k((x, t), (x', t')) = k_x(x, x') · exp(−(t − t')² / (2 (ℓ_τ·time_scale)²)),

the input kernel times a Gaussian temporal kernel; with `matern52` it is the Matérn-5/2 of the
joint scaled distance √(r_x² + ((t − t')/(ℓ_τ·time_scale))²), a spatio-temporal Matérn that is
not a product but is positive definite for every lengthscale like any ARD Matérn. Either way the
model's appends, refits beside the loop and posterior are the node GP's unchanged, and the
marginal-likelihood refit learns how fast the system forgets (ℓ_τ) with the other
hyperparameters: readings older than a few ℓ_τ·time_scale rounds stop informing the present,
which is what the forgetting model of time-varying GP-UCB (Bogunovic et al. 2016, kernel
k(x, x')·(1 − ε)^{|t−t'|/2}) achieves with a fixed ε.

Queries are at a round too (usually the next one): the posterior of f(·, t) at the present, not
an average over the past. Rows are still kept in full (or bounded by `window`: forgetting the
oldest is right when old rows are uninformative about the present; the information budget of
`BoundedGP` would keep them, as they are far from every other row).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.gp.bounded import make_gp
from core.gp.config import GPConfig, LearnReport
from core.gp.model import IncrementalGP
from core.gp.posterior import GPPosterior

__all__ = ["TemporalGP"]


class TemporalGP:
    """A batch of GPs over (x, round): see the module.

    Args:
        bounds: (b, d, 2) or (d, 2) declared bounds of x.
        config: as `IncrementalGP`'s.
        time_scale: rounds per unit of τ; ℓ_τ starts at 0.5 (half that many rounds).
    """

    def __init__(
        self,
        bounds: torch.Tensor | Sequence,
        config: GPConfig | None = None,
        *,
        time_scale: float = 100.0,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0; got {time_scale}")
        bounds = (
            torch.as_tensor(bounds, dtype=torch.float64) if not torch.is_tensor(bounds) else bounds
        )
        if bounds.dim() == 2:
            bounds = bounds.unsqueeze(0)
        b = bounds.shape[0]
        time = torch.tensor([0.0, time_scale], dtype=bounds.dtype, device=bounds.device)
        self.time_scale = float(time_scale)
        self.gp: IncrementalGP = make_gp(torch.cat((bounds, time.expand(b, 1, 2)), 1), config)

    def _with_time(self, x: torch.Tensor, t: float | torch.Tensor) -> torch.Tensor:
        """(..., d) inputs and a round (scalar or (...,)) -> (..., d + 1)."""
        x = torch.as_tensor(x, dtype=self.gp.dtype, device=self.gp.device)
        t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
        return torch.cat((x, t.expand(x.shape[:-1]).unsqueeze(-1)), -1)

    def learn_one(
        self,
        x: torch.Tensor | Sequence,
        y: torch.Tensor | Sequence,
        t: float,
        mask: torch.Tensor | Sequence[bool] | None = None,
        *,
        refit: bool = True,
    ) -> LearnReport:
        """One reading per member taken at round t: x (b, d), y (b,)."""
        return self.gp.learn_one(self._with_time(torch.as_tensor(x), t), y, mask, refit=refit)

    def posterior(
        self,
        x: torch.Tensor,
        t: float,
        *,
        members: Sequence[int] | int | None = None,
        full_covariance: bool = False,
    ) -> GPPosterior:
        """Posterior of f(x, t): x (b', q, d) (or (q, d) for an int member)."""
        return self.gp.posterior(
            self._with_time(x, t), members=members, full_covariance=full_covariance
        )

    @property
    def time_lengthscale(self) -> torch.Tensor:
        """(b,) ℓ_τ in rounds: how far apart two readings still inform each other."""
        return self.gp.lengthscale[:, -1] * self.time_scale
