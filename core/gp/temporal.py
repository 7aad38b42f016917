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

With a `period` P (rounds; a year of weeks is 52), the round also enters through a point on a
circle, (cos 2πt/P, sin 2πt/P), each declared on (−1, 1), so that the unit-cube distance between
two rounds' points is |sin(π(t − t')/P)|. With the `rbf` kernel and equal lengthscales ℓ_c = ℓ_s
= ℓ_p of the two columns the covariance is then the product

    k_x(x, x') · exp(−(t − t')² / (2 (ℓ_τ·time_scale)²)) · exp(−sin²(π(t − t')/P) / (2ℓ_p²)),

the input kernel times a decaying Gaussian times the exp-sine-squared (periodic) kernel of
period P — gpytorch's `PeriodicKernel` exp(−2 sin²(π(t − t')/P) / λ) with λ = 4ℓ_p² (it
divides by its lengthscale, not the square; `tests/test_gp_temporal.py`): a reading a whole
period ago correlates with the present as much as the decay alone lets it, one half a period
ago least. So last year's same season informs this one, for as long as ℓ_τ says the system
remembers. The refit learns ℓ_c and ℓ_s as two ARD lengthscales: where they differ the factor
is still periodic and positive semi-definite (a kernel of a feature map), but depends on the
phase of the year and not only on t − t'. With `matern52` the periodic distance joins the
joint Matérn distance like the other columns.

Queries are at a round too (usually the next one): the posterior of f(·, t) at the present, not
an average over the past. Rows are still kept in full (or bounded by `window`: forgetting the
oldest is right when old rows are uninformative about the present; the information budget of
`BoundedGP` would keep them, as they are far from every other row).
"""

from __future__ import annotations

import math
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
        period: rounds per period of the periodic factor (see the module); None: none.
    """

    def __init__(
        self,
        bounds: torch.Tensor | Sequence,
        config: GPConfig | None = None,
        *,
        time_scale: float = 100.0,
        period: float | None = None,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0; got {time_scale}")
        if period is not None and not period > 0:
            raise ValueError(f"period must be > 0; got {period}")
        bounds = (
            torch.as_tensor(bounds, dtype=torch.float64) if not torch.is_tensor(bounds) else bounds
        )
        if bounds.dim() == 2:
            bounds = bounds.unsqueeze(0)
        b = bounds.shape[0]
        rows = [[0.0, time_scale]] + ([[-1.0, 1.0]] * 2 if period is not None else [])
        time = torch.tensor(rows, dtype=bounds.dtype, device=bounds.device)
        self.time_scale = float(time_scale)
        self.period = None if period is None else float(period)
        self._x_dim = bounds.shape[1]
        time = time.expand(b, len(rows), 2)
        self.gp: IncrementalGP = make_gp(torch.cat((bounds, time), 1), config)

    def _with_time(self, x: torch.Tensor, t: float | torch.Tensor) -> torch.Tensor:
        """(..., d) inputs and a round (scalar or (...,)) -> (..., d + 1), or (..., d + 3)
        with a period: (x, t, cos 2πt/P, sin 2πt/P)."""
        x = torch.as_tensor(x, dtype=self.gp.dtype, device=self.gp.device)
        t = torch.as_tensor(t, dtype=x.dtype, device=x.device).expand(x.shape[:-1])
        columns = [x, t.unsqueeze(-1)]
        if self.period is not None:
            # the phase from t mod P: exact for large t, and the same float for the same week
            phase = (2.0 * math.pi / self.period) * torch.remainder(t, self.period)
            columns += [phase.cos().unsqueeze(-1), phase.sin().unsqueeze(-1)]
        return torch.cat(columns, -1)

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
        return self.gp.lengthscale[:, self._x_dim] * self.time_scale

    @property
    def period_lengthscale(self) -> torch.Tensor | None:
        """(b, 2) ℓ_c, ℓ_s of the periodic columns (unit cube; gpytorch's `PeriodicKernel`
        lengthscale is 4ℓ² where they are equal), or None without a period."""
        if self.period is None:
            return None
        return self.gp.lengthscale[:, self._x_dim + 1 : self._x_dim + 3]
