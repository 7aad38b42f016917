"""Posterior samples of a `KroneckerGP` by Matheron's rule (paper 002, App. C.1).

A joint prior sample over (training inputs X, test inputs x*) is corrected by the data:

    (f_X, f_*) = ([[R, 0], [L12, L22]] ⊗ L_T) z,      R Rᵀ = K_XX, L_T L_Tᵀ = K_T = ⊗ K_i
    L12 = K_*X R⁻ᵀ,   L22 L22ᵀ = K_** − L12 L12ᵀ
    sample = f_* + (K_*X ⊗ K_T)(K_XX ⊗ K_T + σ² I)⁻¹ (y − f_X − ε),   ε ~ N(0, σ² I)

Any roots R, L_T serve (the joint prior only depends on R Rᵀ and L_T L_Tᵀ). This module takes
the eigen roots R = Q_X (Λ_X + j)^½ (j the jitter of `KroneckerGP`'s root), L_T = Q_T Λ_T^½
with Q_T = ⊗ Q_i, Λ_T = ⊗ Λ_i, because then every (n t)-sized step is diagonal in the eigenbasis
(Q_X ⊗ Q_T), where the noise is isotropic too (ε' = (Q_X ⊗ Q_T)ᵀ ε ~ N(0, σ² I)):

    (Q_X ⊗ Q_T)ᵀ f_X = (Λ_X + j)^½ ⊗ Λ_T^½ ∘ z_X                          (elementwise)
    (K_*X ⊗ K_T)(K_XX ⊗ K_T + σ²I)⁻¹ r = (K_*X Q_X ⊗ Q_T) [Λ_T ∘ (Q_X ⊗ Q_T)ᵀ r / D],
                                          D = Λ_X ⊗ Λ_T + σ²
    (L12 ⊗ L_T) z_X = (K_*X Q_X ⊗ Q_T) [(Λ_X + j)^-½ ⊗ Λ_T^½ ∘ z_X]

so that, writing B = K_*X Q_X (m × n), ỹ = (Q_X ⊗ Q_T)ᵀ y and u = λ_X + j,

    sample = (B ⊗ Q_T) C + (L22 ⊗ Q_T Λ_T^½) z_*,
    C = Λ_T ỹ / D + a ∘ z_X + b ∘ ε'/σ,
    a = Λ_T^½ u^-½ (D − Λ_T u) / D = Λ_T^½ u^-½ (σ² − j Λ_T) / D,   b = −σ Λ_T / D.

C (n × t per sample) does not depend on x*: it holds the sample's prior on X, its noise and the
data's correction — the "fixed base samples" of the sample-average approximation — and is
computed once. Its entries are independent Gaussians (z_X and ε' are), so it is drawn in one
pass as C = Λ_T ỹ / D + √(a² + b²) ∘ z: the same distribution as the two draws, half the
random numbers. A sample at m test points then costs one (m × n)(n × t) product and the output
rotations Q_i, O(m t (n + Σ d_i)) per sample; nothing of size (n t)² is formed, the only
decompositions are the eigendecompositions of K_XX (n × n, cached by the model) and of the
factors (d_i × d_i), and the m × m Cholesky of each test set's L22. The distribution is exactly
that of Matheron's rule with the Cholesky root (tests/test_gp_kronecker.py compares both with
the dense posterior).
"""

from __future__ import annotations

import torch

