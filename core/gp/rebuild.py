"""The O(n³) refactorization from stored rows, in chunks, with jitter retries."""

from __future__ import annotations

import torch

from core.errors import NumericalError
from core.gp.buffers import GPBuffers, row_mask
from core.kernels import KernelName, gram_matrix

__all__ = ["REBUILD_BYTES", "add_jitter", "refactorize"]

REBUILD_BYTES = 512 * 2**20  # kernel matrices held at once while refactorizing
MAX_JITTER_TRIES = 8


def add_jitter(
    jitter: torch.Tensor, outputscale: torch.Tensor, members: list[int] | torch.Tensor
) -> None:
    """Raise the members' jitter tenfold, to at least 1e-8 of their output scale (in place).

    Args:
        jitter, outputscale: (b,).
    """
    jitter[members] = torch.maximum(jitter[members] * 10, 1e-8 * outputscale[members])


def refactorize(
    buffers: GPBuffers,
    members: list[int],
    *,
    kernel: KernelName,
    lengthscale: torch.Tensor,
    outputscale: torch.Tensor,
    noise: torch.Tensor,
    jitter: torch.Tensor,
    y_mean: torch.Tensor,
    y_scale: torch.Tensor,
) -> None:
    """Refactorize the listed members from their stored rows (O(n³) each).

    Members are factorized in chunks whose kernel matrices fit REBUILD_BYTES, so a rebuild
    of many large members never holds all their matrices at once. A member whose kernel matrix
    is not numerically positive definite gets more jitter (in `jitter`, in place) and another
    try.

    Args:
        lengthscale: (b, d); outputscale, noise, jitter, y_mean, y_scale: (b,), noise in
            standardized units.

    Raises:
        NumericalError: a kernel matrix still indefinite after MAX_JITTER_TRIES increases.
    """
    buffers.version += 1
    if not members or max(buffers.rows[j] for j in members) == 0:
        return
    width = max(buffers.rows[j] for j in members)
    per_member = width * width * buffers.factor.element_size()
    chunk = max(1, REBUILD_BYTES // max(per_member, 1))
    hyper = (kernel, lengthscale, outputscale, noise, jitter, y_mean, y_scale)
    for start in range(0, len(members), chunk):
        refactorize_chunk(buffers, members[start : start + chunk], *hyper)


def refactorize_chunk(
    buffers: GPBuffers,
    members: list[int],
    kernel: KernelName,
    lengthscale: torch.Tensor,
    outputscale: torch.Tensor,
    noise: torch.Tensor,
    jitter: torch.Tensor,
    y_mean: torch.Tensor,
    y_scale: torch.Tensor,
) -> None:
    """Refactorize members at once: their Gram matrices, Cholesky with retries, then v."""
    rows = [buffers.rows[j] for j in members]
    width = max(rows)
    idx = torch.tensor(members, device=buffers.factor.device)
    held = row_mask(rows, width, buffers.factor.device)
    gram = gram_matrix(buffers.z[idx, :width], lengthscale[idx], outputscale[idx], kernel)
    gram.mul_(held.unsqueeze(-1) & held.unsqueeze(-2))
    for _attempt in range(MAX_JITTER_TRIES):
        diag = outputscale[idx] + noise[idx] + jitter[idx]
        gram.diagonal(dim1=-2, dim2=-1).copy_(torch.where(held, diag.unsqueeze(-1), 1.0))
        lower, info = torch.linalg.cholesky_ex(gram)
        failed = info != 0
        if not failed.any():
            break
        add_jitter(jitter, outputscale, idx[failed])
    else:
        raise NumericalError(
            f"kernel matrix of members {members} is not positive definite "
            f"after {MAX_JITTER_TRIES} jitter increases"
        )
    standardized = (buffers.y[idx, :width] - y_mean[idx, None]) / y_scale[idx, None]
    y_std = torch.where(held, standardized, 0.0)
    buffers.factor[idx, :width, :width] = lower
    solved = torch.linalg.solve_triangular(lower, y_std.unsqueeze(-1), upper=False)
    buffers.v[idx, :width] = solved.squeeze(-1)
