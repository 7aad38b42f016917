"""Posterior samples of a `KroneckerGP` by Matheron's rule (paper 002, App. C.1).

A joint prior sample over (training inputs X, test inputs x*) is corrected by the data:

    (f_X, f_*) = ([[R, 0], [L12, L22]] ⊗ L_T) z,      R Rᵀ = K_XX, L_T = ⊗ L_i
    L12 = (R⁻¹ K_X*)ᵀ,   L22 L22ᵀ = K_** − L12 L12ᵀ
    sample = f_* + (K_*X ⊗ K_T)(K_XX ⊗ K_T + σ² I)⁻¹ (y − f_X − ε),   ε ~ N(0, σ² I)

The solve is the Kronecker eigen-solve, so a sample costs O(n³ + Σ d_i³ + n t (n + Σ d_i)),
additive in n and t, instead of the O((n_test t)³) of a Cholesky of the joint covariance. With
fixed base samples (z_X, ε) the corrected weights V = K_T-weighted solve do not depend on x*:
`MatheronSamples` computes them once and reuses them for every candidate an acquisition
optimizer asks about (sample-average approximation on fixed base samples).
"""

from __future__ import annotations

import torch

from core.gp.kronecker import KroneckerGP, data_product, mode_product

__all__ = ["MatheronSamples"]

_JITTER = 1e-8


class MatheronSamples:
    """S posterior sample paths of a `KroneckerGP`, on fixed base samples.

    Args:
        gp: the model (its state at construction is used; rebuild after it learns).
        samples: S.
        generator: seeds the base samples.
    """

    def __init__(self, gp: KroneckerGP, samples: int, generator: torch.Generator) -> None:
        self.gp = gp
        self.samples = samples
        self.generator = generator
        shape = (samples, gp.n, *gp.shape)
        z_train = self._normal(shape)
        noise = self._normal(shape) * gp.noise**0.5
        # z ×_i L_i once: the training part of every joint prior sample
        self.z_train_roots = mode_product(z_train, gp.factor_roots)  # (S, n, *shape)
        self.outputs = len(gp.shape)
        prior_train = data_product(self.z_train_roots, gp.root, self.outputs)
        residual = gp.y - prior_train - noise
        self.weights = mode_product(gp.solve(residual), gp.factors)  # (S, n, *shape)
        self._z_single = self._normal((samples, 1, *gp.shape))

    def _normal(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator, dtype=torch.float64)

    def _l12(self, cross: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve_triangular(self.gp.root, cross.T, upper=False).T  # (m, n)

    def joint(self, x_test: torch.Tensor) -> torch.Tensor:
        """(S, m, *shape) samples of f at the m points of x_test, jointly (standardized units)."""
        gp = self.gp
        cross = gp.cross(x_test)  # (m, n)
        l12 = self._l12(cross)
        kss = gp.kernel(x_test.to(torch.float64), x_test.to(torch.float64)).to(torch.float64)
        schur = kss - l12 @ l12.T
        eye = torch.eye(len(x_test), dtype=torch.float64)
        l22 = torch.linalg.cholesky(0.5 * (schur + schur.T) + _JITTER * eye)
        z_test = self._normal((self.samples, len(x_test), *gp.shape))
        k = self.outputs
        test_part = data_product(mode_product(z_test, gp.factor_roots), l22, k)
        prior = data_product(self.z_train_roots, l12, k) + test_part
        return prior + data_product(self.weights, cross, k)

    def marginal(self, x_test: torch.Tensor) -> torch.Tensor:
        """(S, b, *shape) samples at each of b points on its own (q = 1 acquisitions), the
        test base sample shared by all points (common random numbers); differentiable in
        x_test.

        Each point's joint root is [[R, 0], [l12, r]] with r = √(k(x, x) − |l12|²).
        """
        gp = self.gp
        cross = gp.cross(x_test)  # (b, n)
        l12 = self._l12(cross)
        x64 = x_test.to(torch.float64)
        prior_var = torch.diagonal(gp.kernel(x64, x64)).to(torch.float64)
        r = (prior_var - (l12 * l12).sum(-1)).clamp_min(_JITTER).sqrt()
        single = mode_product(self._z_single, gp.factor_roots)  # (S, 1, *shape)
        view = (1, -1, *([1] * len(gp.shape)))
        k = self.outputs
        prior = data_product(self.z_train_roots, l12, k) + single * r.reshape(view)
        return prior + data_product(self.weights, cross, k)
