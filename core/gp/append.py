"""The O(n²) row append: each learner's factor grows by one row, read in place by BLAS.

Per member with n rows, appending x*, y* (unit-cube input, standardized output ỹ*):

    l = L⁻¹ k(Z, x*)                  the only O(n²) step, one triangular solve
    d = √(k(x*, x*) + σ² + jitter − lᵀl)
    L ← [[L, 0], [lᵀ, d]],   v ← [v; (ỹ* − lᵀv) / d]

lᵀv is the posterior mean at x* before the append and d² the predictive variance, so the
surprise of every reading costs nothing extra.

Two routes compute the same rows. On the CPU (float32/float64 with SciPy's BLAS) the solve is
`?trsv` reading each factor in place and the per-member scalars are Python floats
(`core.blas.append_rows_`): a torch call costs more than that arithmetic. Elsewhere (CUDA) every
step is a batched tensor operation on the buffers' device, with no host synchronization inside
(`append_rows_on_device`): one H2D copy of the call's scalars from pinned memory, one batched
`torch.linalg.solve_triangular` against the whole preallocated (b, c, c) buffer — exact because
rows and columns past n_j hold the identity, and read without a copy because the buffer is
contiguous, where a view of its n×n corner is not — and the writes as indexed stores. The model
then reads the surprises and breakdown flags back once per call, for all members together
(its refit schedule and rebuilds are decided on the host). Batching over experiments would go
one level up: the experiments of a replica stacked into one buffer (b = Σ nodes), one call per
tick; the buffers of different experiments are separate today.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import torch

from core.blas import append_rows_, blas_available, set_entries_
from core.gp.buffers import GPBuffers
from core.gp.moments import RunningMoments
from core.kernels import KernelName, kernel_row

__all__ = [
    "MemberScalars",
    "append_rows",
    "append_rows_on_device",
    "device_route",
    "member_scalars",
]

# Whether a CPU model may take the BLAS route; `device_route` turns it off so that the tests run
# the CUDA route's code on the CPU as well (the same tensor operations, on another device).
_HOST_ROUTE = [True]


@contextmanager
def device_route() -> Iterator[None]:
    """Within the body, CPU models append through `append_rows_on_device` (for tests)."""
    _HOST_ROUTE.append(False)
    try:
        yield
    finally:
        _HOST_ROUTE.pop()


def _host_route(buffers: GPBuffers) -> bool:
    """Whether the append runs on the host: CPU buffers and an in-place BLAS for their dtype."""
    factor = buffers.factor
    return _HOST_ROUTE[-1] and factor.device.type == "cpu" and blas_available(factor.dtype)


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
    if not _host_route(buffers):
        on_device = append_rows_on_device(
            buffers, z, y, learners, lengthscale, outputscale, kernel, scalars
        )
        # The one readback of the call, every member's at once: the refit schedule (misfits)
        # and the rebuild of a broken-down member are decided on the host.
        surprise, broken = torch.stack((on_device[0], on_device[1].to(z.dtype))).tolist()
        if y is not None:
            for j in learners:
                moments[j].update(y[j])
        for j in learners:
            rows[j] += 1
        buffers.version += 1
        return surprise, [j for j in learners if broken[j]]
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


def append_rows_on_device(
    buffers: GPBuffers,
    z: torch.Tensor,
    y: Sequence[float] | None,
    learners: list[int],
    lengthscale: torch.Tensor,
    outputscale: torch.Tensor,
    kernel: KernelName,
    scalars: MemberScalars,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`append_rows`' algebra and writes as batched tensor operations, with no host sync.

    Writes each learner's new row of the factor, v, y and z; leaves `rows`, `version` and the
    moments to the caller. A learner's writes happen even if its pivot broke down, as in
    `append_rows`. Every member's row is solved (a learner or not): one batched solve costs
    one launch whatever b is, and selecting the learners' factors would copy them.

    Args:
        z: (b, d) unit-cube inputs, on the buffers' device.
        y: b raw outputs (the learners' are read), or None for pending rows valued at the mean.
        learners: the members that append, each with room for one more row.
        lengthscale, outputscale: (b, d) and (b,).

    Returns:
        (b,) surprises (NaN where not learned or pending) and (b,) bool, whether a learner's
        pivot broke down — both on the buffers' device, not yet read.
    """
    factor = buffers.factor
    batch, capacity = factor.shape[0], buffers.capacity
    rows = buffers.rows
    learning = [0.0] * batch
    for j in learners:
        learning[j] = 1.0
    raw = [math.nan] * batch if y is None else [float(v) for v in y]
    diag, prior_var, means, scales = scalars
    # Everything the host knows, in one H2D copy: (7, b).
    host = _staged(
        [[float(n) for n in rows], learning, raw, diag, prior_var, means, scales], factor
    )
    n, learn, y_raw, diag_t, prior_t, mean_t, scale_t = host.unbind(0)
    n = n.to(torch.long)
    learn = learn > 0
    width = max(rows[j] for j in learners)
    columns = torch.arange(capacity, device=factor.device)
    held = columns[:width] < n.unsqueeze(-1)  # (b, width): the rows each member holds
    k_row = kernel_row(buffers.z[:, :width], z, lengthscale, outputscale, kernel)
    rhs = torch.zeros(batch, capacity, 1, dtype=factor.dtype, device=factor.device)
    rhs[:, :width, 0] = torch.where(held, k_row, 0.0)
    # Past n_j the factor is the identity and the right-hand side zero: l is exactly zero there.
    new_row = torch.linalg.solve_triangular(factor, rhs, upper=False).squeeze(-1)  # (b, c): l
    quad = torch.linalg.vecdot(new_row, new_row)
    prior_mean = torch.linalg.vecdot(new_row, buffers.v)  # v is zero past n_j
    pivot_sq = diag_t - quad
    broken = learn & (pivot_sq < 0.5 * (diag_t - prior_t))
    pivot = pivot_sq.clamp_min(1e-300).sqrt()
    if y is None:
        y_std = prior_mean
        surprise = torch.full_like(pivot, math.nan)
    else:
        y_std = (y_raw - mean_t) / scale_t
        surprise = torch.where(learn, (y_std - prior_mean).abs() / pivot, math.nan)
    at = n.clamp_max(capacity - 1)  # a member that does not learn may be full; it writes nothing
    new_row.add_((columns == at.unsqueeze(-1)) * pivot.unsqueeze(-1))  # [lᵀ, d, 0, ...]
    member = torch.arange(batch, device=factor.device)
    for buffer, value in (
        (factor, new_row),
        (buffers.v, (y_std - prior_mean) / pivot),
        (buffers.y, mean_t + scale_t * y_std),
        (buffers.z, z),
    ):
        keep = learn.reshape(-1, *([1] * (value.dim() - 1)))
        buffer[member, at] = torch.where(keep, value, buffer[member, at])
    return surprise, broken


def _staged(values: list[list[float]], like: torch.Tensor) -> torch.Tensor:
    """`values` as a tensor on `like`'s device and dtype; to CUDA from pinned memory, without
    a synchronization (a copy from pageable memory waits for the device)."""
    host = torch.tensor(values, dtype=like.dtype)
    if like.device.type == "cuda":
        return host.pin_memory().to(like.device, non_blocking=True)
    return host.to(like.device)
