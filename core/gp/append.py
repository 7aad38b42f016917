"""The O(n²) row append: each learner's factor grows by one row, read in place by BLAS.

Per member with n rows, appending x*, y* (unit-cube input, standardized output ỹ*):

    l = L⁻¹ k(Z, x*)                  the only O(n²) step, one triangular solve
    d = √(k(x*, x*) + σ² + jitter − lᵀl)
    L ← [[L, 0], [lᵀ, d]],   v ← [v; (ỹ* − lᵀv) / d]

lᵀv is the posterior mean at x* before the append and d² the predictive variance, so the
surprise of every reading costs nothing extra.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from core.blas import append_rows_, set_entries_
from core.gp.buffers import GPBuffers
from core.gp.moments import RunningMoments
from core.kernels import KernelName, kernel_row

__all__ = ["MemberScalars", "append_rows", "member_scalars"]


class MemberScalars(NamedTuple):
    """Per-member scalars of the append as Python floats, one list entry per member.

    Read from their tensors after the O(n²) solve, each would cost a torch call on a cold cache;
    they change only with a hyperparameter, the jitter or the standardization (a rebuild).

    Attributes:
        diag: k(x, x) + σ² + jitter (standardized units).
        outputscale: k(x, x).
        mean: the frozen output mean.
        scale: the frozen output scale.
    """

    diag: list[float]
    outputscale: list[float]
    mean: list[float]
    scale: list[float]


def member_scalars(
    outputscale: torch.Tensor,
    noise: torch.Tensor,
    jitter: torch.Tensor,
    y_mean: torch.Tensor,
    y_scale: torch.Tensor,
) -> MemberScalars:
    """The scalars of (b,) tensors: output scale, noise, jitter, output mean and scale."""
    return MemberScalars(
        *(t.tolist() for t in (outputscale + noise + jitter, outputscale, y_mean, y_scale))
    )


def append_rows(
    buffers: GPBuffers,
    z: torch.Tensor,
    y: Sequence[float] | None,
    learners: list[int],
    lengthscale: torch.Tensor,
    outputscale: torch.Tensor,
    kernel: KernelName,
    scalars: MemberScalars,
    moments: list[RunningMoments],
) -> tuple[list[float], list[int]]:
    """Append one row to each learner. `y=None` appends pending rows valued at the mean.

    Args:
        z: (b, d) unit-cube inputs.
        y: b raw outputs (only the learners' are read; each updates its member's moments),
            or None.
        learners: the members that append, each with room for one more row.
        lengthscale, outputscale: (b, d) and (b,), the kernel's hyperparameters.

    Returns:
        Per member, the surprise |ỹ − μ̃| / √(predictive variance) (NaN where not learned), and
        the learners whose pivot broke down: exact arithmetic guarantees pivot² ≥ noise +
        jitter, so one far below it carries no digit. Their rows are written all the same;
        the caller adds jitter and rebuilds them.
    """
    surprise = [math.nan] * len(buffers.rows)
    if not learners:
        return surprise, []
    rows = buffers.rows
    width = max(rows[j] for j in learners)
    k_row = kernel_row(buffers.z[:, :width], z, lengthscale, outputscale, kernel)
    # Each learner's new row l = L⁻¹k, with lᵀl and lᵀv (the prior mean), as Python floats:
    # the b per-member scalars that follow are cheaper in Python than as tiny tensor ops.
    products = append_rows_(buffers.factor, buffers.v, k_row, rows, learners)
    diag, prior_var, means, scales = scalars
    pivots, v_new, y_raw, breakdown = [], [], [], []
    for j, (quad_sq, prior_mean) in zip(learners, products, strict=True):
        pivot_sq = diag[j] - quad_sq
        if pivot_sq < 0.5 * (diag[j] - prior_var[j]):
            breakdown.append(j)
        pivot = math.sqrt(max(pivot_sq, 1e-300))
        if y is None:
            y_std = prior_mean
        else:
            y_std = (y[j] - means[j]) / scales[j]
            moments[j].update(y[j])
            surprise[j] = abs(y_std - prior_mean) / pivot
        pivots.append(pivot)
        v_new.append((y_std - prior_mean) / pivot)
        y_raw.append(means[j] + scales[j] * y_std)
    # The new scalars, stored in place: flat offsets of (j, n_j) in the (b, capacity) buffers.
    cap, dim = buffers.capacity, z.shape[-1]
    at = [j * cap + rows[j] for j in learners]
    z_values = z.tolist()
    set_entries_(
        (buffers.factor, [a * cap + rows[j] for a, j in zip(at, learners, strict=True)], pivots),
        (buffers.v, at, v_new),
        (buffers.y, at, y_raw),
        (
            buffers.z,
            [a * dim + i for a in at for i in range(dim)],
            [value for j in learners for value in z_values[j]],
        ),
    )
    for j in learners:
        rows[j] += 1
    buffers.version += 1
    return surprise, breakdown
