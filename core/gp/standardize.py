"""The frozen output standardization: what the data ask for, drift from it, restandardizing.

Outputs are standardized with a mean and scale that stay fixed between rebuilds, so appends stay
exact; running moments of each member's outputs tell when the data have drifted away from them.
"""

from __future__ import annotations

import math

import torch

from core.gp.buffers import GPBuffers, row_mask
from core.gp.moments import RunningMoments

__all__ = ["drifted", "recount", "restandardize", "standardization"]


def recount(buffers: GPBuffers) -> list[RunningMoments]:
    """Each member's running moments recomputed from its stored observations (vectorized)."""
    width = max(max(buffers.real, default=0), 1)  # no members: a model of array nodes only
    y = buffers.y[:, :width]
    shift = y[:, 0]
    held = row_mask(buffers.real, width, y.device)
    delta = torch.where(held, y - shift.unsqueeze(-1), 0.0)
    totals = torch.stack((delta.sum(-1), delta.square().sum(-1))).tolist()
    return [
        RunningMoments(count, first if count else 0.0, total, total_sq)
        for count, first, total, total_sq in zip(buffers.real, shift.tolist(), *totals, strict=True)
    ]


def standardization(buffers: GPBuffers) -> tuple[torch.Tensor, torch.Tensor]:
    """(b,) mean and (b,) scale the data ask for (two-pass); scale 1 until two values exist."""
    width = max(max(buffers.real, default=0), 1)  # no members: a model of array nodes only
    y = buffers.y[:, :width]
    held = row_mask(buffers.real, width, y.device)
    count = held.sum(-1)
    mean = torch.where(held, y, 0.0).sum(-1) / count.clamp_min(1)
    var = torch.where(held, y - mean.unsqueeze(-1), 0.0).pow(2).sum(-1) / count.clamp_min(1)
    std = var.sqrt()
    scale = torch.where((count >= 2) & (std > 1e-12 * mean.abs().clamp_min(1.0)), std, 1.0)
    return torch.where(count >= 1, mean, 0.0), scale


def drifted(
    moments: list[RunningMoments], means: list[float], scales: list[float], tolerance: float
) -> list[int]:
    """Members whose data moved away from the frozen standardization (means, scales).

    Moved: the data mean lies more than `tolerance` scales from the frozen mean, or the data
    scale differs from the frozen one by more than a factor 1 + `tolerance`.
    """
    moved = []
    for j, (member, mean, scale) in enumerate(zip(moments, means, scales, strict=True)):
        if member.count == 0:
            continue
        spread = member.std
        enough = member.count >= 2 and spread > 1e-12 * max(abs(member.mean), 1.0)
        data_scale = spread if enough else 1.0
        shifted = abs(member.mean - mean) > tolerance * scale
        if shifted or abs(math.log(data_scale / scale)) > math.log1p(tolerance):
            moved.append(j)
    return moved


def restandardize(
    buffers: GPBuffers, members: list[int], y_mean: torch.Tensor, y_scale: torch.Tensor
) -> None:
    """Set the members' frozen (b,) `y_mean` and `y_scale` (in place) to what their data ask."""
    if not members:
        return
    mean, scale = standardization(buffers)
    y_mean[members] = mean[members]
    y_scale[members] = scale[members]
