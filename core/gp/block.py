"""The k-row append: each learner's factor grows by a block through its Schur complement.

Per member with n rows and k' new ones (unit-cube inputs Z_new, standardized outputs ỹ_new):

    B = L⁻¹ K(Z, Z_new)                      one solve with k' right-hand sides
    C = chol(K(Z_new, Z_new) + (σ² + jitter) I − BᵀB)
    L ← [[L, 0], [Bᵀ, C]],   v ← [v; C⁻¹(ỹ_new − Bᵀv)]

The diagonal of C holds the pivots k appends would compute and the new v entries their
surprises. The learners are batched, each padded to k rows with the identity (a padded row of B
is zero, its block of the Schur complement the identity), so the small k×k work costs the same
few tensor calls however many members learn; only the triangular solve and the copy of B into
the factor are per member.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from core.blas import set_entries_, solve_lower_rows_in_buffer_
from core.gp.append import MemberScalars
from core.gp.buffers import GPBuffers, row_mask, selector
from core.gp.moments import RunningMoments
from core.kernels import KernelName, kernel_row

__all__ = ["append_block", "one_thread"]


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the body with one intra-op thread (torch's setting is per calling thread).

    A block append is small tensor operations and a solve with a few right-hand sides, all
    memory-bound: a second thread gains nothing there, while its fork and join — and, on
    busy cores, the wait for it — cost several times the work (measured on 2 busy cores:
    6.0 s instead of 0.9 s for the learning of the 1000-round ingest profile). The sequential
    append never paid this: its tensors stay below torch's parallel grain and a solve with one
    right-hand side is not threaded.
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    # Not core.threads.this_thread_only: its two helper threads cost about 0.5 ms per call, on
    # the ingest path, per batch; a thread that starts using torch within this append's few
    # milliseconds would copy the one thread (the refits, seconds long, do use it).
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Block:
    """A block append between its algebra and its writes; lists are per learner l.

    Attributes:
        learners: the members that learn, in order.
        rows: each learner's n before the block.
        counts: each learner's k_l new rows.
        cross: (L, k, w) the rows of B = L⁻¹K (zero past n_l and past k_l).
        lower: (L, k, k) C, the factor of the Schur complement (identity past k_l).
        info: per learner, 0 where C was computed.
        y_raw, y_std: the new outputs, raw and standardized (k_l each; y_std padded to k).
        v_new: (L, k) the new entries of v.
        z_new: (L, k, d) the new unit-cube inputs.
        surprises: filled in by `_write_block`.
    """

    learners: list[int]
    rows: list[int]
    counts: list[int]
    cross: torch.Tensor
    lower: list[list[list[float]]]
    info: list[int]
    y_raw: list[list[float]]
    y_std: list[list[float]]
    v_new: list[list[float]]
    z_new: list[list[list[float]]]
    surprises: list[list[float]] = field(default_factory=list)


def append_block(
    buffers: GPBuffers,
    z: torch.Tensor,
    y: list[list[float]],
    chosen: list[list[int]],
    lengthscale: torch.Tensor,
    outputscale: torch.Tensor,
    kernel: KernelName,
    scalars: MemberScalars,
    moments: list[RunningMoments],
) -> tuple[list[list[float]], list[int]]:
    """Append member j's rows chosen[j] of `z` and `y`, in order, as one block per member.

    Args:
        z: (b, k, d) unit-cube inputs.
        y: b lists of k raw outputs (only the chosen entries are read).
        chosen: per member, the indices i of the rows it learns; each member has room for them.
        lengthscale, outputscale: (b, d) and (b,), the kernel's hyperparameters.

    Returns:
        Per member, the surprise of each of its rows (see `append_rows`), in row order, and the
        learners that broke down: their block is not numerically positive definite (its k×k
        Cholesky failed or a pivot² fell below the threshold of `append_rows`). Those are left
        untouched, their surprises empty, for the caller to append row by row.
    """
    surprises: list[list[float]] = [[] for _ in chosen]
    learners = [j for j, picked in enumerate(chosen) if picked]
    if not learners:
        return surprises, []
    picked = [chosen[j] for j in learners]
    block = _block_factor(
        buffers, z, y, learners, picked, lengthscale, outputscale, kernel, scalars
    )
    broken = _write_block(buffers, block, scalars, moments)
    for j, values in zip(learners, block.surprises, strict=True):
        surprises[j] = values
    buffers.version += 1
    return surprises, broken


def _block_factor(
    buffers: GPBuffers,
    z: torch.Tensor,
    y: list[list[float]],
    learners: list[int],
    chosen: list[list[int]],
    lengthscale: torch.Tensor,
    outputscale: torch.Tensor,
    kernel: KernelName,
    scalars: MemberScalars,
) -> _Block:
    """B, C and the new v entries of every learner (nothing is written to the buffers).

    Args:
        z: (b, k, d) unit-cube inputs; learner m's rows are chosen[m].
        y: b lists of k raw outputs.
    """
    device = buffers.factor.device
    opts = {"dtype": buffers.factor.dtype, "device": device}
    rows = [buffers.rows[j] for j in learners]
    counts = [len(picked) for picked in chosen]
    k, width = max(counts), max(rows)
    index = torch.tensor(learners, device=device)
    padded = [picked + picked[-1:] * (k - len(picked)) for picked in chosen]
    z_new = z[index.unsqueeze(-1), torch.tensor(padded, device=device)]  # (L, k, d)
    sel = selector(buffers, learners)
    ls, os = lengthscale[sel].unsqueeze(1), outputscale[sel].unsqueeze(1)
    # The append's own direct differences, so that each covariance is the one the
    # sequential appends compute: (L, k, w) against the stored rows, (L, k, k) each other.
    cross = kernel_row(buffers.z[sel, :width].unsqueeze(1), z_new, ls, os, kernel)
    inner = kernel_row(z_new.unsqueeze(1), z_new, ls, os, kernel)
    real = row_mask(counts, k, device)  # (L, k): which rows are real, not padding
    cross.mul_(real.unsqueeze(-1) & row_mask(rows, width, device).unsqueeze(-2))
    for m, j in enumerate(learners):  # B = L⁻¹K, one pass over each factor
        solve_lower_rows_in_buffer_(buffers.factor[j], rows[m], cross[m, : counts[m], : rows[m]])
    gram = cross @ cross.mT
    prior_mean = (cross @ buffers.v[sel, :width].unsqueeze(-1)).squeeze(-1)  # (L, k): Bᵀv
    diag = torch.tensor([scalars.diag[j] for j in learners], **opts)
    schur = (inner - gram).mul_(real.unsqueeze(-1) & real.unsqueeze(-2))
    pivot_sq = torch.where(real, diag.unsqueeze(-1) - gram.diagonal(dim1=-2, dim2=-1), 1.0)
    schur.diagonal(dim1=-2, dim2=-1).copy_(pivot_sq)  # k(x, x) + σ² + jitter − |b|²
    lower, info = torch.linalg.cholesky_ex(schur)
    means, scales = scalars.mean, scalars.scale
    y_std = [
        [(y[j][i] - means[j]) / scales[j] for i in picked] + [0.0] * (k - len(picked))
        for j, picked in zip(learners, chosen, strict=True)
    ]
    residual = torch.tensor(y_std, **opts) - prior_mean
    v_new = torch.linalg.solve_triangular(lower, residual.unsqueeze(-1), upper=False)
    return _Block(
        learners=learners,
        rows=rows,
        counts=counts,
        cross=cross,
        lower=lower.tolist(),
        info=info.tolist(),
        y_raw=[[y[j][i] for i in picked] for j, picked in zip(learners, chosen, strict=True)],
        y_std=y_std,
        v_new=v_new.squeeze(-1).tolist(),
        z_new=z_new.tolist(),
    )


def _write_block(
    buffers: GPBuffers, block: _Block, scalars: MemberScalars, moments: list[RunningMoments]
) -> list[int]:
    """Store each learner's block in the buffers; returns the learners that broke down.

    A learner breaks down when its k×k Cholesky fails or a pivot² falls below the
    threshold `append_rows` uses (exact arithmetic guarantees pivot² ≥ noise + jitter; far
    below it, no digit can be trusted); it is left untouched.
    """
    cap, dim = buffers.capacity, buffers.z.shape[-1]
    diag, prior_var, means, scales = scalars
    broken: list[int] = []
    factor_at, factor_values, at, v_values, y_values, z_at, z_values = ([] for _ in range(7))
    for m, j in enumerate(block.learners):
        n, count, lower = block.rows[m], block.counts[m], block.lower[m]
        if block.info[m] != 0 or not all(
            lower[i][i] * lower[i][i] >= 0.5 * (diag[j] - prior_var[j]) for i in range(count)
        ):
            broken.append(j)
            block.surprises.append([])
            continue
        buffers.factor[j, n : n + count, :n].copy_(block.cross[m, :count, :n])  # Bᵀ
        for i in range(count):  # C, then the row's scalars, as flat offsets
            row = (j * cap + n + i) * cap + n
            factor_at += range(row, row + i + 1)
            factor_values += lower[i][: i + 1]
            at.append(j * cap + n + i)
            y_std = block.y_std[m][i]
            v_values.append(block.v_new[m][i])
            y_values.append(means[j] + scales[j] * y_std)
            z_at += range((j * cap + n + i) * dim, (j * cap + n + i + 1) * dim)
            z_values += block.z_new[m][i]
            moments[j].update(block.y_raw[m][i])
        block.surprises.append([abs(value) for value in block.v_new[m][:count]])
        buffers.rows[j] += count
    set_entries_(
        (buffers.factor, factor_at, factor_values),
        (buffers.v, at, v_values),
        (buffers.y, at, y_values),
        (buffers.z, z_at, z_values),
    )
    return broken
