"""A GP over (θ, τ) for trials of chosen length and replication count (paper 001, Eq. 5).

    k((θ, τ), (θ', τ')) = α · Matérn-5/2(θ, θ'; ℓ) · φ(s)ᵀ Σ φ(s'),   φ(s) = (1, s), s = τ / τ_max,

with Σ = L Lᵀ (L lower triangular, 3 free entries), so the fidelity factor is positive
semi-definite for every value of the hyperparameters. Row i's observation noise is

    λ_i = σ_env² + v_i           when the device reported v_i, the variance of its mean,
    λ_i = σ_env² + σ_rep² / q_i  otherwise (q_i replications, the paper's λ(q)),

so each row is a fixed-noise row of its own. The hyperparameters are a MAP estimate with the
paper's Appendix B priors: an independent normal prior per kernel hyperparameter with mean μ_ψ
and standard deviation μ_ψ / 2 — the signal variance's mean is the observations' variance less
the noise, each length-scale's the width of its interval (1: inputs live in the unit cube),
each entry of Σ's the fidelity span 1 − s_min (the authors' code). The prior mean of f is a
constant, the mean of the observations.

Data sets are small (hundreds of trials, each a costly experiment), so every `learn` refactors
the Gram matrix exactly (O(n³) at n ≈ 300 is a millisecond); the refit runs only when asked.
Outputs are standardized internally; every public value is in the observations' units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize

__all__ = [
    "FidelityGP",
    "FidelityHyperparameters",
    "fidelity_factor",
    "matern52",
    "product_kernel",
]

_JITTER = 1e-9  # standardized units², on the Gram diagonal
_SQRT5 = math.sqrt(5.0)


@dataclass(frozen=True)
class FidelityHyperparameters:
    """The kernel and noise in standardized output units and unit-cube inputs.

    Attributes:
        outputscale: α, the signal variance.
        lengthscale: (d,) Matérn length-scales of θ.
        chol: (2, 2) lower-triangular L with Σ = L Lᵀ.
        env_noise: σ_env², the noise every row has.
        rep_noise: σ_rep², one replication's variance (rows without a reported variance).
    """

    outputscale: float
    lengthscale: torch.Tensor
    chol: torch.Tensor
    env_noise: float
    rep_noise: float

    @property
    def sigma(self) -> torch.Tensor:
        """(2, 2) Σ = L Lᵀ."""
        return self.chol @ self.chol.T


def matern52(x1: torch.Tensor, x2: torch.Tensor, lengthscale: torch.Tensor) -> torch.Tensor:
    """Matérn-5/2 correlation, (n, d) × (m, d) -> (n, m), 1 on the diagonal."""
    diff = (x1.unsqueeze(-2) - x2.unsqueeze(-3)) / lengthscale
    r = (diff.pow(2).sum(-1) + 1e-30).sqrt()  # the floor keeps d r / d x finite at r = 0
    return (1.0 + _SQRT5 * r + 5.0 / 3.0 * r.pow(2)) * torch.exp(-_SQRT5 * r)


def fidelity_factor(s1: torch.Tensor, s2: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """φ(s)ᵀ Σ φ(s'), (n,) × (m,) -> (n, m), with φ(s) = (1, s)."""
    phi1 = torch.stack([torch.ones_like(s1), s1], dim=-1)
    phi2 = torch.stack([torch.ones_like(s2), s2], dim=-1)
    return phi1 @ sigma @ phi2.T


def product_kernel(
    theta1: torch.Tensor,
    s1: torch.Tensor,
    theta2: torch.Tensor,
    s2: torch.Tensor,
    hyper: FidelityHyperparameters,
) -> torch.Tensor:
    """α · Matérn-5/2(θ, θ') · φ(s)ᵀ Σ φ(s'): (n, d), (n,), (m, d), (m,) -> (n, m)."""
    return (
        hyper.outputscale
        * matern52(theta1, theta2, hyper.lengthscale)
        * fidelity_factor(s1, s2, hyper.sigma)
    )


class FidelityGP:
    """Exact GP regression over (θ, τ) with a fixed noise per row.

    Args:
        theta_bounds: (d, 2) lower/upper bounds of θ in declared units.
        tau_max: the highest fidelity; τ enters as s = τ / τ_max.
        tau_min: the lowest fidelity (sets the prior of Σ).

    Example:
        >>> gp = FidelityGP(torch.tensor([[0.0, 1.0]]), tau_max=10.0, tau_min=1.0)
        >>> gp.learn(torch.rand(8, 1), torch.full((8,), 10.0), torch.full((8,), 4.0),
        ...          torch.randn(8))
        >>> gp.fit(seed=0)
        >>> mean = gp.mean(torch.rand(5, 1), torch.full((5,), 10.0))  # (5,)
    """

    def __init__(self, theta_bounds: torch.Tensor, tau_max: float, tau_min: float) -> None:
        self.dtype = torch.float64
        self.bounds = theta_bounds.to(self.dtype)
        self.tau_max, self.tau_min = float(tau_max), float(tau_min)
        self.dim = self.bounds.shape[0]
        self.theta = torch.zeros(0, self.dim, dtype=self.dtype)  # unit cube
        self.s = torch.zeros(0, dtype=self.dtype)
        self.q = torch.zeros(0, dtype=self.dtype)
        self.y = torch.zeros(0, dtype=self.dtype)
        self.reported = torch.zeros(0, dtype=self.dtype)  # NaN: not reported
        self.hyper = self._prior_means_hyper()
        self._factor: torch.Tensor | None = None
        self.fit_iterations = 60  # L-BFGS-B steps per start: a refit must fit a decision's time

    # ------------------------------------------------------------------ data
    @property
    def n(self) -> int:
        return int(self.y.numel())

    def unit(self, theta: torch.Tensor) -> torch.Tensor:
        """(..., d) declared units -> unit cube."""
        low, high = self.bounds[:, 0], self.bounds[:, 1]
        return (theta.to(self.dtype) - low) / (high - low)

    def scale_tau(self, tau: torch.Tensor) -> torch.Tensor:
        return tau.to(self.dtype) / self.tau_max

    def learn(
        self,
        theta: torch.Tensor,
        tau: torch.Tensor,
        replications: torch.Tensor,
        y: torch.Tensor,
        variance: torch.Tensor | None = None,
    ) -> None:
        """Add trials: θ (k, d) declared units, τ (k,), q (k,), mean y (k,), and the reported
        variance of each mean (k,; NaN where a device reported none)."""
        k = y.numel()
        if variance is None:
            variance = torch.full((k,), math.nan, dtype=self.dtype)
        if not torch.isfinite(y).all():
            raise ValueError("observations must be finite")
        self.theta = torch.cat([self.theta, self.unit(theta).reshape(k, self.dim)])
        self.s = torch.cat([self.s, self.scale_tau(tau).reshape(k)])
        self.q = torch.cat([self.q, replications.to(self.dtype).reshape(k)])
        self.y = torch.cat([self.y, y.to(self.dtype).reshape(k)])
        self.reported = torch.cat([self.reported, variance.to(self.dtype).reshape(k)])
        self._factor = None

    # ------------------------------------------------------------------ standardization
    @property
    def y_mean(self) -> float:
        return float(self.y.mean()) if self.n else 0.0

    @property
    def y_scale(self) -> float:
        if self.n < 2:
            return 1.0
        return max(float(self.y.std()), 1e-9)

    def _standard_y(self) -> torch.Tensor:
        return (self.y - self.y_mean) / self.y_scale

    def _row_noise(self, hyper: FidelityHyperparameters) -> torch.Tensor:
        """(n,) λ_i in standardized units²."""
        reported = self.reported / self.y_scale**2
        modeled = hyper.rep_noise / self.q
        return hyper.env_noise + torch.where(torch.isnan(reported), modeled, reported)

    def replicate_noise(self) -> float:
        """One replication's variance in standardized units²: from the reported variances
        (median of v_i · q_i) where devices report them, else the fitted σ_rep²."""
        seen = ~torch.isnan(self.reported)
        if seen.any():
            per_replicate = self.reported[seen] * self.q[seen] / self.y_scale**2
            return float(per_replicate.median())
        return self.hyper.rep_noise

    def noise_for(self, replications: float) -> float:
        """λ(q) of a new trial with q replications, in observation units²."""
        standard = self.hyper.env_noise + self.replicate_noise() / float(replications)
        return standard * self.y_scale**2

    # ------------------------------------------------------------------ MAP fit
    def _prior_means(self) -> dict[str, float]:
        reported = self.reported[~torch.isnan(self.reported)] / self.y_scale**2
        noise_guess = float(reported.mean()) if reported.numel() else 0.0
        span = max(1.0 - self.tau_min / self.tau_max, 0.1)
        return {"outputscale": max(0.01, 1.0 - noise_guess), "lengthscale": 1.0, "sigma": span}

    def _prior_means_hyper(self) -> FidelityHyperparameters:
        span = max(1.0 - self.tau_min / self.tau_max, 0.1)
        chol = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=self.dtype) * math.sqrt(span)
        return FidelityHyperparameters(
            1.0, torch.full((self.dim,), 0.5, dtype=self.dtype), chol, 1e-2, 1e-1
        )

    def _unpack(self, u: torch.Tensor) -> FidelityHyperparameters:
        d = self.dim
        zero = u.new_zeros(())
        chol = torch.stack(
            [torch.stack([u[d + 1].exp(), zero]), torch.stack([u[d + 2], u[d + 3].exp()])]
        )
        return FidelityHyperparameters(
            u[0].exp(), u[1 : d + 1].exp(), chol, u[d + 4].exp(), u[d + 5].exp()
        )

    def _pack(self, hyper: FidelityHyperparameters) -> np.ndarray:
        chol = hyper.chol
        values = [
            math.log(float(hyper.outputscale)),
            *hyper.lengthscale.log().tolist(),
            math.log(float(chol[0, 0])),
            float(chol[1, 0]),
            math.log(float(chol[1, 1])),
            math.log(float(hyper.env_noise)),
            math.log(float(hyper.rep_noise)),
        ]
        return np.array(values)

    def _box(self) -> list[tuple[float, float]]:
        """Bounds of the unconstrained vector (log scales; L₂₁ raw)."""
        log = math.log
        return [
            (log(0.01), log(20.0)),
            *[(log(0.02), log(4.0))] * self.dim,
            (log(0.05), log(5.0)),
            (-5.0, 5.0),
            (log(1e-3), log(5.0)),
            (log(1e-6), log(1.0)),
            (log(1e-6), log(1e3)),
        ]

    def neg_log_posterior(self, u: torch.Tensor) -> torch.Tensor:
        """−(log marginal likelihood + log prior) of the unconstrained vector u."""
        hyper = self._unpack(u)
        y = self._standard_y()
        gram = product_kernel(self.theta, self.s, self.theta, self.s, hyper)
        gram = gram + torch.diag(self._row_noise(hyper) + _JITTER)
        factor = torch.linalg.cholesky(gram)
        alpha = torch.cholesky_solve(y.unsqueeze(-1), factor).squeeze(-1)
        fit = 0.5 * (y * alpha).sum() + factor.diagonal().log().sum()
        means = self._prior_means()
        sigma = hyper.sigma
        priors = [(hyper.outputscale, means["outputscale"])]
        priors += [(value, means["lengthscale"]) for value in hyper.lengthscale]
        priors += [(sigma[0, 0], means["sigma"]), (sigma[1, 0], means["sigma"])]
        priors += [(sigma[1, 1], means["sigma"])]
        penalty = sum(0.5 * ((value - mu) / (mu / 2.0)) ** 2 for value, mu in priors)
        return fit + penalty

    def fit(self, *, restarts: int = 4, seed: int = 0) -> bool:
        """MAP hyperparameters by L-BFGS-B from the current values and random starts.

        Returns whether any start converged (the best finite one is kept either way).
        """
        if self.n < 2:
            return False
        generator = np.random.default_rng(seed)
        box = self._box()
        starts = [np.clip(self._pack(self.hyper), *zip(*box, strict=True))]
        for k in range(restarts):
            start = np.array([generator.uniform(low, high) for low, high in box])
            if k % 2 == 0:  # half the starts put the noise low (the authors' code does)
                start[-2] = math.log(1e-3)
            starts.append(start)
        best, best_value, converged = None, math.inf, False
        for start in starts:
            try:
                result = minimize(
                    self._objective,
                    start,
                    jac=True,
                    method="L-BFGS-B",
                    bounds=box,
                    options={"maxiter": self.fit_iterations},
                )
            except (RuntimeError, ValueError):  # a Cholesky failure at a wild start
                continue
            if np.isfinite(result.fun) and result.fun < best_value:
                best, best_value = result.x, float(result.fun)
                converged = converged or bool(result.success)
        if best is not None:
            self.hyper = self._detached(self._unpack(torch.tensor(best, dtype=self.dtype)))
            self._factor = None
        return converged

    def _objective(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        u = torch.tensor(x, dtype=self.dtype, requires_grad=True)
        value = self.neg_log_posterior(u)
        (grad,) = torch.autograd.grad(value, u)
        return float(value.detach()), grad.numpy()

    @staticmethod
    def _detached(hyper: FidelityHyperparameters) -> FidelityHyperparameters:
        return FidelityHyperparameters(
            float(hyper.outputscale),
            hyper.lengthscale.detach().clone(),
            hyper.chol.detach().clone(),
            float(hyper.env_noise),
            float(hyper.rep_noise),
        )

    # ------------------------------------------------------------------ posterior
    def _cholesky(self) -> torch.Tensor:
        if self._factor is None:
            gram = product_kernel(self.theta, self.s, self.theta, self.s, self.hyper)
            noise = self._row_noise(self.hyper) + _JITTER
            self._factor = torch.linalg.cholesky(gram + torch.diag(noise))
            self._alpha = torch.cholesky_solve(
                self._standard_y().unsqueeze(-1), self._factor
            ).squeeze(-1)
        return self._factor

    def _cross(self, theta: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """(n, m) prior covariance between the data and unit-cube points."""
        return product_kernel(self.theta, self.s, theta, s, self.hyper)

    def mean(self, theta: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """Posterior mean (m,) at θ (m, d) declared units and τ (m,)."""
        x, s = self.unit(theta), self.scale_tau(tau)
        if self.n == 0:
            return torch.full((x.shape[0],), self.y_mean, dtype=self.dtype)
        self._cholesky()
        standard = self._cross(x, s).T @ self._alpha
        return self.y_mean + self.y_scale * standard

    def variance(self, theta: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """Posterior variance (m,) of f at θ (m, d), τ (m,), in observation units²."""
        x, s = self.unit(theta), self.scale_tau(tau)
        prior = self.hyper.outputscale * fidelity_factor(s, s, self.hyper.sigma).diagonal()
        if self.n == 0:
            return prior * self.y_scale**2
        v = torch.linalg.solve_triangular(self._cholesky(), self._cross(x, s), upper=False)
        return (prior - v.pow(2).sum(0)).clamp_min(0.0) * self.y_scale**2

    def knowledge_inputs(
        self,
        alternatives: torch.Tensor,
        theta: torch.Tensor,
        tau: torch.Tensor,
        noise: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The (a, b) of the knowledge gradient (paper 001, App. A, Eqs. 9–11).

        One more trial at (θ_j, τ_j) with noise λ_j moves the posterior mean at the
        alternatives θ'_i (at τ_max) to a_i + b_ij · Z, Z ~ N(0, 1):

            a_i  = μⁿ(θ'_i, τ_max),
            b_ij = kⁿ((θ'_i, τ_max), (θ_j, τ_j)) / sqrt(λ_j + kⁿ((θ_j, τ_j), (θ_j, τ_j))).

        Args:
            alternatives: (p, d) θ' in declared units.
            theta: (m, d), tau: (m,), noise: (m,) observation units² — the candidate trials.

        Returns:
            a (p,), b (p, m), both in observation units.
        """
        a_x = self.unit(alternatives)
        a_s = torch.ones(a_x.shape[0], dtype=self.dtype)
        x, s = self.unit(theta), self.scale_tau(tau)
        prior_cross = product_kernel(a_x, a_s, x, s, self.hyper)
        prior_var = self.hyper.outputscale * fidelity_factor(s, s, self.hyper.sigma).diagonal()
        if self.n:
            factor = self._cholesky()
            v_a = torch.linalg.solve_triangular(factor, self._cross(a_x, a_s), upper=False)
            v_x = torch.linalg.solve_triangular(factor, self._cross(x, s), upper=False)
            cross = prior_cross - v_a.T @ v_x
            var = (prior_var - v_x.pow(2).sum(0)).clamp_min(0.0)
        else:
            cross, var = prior_cross, prior_var
        standard_noise = noise.to(self.dtype) / self.y_scale**2
        b = cross / (standard_noise + var).clamp_min(1e-18).sqrt()
        a = self.mean(alternatives, torch.full((a_x.shape[0],), self.tau_max, dtype=self.dtype))
        return a, b * self.y_scale
