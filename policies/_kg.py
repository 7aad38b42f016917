"""The exact knowledge gradient over a finite set of alternatives (Frazier, Powell & Dayanik
2009, Algorithms 1–2), batched over candidate measurements.

For beliefs a (p,) about p alternatives and a measurement that moves them to a + b·Z,
Z ~ N(0, 1), the knowledge gradient is

    ν(a, b) = E[max_i (a_i + b_i Z)] − max_i a_i.

The maximum of p lines in Z is piecewise linear: sort the lines by slope b (ties: keep the one
with the larger intercept), keep the upper envelope — line k enters at the breakpoint c_k where
it crosses its predecessor — then

    ν = Σ_k (b_{k+1} − b_k) · f(−|c_{k+1}|),   f(z) = z Φ(z) + φ(z).

The envelope is a stack algorithm; here every candidate (a column of b) runs it at once: one
pass over the p lines, popping in every column that needs it until none does.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr

__all__ = ["discrete_kg"]

_INV_SQRT_2PI = 1.0 / np.sqrt(2.0 * np.pi)


def _f(z: np.ndarray) -> np.ndarray:
    """z Φ(z) + φ(z), clamped at 0 (it is positive; rounding makes it slightly negative far
    in the left tail)."""
    return np.maximum(z * ndtr(z) + _INV_SQRT_2PI * np.exp(-0.5 * z * z), 0.0)


def discrete_kg(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Knowledge gradient of each candidate measurement.

    Args:
        a: (p,) posterior means of the alternatives.
        b: (p, m) how a unit of Z moves each alternative's mean, per candidate.

    Returns:
        (m,) ν ≥ 0 per candidate.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    p, m = b.shape
    intercepts = np.broadcast_to(a[:, None], (p, m))
    order = np.lexsort((intercepts, b), axis=0)  # by slope, then intercept
    slope = np.take_along_axis(b, order, axis=0)
    level = np.take_along_axis(intercepts, order, axis=0)
    keep = np.ones((p, m), dtype=bool)
    keep[:-1] = slope[:-1] != slope[1:]  # of equal slopes only the last (highest) line counts

    columns = np.arange(m)
    stack = np.zeros((m, p), dtype=np.int64)  # line indices of the envelope, per column
    enters = np.full((m, p), -np.inf)  # where each stacked line takes over
    top = np.zeros(m, dtype=np.int64)
    for i in range(p):
        live = keep[i]
        while True:
            below = np.maximum(top - 1, 0)
            j = stack[columns, below]
            with np.errstate(divide="ignore", invalid="ignore"):
                cross = (level[j, columns] - level[i]) / (slope[i] - slope[j, columns])
            pop = live & (top > 1) & (cross <= enters[columns, below])
            if not pop.any():
                break
            top = top - pop
        chosen = columns[live]
        at = top[live]
        stack[chosen, at] = i
        enters[chosen, at] = np.where(at > 0, cross[live], -np.inf)
        top = top + live

    slopes = slope[stack, columns[:, None]]  # (m, p)
    steps = slopes[:, 1:] - slopes[:, :-1]
    inside = np.arange(1, p)[None, :] < top[:, None]
    with np.errstate(invalid="ignore"):
        terms = np.where(inside, steps * _f(-np.abs(enters[:, 1:])), 0.0)
    return terms.sum(axis=1) if p > 1 else np.zeros(m)
