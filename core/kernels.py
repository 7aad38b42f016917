"""Stationary ARD kernels, evaluated exactly as gpytorch evaluates them.

The incremental GP computes kernel rows itself (one row per append, no gpytorch module in the hot
path), so these functions reproduce gpytorch's `ScaleKernel(MaternKernel(nu=2.5))` and
`ScaleKernel(RBFKernel())` numerically: inputs divided by the lengthscales, centred on the mean of
the first argument before the squared distance is expanded, distances clamped away from zero.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch

KernelName = Literal["matern52", "rbf"]
KERNELS: tuple[str, ...] = ("matern52", "rbf")

_SQRT5 = math.sqrt(5.0)


def scaled_sq_dist(
    x1: torch.Tensor, x2: torch.Tensor, lengthscale: torch.Tensor, center: torch.Tensor
) -> torch.Tensor:
    """Squared distance between lengthscale-scaled inputs, by expansion as gpytorch does.

    Args:
        x1: (..., n, d) inputs.
        x2: (..., m, d) inputs.
        lengthscale: (..., 1, d) positive lengthscales.
        center: (..., 1, d) point subtracted from both inputs for numerical stability.

    Returns:
        (..., n, m) squared distances, clamped at 0.
    """
    a = (x1 - center) / lengthscale
    b = (x2 - center) / lengthscale
    a_norm = a.pow(2).sum(-1, keepdim=True)
    b_norm = b.pow(2).sum(-1, keepdim=True)
    sq = a_norm - 2.0 * (a @ b.mT) + b_norm.mT
    return sq.clamp_min(0.0)


def correlation_from_sq_dist(sq: torch.Tensor, kernel: KernelName) -> torch.Tensor:
    """Unit-variance kernel value from squared scaled distance."""
    if kernel == "rbf":
        return torch.exp(-0.5 * sq)
    if kernel == "matern52":
        # gpytorch clamps the squared distance at 1e-30 before the square root, which keeps the
        # gradient of sqrt finite at coincident points.
        r = sq.clamp_min(1e-30).sqrt()
        return (1.0 + _SQRT5 * r + (5.0 / 3.0) * r.pow(2)) * torch.exp(-_SQRT5 * r)
    raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")


def kernel_matrix(
    x1: torch.Tensor,
    x2: torch.Tensor,
    lengthscale: torch.Tensor,
    outputscale: torch.Tensor,
    kernel: KernelName,
) -> torch.Tensor:
    """Covariance between two sets of inputs.

    Args:
        x1: (b, n, d) inputs (the centring point is the mean of x1 over n, as in gpytorch).
        x2: (b, m, d) inputs.
        lengthscale: (b, d).
        outputscale: (b,).
        kernel: "matern52" or "rbf".

    Returns:
        (b, n, m) covariance.
    """
    ls = lengthscale.unsqueeze(-2)
    center = x1.mean(dim=-2, keepdim=True) if x1.shape[-2] > 0 else torch.zeros_like(ls)
    sq = scaled_sq_dist(x1, x2, ls, center)
    return outputscale[..., None, None] * correlation_from_sq_dist(sq, kernel)


def kernel_row(
    x: torch.Tensor,
    x_new: torch.Tensor,
    lengthscale: torch.Tensor,
    outputscale: torch.Tensor,
    kernel: KernelName,
) -> torch.Tensor:
    """Covariance between n stored inputs and one new input per batch member.

    The hot path of every append: direct differences (more accurate than the expansion, and
    fewer operations for a single column).

    Args:
        x: (b, n, d) stored inputs.
        x_new: (b, d) new input.
        lengthscale: (b, d).
        outputscale: (b,).

    Returns:
        (b, n) covariances.
    """
    diff = (x - x_new.unsqueeze(-2)).div_(lengthscale.unsqueeze(-2))
    if kernel == "rbf":
        return _exp_neg_(diff.square_().sum(-1).mul_(0.5)).mul_(outputscale.unsqueeze(-1))
    s = torch.linalg.vector_norm(diff, dim=-1).mul_(_SQRT5)  # √5 r
    poly = s.square().div_(3.0).add_(s).add_(1.0)  # 1 + √5 r + 5r²/3
    return poly.mul_(_exp_neg_(s)).mul_(outputscale.unsqueeze(-1))


def _exp_neg_(t: torch.Tensor) -> torch.Tensor:
    """exp(−t) in place.

    On the CPU through numpy, on the calling thread: torch runs `exp_` on its thread pool from a
    few thousand elements on (a kernel row of 6 nodes × 1000 observations), and waking the pool
    costs more than the work — measured 2 ms per call instead of 20 µs when other processes hold
    the cores, which made the exponential the most expensive step of an append.
    """
    if t.device.type == "cpu" and not t.requires_grad and t.is_contiguous():
        values = t.numpy()
        np.exp(np.negative(values, out=values), out=values)
        return t
    return t.neg_().exp_()


@torch.no_grad()
def gram_matrix(
    x: torch.Tensor, lengthscale: torch.Tensor, outputscale: torch.Tensor, kernel: KernelName
) -> torch.Tensor:
    """Covariance of a set of inputs with itself, computed in place (no autograd).

    The same values as `kernel_matrix(x, x, ...)` with two (b, n, n) buffers at most, where the
    general version holds half a dozen temporaries: at n = 4000 and b = 8 that is the difference
    between 2 and 6 GB.

    Args:
        x: (b, n, d) inputs.
        lengthscale: (b, d).
        outputscale: (b,).

    Returns:
        (b, n, n) covariance.
    """
    a = (x - x.mean(dim=-2, keepdim=True)) / lengthscale.unsqueeze(-2)
    norms = a.pow(2).sum(-1)
    gram = torch.baddbmm(norms.unsqueeze(-1), a, a.mT, alpha=-2.0)
    gram.add_(norms.unsqueeze(-2)).clamp_min_(0.0)
    if kernel == "rbf":
        gram.mul_(-0.5).exp_()
    elif kernel == "matern52":
        scaled = gram.clamp_min_(1e-30).sqrt_().mul_(_SQRT5)  # √5 r, in place
        poly = scaled.square().div_(3.0).add_(scaled).add_(1.0)  # 1 + √5 r + 5r²/3
        gram = scaled.neg_().exp_().mul_(poly)
        del poly
    else:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")
    return gram.mul_(outputscale[..., None, None])
