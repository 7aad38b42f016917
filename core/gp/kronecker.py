"""Exact Kronecker-structured GP for array outputs: the ICM multi-task GP and the HOGP.

The outputs of one input x form an array of shape (d_2, ..., d_k) (t = Π d_i outputs). The
covariance of the stacked training outputs is

    K = K_XX ⊗ K_2 ⊗ ... ⊗ K_k + σ² I,

with K_XX (n × n) the data kernel and K_i (d_i × d_i) the output factors: one factor K_T for the
ICM multi-task GP (Bonilla et al.), one per output axis for the higher-order GP (Zhe et al.,
the factors being kernels of learned latent vectors). Paper 002 App. B.1 / C.1:

- Solves use eigendecompositions K_XX = Q_X Λ_X Q_Xᵀ, K_i = Q_i Λ_i Q_iᵀ (in float64, as the
  paper's App. A asks): K⁻¹ = (⊗Q)(⊗Λ + σ²)⁻¹(⊗Q)ᵀ, O(n³ + Σ d_i³ + n t (n + Σ d_i)).
- A new observation extends the root R of K_XX (R Rᵀ = K_XX + jitter·I) by one row, the
  update primitive of the paper (Jiang et al.'s root extension): l = R⁻¹ k_X(x),
  r = √(k(x, x) + jitter − lᵀl). O(n²); the output factors are untouched. The eigendecomposition
  of K_XX has no cheap rank-one update: it is recomputed on the next solve (O(n³), for the n of
  a BO run, milliseconds), never on the ingest path.

Tensor layout: a batch of outputs is (..., n, d_2, ..., d_k), data axis first; `mode_product`
applies a matrix along each output axis. Everything is float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["DataKernel", "KroneckerGP", "data_product", "mode_product"]

DataKernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (n1, d), (n2, d) -> (n1, n2)
JITTER = 1e-8  # added to K_XX's diagonal for its root (relative to a unit outputscale)


def mode_product(tensor: torch.Tensor, matrices: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Apply M_i along output axis i: out[..., a_2..a_k] = Σ Π M_i[a_i, b_i] T[..., b_2..b_k].

    Args:
        tensor: (..., d_2, ..., d_k), the last len(matrices) axes being the output axes.
        matrices: M_i of shape (e_i, d_i); None leaves its axis as it is.

    Returns:
        (..., e_2, ..., e_k).
    """
    k = len(matrices)
    for i, matrix in enumerate(matrices):
        if matrix is None:  # identity along this axis
            continue
        axis = tensor.dim() - k + i
        tensor = (tensor.movedim(axis, -1) @ matrix.transpose(-1, -2)).movedim(-1, axis)
    return tensor


def data_product(tensor: torch.Tensor, matrix: torch.Tensor, outputs: int) -> torch.Tensor:
    """Apply M along the data axis of (..., n, d_2, ..., d_k) (`outputs` = k − 1 output axes):
    (..., m, d_2, ..., d_k) for M (m, n)."""
    return mode_product(tensor, [matrix, *([None] * outputs)])


@dataclass
class _Eigen:
    values: torch.Tensor  # (m,)
    vectors: torch.Tensor  # (m, m)


def _eigh(matrix: torch.Tensor) -> _Eigen:
    values, vectors = torch.linalg.eigh(matrix)
    return _Eigen(values.clamp_min(0.0), vectors)


