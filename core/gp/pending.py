"""Pending points: inputs whose readings are not known yet, held as each member's trailing rows.

A pending row is valued at the posterior mean, so the variance around it shrinks and the mean
does not move. Every change to the observations takes the pending rows off first and puts them
back afterwards, at the new posterior (`detached`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from core.gp.buffers import GPBuffers, ensure_capacity, truncate

__all__ = ["PendingPoint", "detached", "find"]


@dataclass(eq=False)
class PendingPoint:
    """One pending input.

    Attributes:
        ident: its handle.
        z: (b, d) unit-cube input.
        members: the members it applies to.
    """

    ident: int
    z: torch.Tensor
    members: list[int]


def find(points: list[PendingPoint], handle: int) -> PendingPoint:
    """The point with this handle; KeyError naming the handle if there is none."""
    for point in points:
        if point.ident == handle:
            return point
    raise KeyError(f"no pending point with handle {handle}")


@contextmanager
def detached(
    buffers: GPBuffers,
    points: list[PendingPoint],
    append: Callable[[torch.Tensor, None, list[int]], object],
) -> Iterator[None]:
    """Remove the trailing pending rows, run the body, re-append them at the new posterior.

    Args:
        points: the pending points, read again after the body (which may remove some).
        append: `append(z, None, members)` appends one point's rows valued at the mean.
    """
    if not points:  # no pending rows: nothing to take off or put back
        yield
        return
    for member, real in enumerate(buffers.real):
        truncate(buffers, member, real)
    try:
        yield
    finally:
        ensure_capacity(buffers, max(buffers.rows) + len(points))
        with torch.no_grad():
            for point in points:
                append(point.z, None, point.members)
