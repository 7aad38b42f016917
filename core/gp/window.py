"""The window: forget each member's oldest observations, one row by an exact O(n²) update."""

from __future__ import annotations

import torch

from core.blas import solve_lower_in_buffer_
from core.gp.buffers import GPBuffers, row_mask, selector, truncate

__all__ = ["apply_window", "forget_oldest"]

_FORGET_BLOCK = 2**17  # elements of the factor a window removal works on at once (1 MiB)


def apply_window(
    buffers: GPBuffers,
    window: int,
    rebuilding: set[int],
    y_mean: torch.Tensor,
    y_scale: torch.Tensor,
) -> tuple[list[int], list[int]]:
    """Forget each member's oldest observations beyond the window (no pending rows held).

    One row over — every learn_one once the window is full — is removed from the factor in
    O(n²) by `forget_oldest`; more (learn_many), or a member in `rebuilding` anyway, only
    shift the data and leave the factor to a rebuild. The caller recounts the running moments
    when any row was dropped.

    Args:
        y_mean, y_scale: (b,) the frozen standardization.

    Returns:
        The rows dropped per member and the members whose factor must be rebuilt.
    """
    dropped = [max(real - window, 0) for real in buffers.real]
    if not any(dropped):
        return dropped, []
    rebuild = [j for j, drop in enumerate(dropped) if drop > 1 or (drop and j in rebuilding)]
    for j in rebuild:
        n, drop = buffers.rows[j], dropped[j]
        buffers.z[j, : n - drop] = buffers.z[j, drop:n].clone()
        buffers.y[j, : n - drop] = buffers.y[j, drop:n].clone()
        buffers.real[j] -= drop
        truncate(buffers, j, n - drop)
    single = [j for j, drop in enumerate(dropped) if drop == 1 and j not in rebuilding]
    if single:
        rebuild += forget_oldest(buffers, single, y_mean, y_scale)
    return dropped, sorted(rebuild)


def forget_oldest(
    buffers: GPBuffers, members: list[int], y_mean: torch.Tensor, y_scale: torch.Tensor
) -> list[int]:
    """Remove each member's oldest observation, exactly and in O(n²); returns failures.

    With L = [[l₁₁, 0], [l₂₁, L₂₂]] the factor of K, the factor of K without its first row
    and column is chol(L₂₂L₂₂ᵀ + l₂₁l₂₁ᵀ) = L₂₂C with C = chol(I + ppᵀ), p = L₂₂⁻¹l₂₁ — a
    rank-one update, not a downdate: the pivots only grow, nothing cancels. C has a closed
    form (t₀ = 1, tₖ = tₖ₋₁ + pₖ²; Cₖₖ = √(tₖ/tₖ₋₁), Cᵢₖ = pᵢpₖ/√(tₖ₋₁tₖ) for i > k), so

        L' = L₂₂ diag(Cₖₖ) + S diag(wₖ),   wₖ = pₖ/√(tₖ₋₁tₖ),   Sᵢₖ = Σ_{j>k} (L₂₂)ᵢⱼ pⱼ,

    S being each row's total minus its running sum. L' is computed in blocks of rows that
    stay in cache, each written back one row up the moment it is done (the rows below, still
    to be read, are untouched), then v is solved afresh; members are batched.

    The members hold no pending rows; one narrower than the widest is padded with the
    identity, where p is 0 and the update changes nothing. A member whose update is not
    finite keeps its factor, loses its oldest row of data and is returned, to be rebuilt.

    Args:
        y_mean, y_scale: (b,) the frozen standardization.
    """
    factor = buffers.factor
    rows = [buffers.rows[j] for j in members]
    size = max(rows) - 1  # of the new factor (the widest member's)
    # Every member at once (the usual round) works on views of the buffers, no gathering.
    sel = selector(buffers, members)
    p = factor[sel, 1 : size + 1, 0].clone(memory_format=torch.contiguous_format)
    for k, j in enumerate(members):  # p = L₂₂⁻¹ l₂₁, the solve reading the buffer in place
        solve_lower_in_buffer_(factor[j, 1:, 1:], rows[k] - 1, p[k, : rows[k] - 1])
    t = torch.cumsum(p.square(), -1).add_(1.0)
    t_prev = torch.cat((torch.ones_like(t[:, :1]), t[:, :-1]), -1)
    finite = torch.isfinite(t[:, -1]).tolist()  # t is finite iff p is; then so is L'
    scale = t.div(t_prev).sqrt_().unsqueeze(-2)  # Cₖₖ ≥ 1
    weight = p.div((t_prev * t).sqrt_()).neg_().unsqueeze(-2)  # −wₖ
    p = p.unsqueeze(-2)
    failed = [j for j, ok in zip(members, finite, strict=True) if not ok]
    if failed:
        keep = torch.tensor([k for k, ok in enumerate(finite) if ok], device=factor.device)
        p, scale, weight = p[keep], scale[keep], weight[keep]
        sel = selector(buffers, [j for j in members if j not in failed])
    if len(failed) < len(members):
        block = max(16, _FORGET_BLOCK // (p.shape[0] * size))
        for start in range(0, size, block):
            stop = min(start + block, size)
            l22 = factor[sel, start + 1 : stop + 1, 1 : stop + 1]
            new = l22 * p[..., :stop]
            new.cumsum_(-1)  # running sums; each row's total ends in the last column
            new.sub_(new[..., -1:].clone()).mul_(weight[..., :stop])  # S diag(w)
            new.addcmul_(l22, scale[..., :stop])  # + L₂₂ diag(Cₖₖ)
            factor[sel, start:stop, :stop] = new
    _shift_up(buffers, members, rows, y_mean, y_scale)
    for k, j in enumerate(members):
        if j in failed:
            truncate(buffers, j, rows[k] - 1)
        else:  # v = L'⁻¹ ỹ, fresh: no error carried over from the old v
            solve_lower_in_buffer_(factor[j], rows[k] - 1, buffers.v[j, : rows[k] - 1])
            buffers.rows[j] -= 1
        buffers.real[j] -= 1
    buffers.version += 1
    return failed


def _shift_up(
    buffers: GPBuffers,
    members: list[int],
    rows: list[int],
    y_mean: torch.Tensor,
    y_scale: torch.Tensor,
) -> None:
    """Move the members' data up one row and set v to ỹ, for the solve that makes it L'⁻¹ỹ.

    The widest members' old last row becomes inert.
    """
    size = max(rows) - 1
    sel = selector(buffers, members)
    buffers.z[sel, :size] = buffers.z[sel, 1 : size + 1].clone()
    buffers.y[sel, :size] = buffers.y[sel, 1 : size + 1].clone()
    buffers.factor[sel, size, : size + 1] = 0.0
    buffers.factor[sel, size, size] = 1.0
    held = row_mask([n - 1 for n in rows], size, buffers.factor.device)
    y_std = (buffers.y[sel, :size] - y_mean[sel, None]) / y_scale[sel, None]
    buffers.v[sel, :size] = torch.where(held, y_std, 0.0)
    buffers.v[sel, size] = 0.0
