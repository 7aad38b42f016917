"""What a scalar node's GP sees of an array parent (issue 15): a fixed, linear feature map.

A field (an array node, paper 002) may be a parent of a scalar node. The child's GP then takes
k numbers of the field as inputs, in place of the one column a scalar parent gives:

- a field of at most `MAX_FIELD_FEATURES` (16) elements: the field itself, flattened (row-major)
  — every probe of a 16-probe kiln is an input;
- a larger field: block means (adaptive average pooling, blocks of ⌊·⌋/⌈·⌉ size):
  `[t]` → 16 contiguous blocks; `[h, w]` → a 4 × 4 grid of blocks; `[c, h, w]` → each channel
  kept (channels are different quantities, e.g. the Brusselator's u and v) on an s × s grid,
  s = ⌊√(16 / c)⌋ (1 × 1: the channel's mean, when c > 4); with c > 16 channels the flattened
  field in 16 contiguous blocks. At most 16 features, each clipped to the axis lengths.

Why this map: it is linear, so a Matheron sample path of the field passes through it exactly
(the child sees f_s(a) ↦ P f_s(a), differentiable in the actions); every feature is a mean of
elements, so it lies within the parent's `bounds` wherever the elements do, and the child's GP
scales it by those bounds as it scales a scalar parent; it is fixed by the shape alone, so a
row the child learned keeps its inputs for good (a data-driven map such as PCA would move them
at every refit); and it is readable (a feature is "the mean of channel 0 over the top-left
block"). What it loses: detail finer than a block of a large field — a child that depends on
one pixel of a 64 × 64 map should have that pixel reported as its own scalar node. 16 keeps the
child's GP at most 16 inputs wider per field parent: an ARD kernel's lengthscales still learn
from tens of rounds.
"""

from __future__ import annotations

import math

import torch

__all__ = ["MAX_FIELD_FEATURES", "FieldFeatures"]

MAX_FIELD_FEATURES = 16


def _blocks(length: int, count: int) -> list[tuple[int, int]]:
    """Adaptive pooling's [start, stop) blocks: `count` near-equal blocks of range(length)."""
    return [
        (math.floor(i * length / count), math.ceil((i + 1) * length / count)) for i in range(count)
    ]


def pooled_grid(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The number of blocks along each axis (the map of the module docstring); the identity
    map's grid is the shape itself."""
    size = math.prod(shape)
    if size <= MAX_FIELD_FEATURES:
        return tuple(shape)
    if len(shape) == 1:
        return (MAX_FIELD_FEATURES,)
    if len(shape) == 2:
        side = math.isqrt(MAX_FIELD_FEATURES)
        return (min(shape[0], side), min(shape[1], side))
    channels, height, width = shape
    if channels > MAX_FIELD_FEATURES:
        return ()  # the flattened field in contiguous blocks
    side = max(1, math.isqrt(MAX_FIELD_FEATURES // channels))
    return (channels, min(height, side), min(width, side))


class FieldFeatures:
    """The fixed feature map of an array parent: (..., *shape) -> (..., k).

    Args:
        shape: the array node's shape.
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = tuple(shape)
        size = math.prod(self.shape)
        grid = pooled_grid(self.shape)
        self.identity = grid == self.shape
        index = torch.arange(size).reshape(self.shape)
        if self.identity:
            rows = [[i] for i in range(size)]
        elif not grid:  # many channels: contiguous blocks of the flattened field
            rows = [list(range(a, b)) for a, b in _blocks(size, MAX_FIELD_FEATURES)]
        else:
            per_axis = [_blocks(n, k) for n, k in zip(self.shape, grid, strict=True)]
            rows = []
            for cell in _cells(per_axis):
                region = index[tuple(slice(a, b) for a, b in cell)]
                rows.append(region.reshape(-1).tolist())
        self.count = len(rows)
        matrix = torch.zeros(self.count, size, dtype=torch.float64)
        for k, members in enumerate(rows):
            matrix[k, members] = 1.0 / len(members)
        self.matrix = matrix  # (k, t): each row averages one block

    def __call__(self, field: torch.Tensor) -> torch.Tensor:
        """(..., *shape) -> (..., k); linear, differentiable."""
        lead = field.shape[: field.dim() - len(self.shape)]
        flat = field.reshape(*lead, -1)
        if self.identity:
            return flat
        return flat @ self.matrix.to(flat).T

    def describe(self) -> str:
        """One phrase for docs and logs: what the child sees."""
        if self.identity:
            return f"the field flattened ({self.count} inputs)"
        return f"{self.count} block means of the {list(self.shape)} field"


def _cells(per_axis: list[list[tuple[int, int]]]) -> list[tuple[tuple[int, int], ...]]:
    """Every combination of one block per axis, row-major."""
    cells: list[tuple[tuple[int, int], ...]] = [()]
    for blocks in per_axis:
        cells = [(*cell, block) for cell in cells for block in blocks]
    return cells
