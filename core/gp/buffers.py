"""The identity-padded factor and data of a batch of GPs: allocate, grow, truncate, select.

Member j of b holds n_j rows. Its factor is `factor[j, :n_j, :n_j]`; the rows and columns past
n_j hold the identity, so one batched solve or Cholesky over max_j n_j rows is exact for every
member at once, and a member that learns nothing simply keeps its n_j.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "GPBuffers",
    "Spare",
    "allocate",
    "blank",
    "ensure_capacity",
    "grow",
    "memory_bytes",
    "next_capacity",
    "put_data",
    "row_mask",
    "selector",
    "truncate",
]

INITIAL_CAPACITY = 16
GROWTH = 1.5  # a full buffer grows to this multiple of its capacity (amortized O(1) copies)


@dataclass(eq=False)
class Spare:
    """Blank buffers (the identity and zeros) with room for `capacity` rows, made ahead of need
    (`blank`, in any thread) for `grow` to take instead of allocating its own: allocating and
    filling (b, c, c) is most of a growth's cost (page faults on fresh memory), and a grown
    buffer is needed in the middle of an append."""

    factor: torch.Tensor
    z: torch.Tensor
    y: torch.Tensor
    v: torch.Tensor
    capacity: int


@dataclass(eq=False)
class GPBuffers:
    """Preallocated buffers of b members with room for c rows each, dtype and device shared.

    Attributes:
        factor: (b, c, c) lower-triangular Cholesky factors of K + σ²I, identity past n_j.
        z: (b, c, d) unit-cube inputs.
        y: (b, c) outputs in output units (pending rows: the posterior mean).
        v: (b, c) L⁻¹ỹ, ỹ the standardized outputs; zero past n_j.
        rows: n_j, the rows of each member's factor: observations, then pending points.
        real: the observations of each member (its first rows).
        capacity: c.
        version: bumped by every change of the factor; keys what is derived from it.
        spare: blank buffers of a larger capacity made ahead of need, or None (`Spare`).
    """

    factor: torch.Tensor
    z: torch.Tensor
    y: torch.Tensor
    v: torch.Tensor
    rows: list[int]
    real: list[int]
    capacity: int
    version: int = 0
    spare: Spare | None = None


def allocate(batch: int, dim: int, *, dtype: torch.dtype, device: torch.device) -> GPBuffers:
    """Empty buffers (every row inert) with room for INITIAL_CAPACITY rows per member."""
    buffers = _blank(batch, dim, INITIAL_CAPACITY, dtype, device)
    return GPBuffers(*buffers, rows=[0] * batch, real=[0] * batch, capacity=INITIAL_CAPACITY)


def _blank(
    batch: int, dim: int, capacity: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(factor, z, y, v) with room for `capacity` rows: the identity and zeros."""
    opts = {"dtype": dtype, "device": device}
    factor = torch.eye(capacity, **opts).expand(batch, capacity, capacity).clone()
    z = torch.zeros(batch, capacity, dim, **opts)
    return factor, z, torch.zeros(batch, capacity, **opts), torch.zeros(batch, capacity, **opts)


def blank(buffers: GPBuffers, capacity: int) -> Spare:
    """Blank buffers shaped like `buffers`' with room for `capacity` rows: a `Spare` for
    `grow`. Reads only shapes, dtype and device, so another thread may call it while the
    owner appends."""
    batch, _, dim = buffers.z.shape
    factor, z, y, v = _blank(batch, dim, capacity, buffers.z.dtype, buffers.z.device)
    return Spare(factor, z, y, v, capacity)


def next_capacity(capacity: int, rows: int = 0) -> int:
    """The capacity a buffer of `capacity` grows to when it must hold `rows` rows."""
    return max(rows, math.ceil(capacity * GROWTH), INITIAL_CAPACITY)


def _take_spare(buffers: GPBuffers, capacity: int) -> Spare | None:
    """The spare, if it has room for `capacity` rows and fits `buffers` (taken: None after)."""
    spare, buffers.spare = buffers.spare, None
    if spare is None or spare.capacity < capacity:
        return None
    batch, _, dim = buffers.z.shape
    fits = (
        spare.z.shape[0] == batch
        and spare.z.shape[2] == dim
        and spare.z.dtype == buffers.z.dtype
        and spare.z.device == buffers.z.device
    )
    return spare if fits else None


def grow(buffers: GPBuffers, capacity: int) -> None:
    """Reallocate with room for `capacity` rows per member (or the spare's, if it has that
    room: then only the rows held are copied), keeping every row held."""
    batch, old, dim = buffers.z.shape
    spare = _take_spare(buffers, capacity)
    if spare is None:
        factor, z, y, v = _blank(batch, dim, capacity, buffers.z.dtype, buffers.z.device)
    else:
        factor, z, y, v, capacity = spare.factor, spare.z, spare.y, spare.v, spare.capacity
    factor[:, :old, :old] = buffers.factor
    z[:, :old], y[:, :old], v[:, :old] = buffers.z, buffers.y, buffers.v
    buffers.factor, buffers.z, buffers.y, buffers.v = factor, z, y, v
    buffers.capacity = capacity


def ensure_capacity(buffers: GPBuffers, rows: int) -> None:
    """Room for `rows` rows per member, growing by half at least (amortized O(1) reallocations)."""
    if rows > buffers.capacity:
        grow(buffers, next_capacity(buffers.capacity, rows))


def truncate(buffers: GPBuffers, member: int, rows: int) -> None:
    """Shrink a member to its first `rows` rows; the freed rows become inert again."""
    old = buffers.rows[member]
    if old <= rows:
        return
    freed = buffers.factor[member, rows:old]
    freed.zero_()
    freed[:, rows:old].fill_diagonal_(1.0)
    buffers.v[member, rows:old] = 0.0
    buffers.rows[member] = rows
    buffers.version += 1


def selector(buffers: GPBuffers, members: list[int]) -> slice | torch.Tensor:
    """Index of the listed members: a slice (views, no copies) when they are all."""
    if len(members) == len(buffers.rows):
        return slice(None)
    return torch.tensor(members, device=buffers.factor.device)


def row_mask(rows: Sequence[int], width: int, device: torch.device) -> torch.Tensor:
    """(b', width) bool: which of the first `width` rows each member really holds."""
    counts = torch.tensor(rows, device=device).unsqueeze(-1)
    return torch.arange(width, device=device) < counts


def memory_bytes(buffers: GPBuffers) -> int:
    """Bytes held by the factor and the data buffers (all members)."""
    tensors = (buffers.factor, buffers.z, buffers.y, buffers.v)
    return sum(t.element_size() * t.nelement() for t in tensors)


def put_data(buffers: GPBuffers, member: int, z: torch.Tensor, y: torch.Tensor) -> None:
    """Store observations after a member's last row, unfactored: a rebuild must follow.

    Args:
        z: (m, d) unit-cube inputs.
        y: (m,) outputs.
    """
    start, count = buffers.rows[member], y.shape[0]
    buffers.z[member, start : start + count] = z
    buffers.y[member, start : start + count] = y
    buffers.rows[member] += count
    buffers.real[member] += count