class KroneckerGP:
    """Posterior of a zero-mean GP with covariance K_XX ⊗ (⊗_i K_i) and noise σ², exact.

    The caller standardizes: `y` is the data minus the prior mean, divided by a scale.

    Args:
        kernel: the data kernel k(x, x') as a function of two input batches.
        factors: the output factors K_i, (d_i, d_i) each, positive semi-definite.
        noise: σ² > 0, the same for every output.
        x: (n, d) training inputs; y: (n, d_2, ..., d_k) training outputs (standardized).
    """

    def __init__(
        self,
        kernel: DataKernel,
        factors: Sequence[torch.Tensor],
        noise: float,
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> None:
        if noise <= 0:
            raise ValueError(f"noise must be positive, got {noise}")
        self.kernel = kernel
        self.factors = [f.to(torch.float64) for f in factors]
        self.shape = tuple(f.shape[0] for f in self.factors)
        if tuple(y.shape[1:]) != self.shape or y.shape[0] != x.shape[0]:
            raise ValueError(f"y {tuple(y.shape)} does not match x {tuple(x.shape)} and factors")
        self.noise = float(noise)
        self.x = x.to(torch.float64)
        self.y = y.to(torch.float64)
        self._factor_eigen = [_eigh(f) for f in self.factors]
        # L_i = Q_i Λ_i^½: a root of each factor, for prior samples
        self.factor_roots = [e.vectors * e.values.sqrt() for e in self._factor_eigen]
        self.root = torch.linalg.cholesky(self._kxx(self.x) + JITTER * torch.eye(len(self.x)))
        self._data_eigen: _Eigen | None = None
        self._rotated_y: torch.Tensor | None = None

    # ------------------------------------------------------------------ structure
    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    def _kxx(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x, x).to(torch.float64)

    def data_eigen(self) -> _Eigen:
        """Eigendecomposition of K_XX (recomputed after new data)."""
        if self._data_eigen is None:
            self._data_eigen = _eigh(self._kxx(self.x))
        return self._data_eigen

    @property
    def factor_eigen(self) -> list[_Eigen]:
        """The eigendecompositions K_i = Q_i Λ_i Q_iᵀ of the output factors (fixed)."""
        return self._factor_eigen

    def output_values(self) -> torch.Tensor:
        """(d_2, ..., d_k) λ_2 ⊗ ... ⊗ λ_k: the eigenvalues of K_T = ⊗ K_i on the output grid."""
        out = torch.ones((), dtype=torch.float64)
        for eigen in self._factor_eigen:
            out = out.unsqueeze(-1) * eigen.values
        return out

    def _denominator(self) -> torch.Tensor:
        """(n, d_2, ..., d_k) λ_X ⊗ λ_2 ⊗ ... ⊗ λ_k + σ²."""
        values = self.data_eigen().values.reshape(-1, *([1] * len(self.shape)))
        return values * self.output_values() + self.noise

    def rotated_y(self) -> torch.Tensor:
        """(n, d_2, ..., d_k) (Q_X ⊗ Q_2 ⊗ ... ⊗ Q_k)ᵀ vec y: the data in the eigenbasis
        (recomputed after new data)."""
        if self._rotated_y is None:
            qs = [e.vectors.T for e in self._factor_eigen]
            self._rotated_y = mode_product(self.y, [self.data_eigen().vectors.T, *qs])
        return self._rotated_y

    # ------------------------------------------------------------------ learning
    def learn_one(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add one observation: x (d,), y (d_2, ..., d_k). Extends the root of K_XX by one row
        (O(n²)); the output factors stay as they are."""
        x = x.to(torch.float64).reshape(1, -1)
        k = self.kernel(self.x, x).to(torch.float64)  # (n, 1)
        l12 = torch.linalg.solve_triangular(self.root, k, upper=False)  # (n, 1)
        kxx = self._kxx(x)[0, 0] + JITTER
        l22 = (kxx - (l12 * l12).sum()).clamp_min(JITTER).sqrt()
        n = self.n
        root = self.root.new_zeros(n + 1, n + 1)
        root[:n, :n] = self.root
        root[n, :n] = l12[:, 0]
        root[n, n] = l22
        self.root = root
        self.x = torch.cat([self.x, x])
        self.y = torch.cat([self.y, y.to(torch.float64).unsqueeze(0)])
        self._data_eigen = None
        self._rotated_y = None

    # ------------------------------------------------------------------ algebra
    def solve(self, rhs: torch.Tensor) -> torch.Tensor:
        """K⁻¹ rhs for rhs (..., n, d_2, ..., d_k), through the eigendecompositions."""
        data = self.data_eigen()
        qs = [e.vectors for e in self._factor_eigen]
        rotated = mode_product(rhs, [data.vectors.T, *(q.T for q in qs)])
        scaled = rotated / self._denominator()
        return mode_product(scaled, [data.vectors, *qs])

    def cross(self, x_test: torch.Tensor) -> torch.Tensor:
        """(m, n) K_{x_test, X}."""
        return self.kernel(x_test.to(torch.float64), self.x).to(torch.float64)

    def posterior_mean(self, x_test: torch.Tensor) -> torch.Tensor:
        """(m, d_2, ..., d_k) E[f(x_test)] (standardized units)."""
        weights = mode_product(self.solve(self.y), self.factors)
        return data_product(weights, self.cross(x_test), len(self.shape))

    def posterior_variance(self, x_test: torch.Tensor) -> torch.Tensor:
        """(m, d_2, ..., d_k) Var[f(x_test)], the latent function's marginal variances."""
        data = self.data_eigen()
        a2 = (self.cross(x_test) @ data.vectors) ** 2  # (m, n)
        inverse = (1.0 / self._denominator()).reshape(self.n, -1)
        g = (a2 @ inverse).reshape(-1, *self.shape)  # (m, p_2, ..., p_k)
        weights = [e.vectors**2 * e.values**2 for e in self._factor_eigen]  # [o_i, p_i]
        reduction = mode_product(g, weights)
        prior = torch.diagonal(self._kxx(x_test)).reshape(-1, *([1] * len(self.shape)))
        diag = torch.ones(self.shape, dtype=torch.float64)
        for i, factor in enumerate(self.factors):
            view = [1] * len(self.shape)
            view[i] = -1
            diag = diag * torch.diagonal(factor).reshape(view)
        return (prior * diag - reduction).clamp_min(0.0)

    def joint_covariance(self, x_test: torch.Tensor) -> torch.Tensor:
        """(m t, m t) the dense posterior covariance of vec f(x_test) (data-major): the
        'distributional' reference, O((m t)²) memory. Only for tests and the sampling bench."""
        kt = self.factors[0]
        for factor in self.factors[1:]:
            kt = torch.kron(kt, factor)
        cross = torch.kron(self.cross(x_test), kt)  # (m t, n t)
        kxx = torch.kron(self._kxx(self.x), kt) + self.noise * torch.eye(self.n * kt.shape[0])
        prior = torch.kron(self._kxx(x_test.to(torch.float64)), kt)
        return prior - cross @ torch.linalg.solve(kxx, cross.T)