from core.gp.kronecker import JITTER, KroneckerGP, mode_product

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
        self.outputs = len(gp.shape)
        data = gp.data_eigen()
        self._q_x = data.vectors  # (n, n)
        self._u_inv_sqrt = (data.values + JITTER).rsqrt()  # (n,) (λ_X + j)^-½
        self._q_out = [e.vectors for e in gp.factor_eigen]  # Q_i (d_i, d_i)
        lam_t = gp.output_values()  # (*shape)
        self._lam_t_sqrt = lam_t.sqrt()
        lam_x = data.values.reshape(-1, *([1] * self.outputs))  # (n, 1, ..., 1)
        denominator = lam_x * lam_t + gp.noise  # D (n, *shape)
        a = self._lam_t_sqrt * self._u_inv_sqrt.reshape(lam_x.shape)
        a = a * (gp.noise - JITTER * lam_t) / denominator
        b = gp.noise**0.5 * lam_t / denominator
        spread = (a * a + b * b).sqrt()  # (n, *shape)
        mean = lam_t * gp.rotated_y() / denominator  # (n, *shape)
        # C = mean + spread ∘ z, built in place on the one (S, n, *shape) draw
        self.paths = self._normal((samples, gp.n, *gp.shape)).mul_(spread).add_(mean)
        self._z_single = self._normal((samples, 1, *gp.shape)) * self._lam_t_sqrt

    def _normal(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator, dtype=torch.float64)

    def _project(self, b: torch.Tensor, test: torch.Tensor) -> torch.Tensor:
        """(S, m, *shape) (B ⊗ Q_T) C + (I ⊗ Q_T) test, for B (m, n) and `test` (S, m, *shape)
        the test part in the output eigenbasis."""
        n, t = self.gp.n, test[0, 0].numel()
        flat = b @ self.paths.reshape(self.samples, n, t)  # (S, m, t): a batched GEMM, no copy
        rotated = flat.reshape(test.shape) + test
        return mode_product(rotated, self._q_out)

    def joint(self, x_test: torch.Tensor) -> torch.Tensor:
        """(S, m, *shape) samples of f at the m points of x_test, jointly (standardized units)."""
        gp = self.gp
        x64 = x_test.to(torch.float64)
        b = gp.cross(x64) @ self._q_x  # (m, n) K_*X Q_X
        l12 = b * self._u_inv_sqrt  # (m, n) K_*X R⁻ᵀ with R = Q_X (Λ_X + j)^½
        kss = gp.kernel(x64, x64).to(torch.float64)
        schur = kss - l12 @ l12.T
        eye = torch.eye(len(x_test), dtype=torch.float64)
        l22 = torch.linalg.cholesky(0.5 * (schur + schur.T) + _JITTER * eye)
        m, t = len(x_test), self._lam_t_sqrt.numel()
        z_test = self._normal((self.samples, m, *gp.shape)) * self._lam_t_sqrt
        test = (l22 @ z_test.reshape(self.samples, m, t)).reshape(z_test.shape)
        return self._project(b, test)

    def marginal(self, x_test: torch.Tensor) -> torch.Tensor:
        """(S, b, *shape) samples at each of b points on its own (q = 1 acquisitions), the
        test base sample shared by all points (common random numbers); differentiable in
        x_test.

        Each point's joint root is [[R, 0], [l12, r]] with r = √(k(x, x) − |l12|²).
        """
        b, r = self._marginal_terms(x_test)
        view = (1, -1, *([1] * self.outputs))
        return self._project(b, self._z_single * r.reshape(view))

    def _marginal_terms(self, x_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """B = K_*X Q_X (b, n) and r (b,) of `marginal` at the b points of x_test."""
        gp = self.gp
        x64 = x_test.to(torch.float64)
        b = gp.cross(x64) @ self._q_x  # (b, n)
        l12 = b * self._u_inv_sqrt
        prior_var = torch.diagonal(gp.kernel(x64, x64)).to(torch.float64)
        r = (prior_var - (l12 * l12).sum(-1)).clamp_min(_JITTER).sqrt()
        return b, r

    def coefficients(self, x_test: torch.Tensor) -> torch.Tensor:
        """(b, n + 1) [B, r] at the b points of x_test: `marginal(x_test)[s, i]` is
        Σ_k coefficients[i, k] · basis()[s, k] (linear in the paths); differentiable."""
        b, r = self._marginal_terms(x_test)
        return torch.cat([b, r.unsqueeze(-1)], dim=-1)

    def basis(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """(s, n + 1, *shape) the paths' terms in the output space, for samples [start, stop):
        (I ⊗ Q_T) C row by row, then Q_T z (the test base sample), so that a marginal sample
        is their combination with `coefficients` — the output rotations done once per path
        instead of once per point and call. O(s (n + 1) t Σ d_i); chunk over samples to bound
        the memory (s (n + 1) t numbers)."""
        stacked = torch.cat([self.paths[start:stop], self._z_single[start:stop]], dim=1)
        return mode_product(stacked, self._q_out)
