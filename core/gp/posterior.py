"""The posterior: its own object, with joint sampling; prediction from the factor.

At unit-cube queries Z* (per member, with n rows, factor L and v = L⁻¹ỹ):

    W = L⁻¹ K(Z, Z*),   mean = Wᵀv,   covariance = K(Z*, Z*) − WᵀW   (standardized units)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.errors import NumericalError
from core.gp.buffers import GPBuffers, row_mask
from core.kernels import KernelName, kernel_matrix

__all__ = ["FactorCache", "GPPosterior", "in_output_units", "latent_posterior"]


@dataclass(frozen=True)
class GPPosterior:
    """Posterior of the latent function (no observation noise), in output units.

    Attributes:
        mean: (b, q)
        variance: (b, q)
        covariance: (b, q, q), present when asked for.

    A posterior of one member (`posterior(x, members=j)`) drops the leading b.
    """

    mean: torch.Tensor
    variance: torch.Tensor
    covariance: torch.Tensor | None = None

    @property
    def stddev(self) -> torch.Tensor:
        return self.variance.clamp_min(0.0).sqrt()

    def rsample(
        self,
        num_samples: int,
        base_samples: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Joint samples mean + R ε with R Rᵀ = covariance (+ the least jitter that factors).

        Args:
            num_samples: s.
            base_samples: optional (s, b, q) standard normals ε (for common random numbers);
                drawn with `generator` when None.

        Returns:
            (s, b, q) samples.

        Raises:
            ValueError: the posterior has no covariance (ask `full_covariance=True`).
            NumericalError: the covariance is indefinite even with jitter 1e-3 of its mean
                variance.

        Example:
            >>> mean, variance = torch.zeros(1, 2), torch.ones(1, 2)  # one member, q = 2
            >>> post = GPPosterior(mean, variance, torch.eye(2).expand(1, 2, 2))
            >>> post.rsample(5, generator=torch.Generator().manual_seed(0)).shape
            torch.Size([5, 1, 2])
        """
        if self.covariance is None:
            raise ValueError("rsample needs the covariance: posterior(..., full_covariance=True)")
        root = _sampling_root(self.covariance)
        shape = (num_samples, *self.mean.shape)
        if base_samples is None:
            base_samples = torch.randn(
                shape, dtype=self.mean.dtype, device=self.mean.device, generator=generator
            )
        if base_samples.shape != shape:
            raise ValueError(f"base_samples must have shape {shape}")
        return self.mean + (root @ base_samples.unsqueeze(-1)).squeeze(-1)


def _sampling_root(cov: torch.Tensor) -> torch.Tensor:
    """Cholesky factor of (..., q, q) `cov` plus the least jitter, from 1e-10 up, that works."""
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    scale = cov.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1e-12)[..., None, None]
    for exponent in range(-10, -2):
        root, info = torch.linalg.cholesky_ex(cov + (10.0**exponent) * scale * eye)
        if not (info != 0).any():
            return root
    raise NumericalError("posterior covariance is not positive semi-definite")


class FactorCache:
    """What prediction derives from the factor, computed once per change of it.

    The factor's buffer is (b, c, c) with c ≥ the rows held: solves want a contiguous copy of
    its (b, w, w) corner, w = max_j n_j, which costs as much as a solve to make.
    """

    def __init__(self, buffers: GPBuffers) -> None:
        self._buffers = buffers
        self._factor: tuple[int, torch.Tensor] | None = None
        self._alpha: tuple[int, torch.Tensor] | None = None

    def factor(self) -> torch.Tensor:
        """(b, w, w) contiguous copy of the factor."""
        buffers = self._buffers
        if self._factor is None or self._factor[0] != buffers.version:
            width = max(buffers.rows)
            self._factor = (buffers.version, buffers.factor[:, :width, :width].contiguous())
        return self._factor[1]

    def alpha(self) -> torch.Tensor:
        """(b, w) weights α = (K + σ²I)⁻¹ ỹ = L⁻ᵀv in standardized units (zero past n_j)."""
        buffers = self._buffers
        if self._alpha is None or self._alpha[0] != buffers.version:
            width = max(buffers.rows)
            alpha = torch.linalg.solve_triangular(
                self.factor().mT, buffers.v[:, :width].unsqueeze(-1), upper=True
            ).squeeze(-1)
            self._alpha = (buffers.version, alpha)
        return self._alpha[1]


def latent_posterior(
    buffers: GPBuffers,
    cache: FactorCache,
    z: torch.Tensor,
    idx: torch.Tensor,
    every: bool,
    full: bool,
    lengthscale: torch.Tensor,
    outputscale: torch.Tensor,
    kernel: KernelName,
) -> GPPosterior:
    """Posterior in standardized units at unit-cube queries; differentiable in z.

    Args:
        z: (b', q, d) queries of the members `idx` (b',).
        every: idx is every member in order (the factor is then used without gathering).
        full: also compute the (b', q, q) covariance.
        lengthscale, outputscale: (b, d) and (b,).
    """
    rows = [buffers.rows[j] for j in idx.tolist()]
    ls, os = lengthscale[idx], outputscale[idx]
    prior_var = os.unsqueeze(-1).expand(z.shape[:-1])
    width = max(buffers.rows)
    if max(rows) == 0:
        cov = kernel_matrix(z, z, ls, os, kernel) if full else None
        return GPPosterior(torch.zeros_like(prior_var), prior_var, cov)
    k_xq = kernel_matrix(buffers.z[idx, :width], z, ls, os, kernel)
    k_xq = k_xq * row_mask(rows, width, z.device).unsqueeze(-1)
    factor = cache.factor()
    factor = factor if every else factor[idx]
    w = torch.linalg.solve_triangular(factor, k_xq, upper=False)
    mean = (w * buffers.v[idx, :width].unsqueeze(-1)).sum(-2)
    var = (prior_var - w.pow(2).sum(-2)).clamp_min(0.0)
    cov = None
    if full:
        cov = kernel_matrix(z, z, ls, os, kernel) - w.mT @ w
    return GPPosterior(mean, var, cov)


def in_output_units(
    post: GPPosterior, y_mean: torch.Tensor, y_scale: torch.Tensor, single: bool
) -> GPPosterior:
    """A standardized posterior of b' members in output units; `single` drops the leading b'.

    Args:
        y_mean, y_scale: (b',) the members' frozen standardization.
    """
    scale = y_scale[:, None]
    mean = y_mean[:, None] + scale * post.mean
    var = scale.pow(2) * post.variance
    cov = None if post.covariance is None else scale.unsqueeze(-1).pow(2) * post.covariance
    if single:
        return GPPosterior(mean[0], var[0], None if cov is None else cov[0])
    return GPPosterior(mean, var, cov)
