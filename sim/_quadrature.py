"""Deterministic quadrature rules for the oracles E[y | a] over low-dimensional noise.

Every rule returns `(nodes, weights)` as float64 numpy arrays whose weights sum to 1 (up to
rounding) for a probability measure, so an expectation is `weights @ f(nodes)`.
"""

from __future__ import annotations

import functools
import math

import numpy as np


@functools.cache
def _hermite_e(order: int) -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = np.polynomial.hermite_e.hermegauss(order)
    return nodes, weights / math.sqrt(2.0 * math.pi)


def standard_normal_rule(order: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Hermite rule for E[f(Z)], Z ~ N(0, 1) (probabilists' weight e^{-z²/2})."""
    nodes, weights = _hermite_e(order)
    return nodes.copy(), weights.copy()


@functools.cache
def _legendre(order: int) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(order)


def uniform_rule(low: float, high: float, order: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre rule for E[f(U)], U ~ Uniform(low, high)."""
    nodes, weights = _legendre(order)
    return low + (high - low) * (nodes + 1.0) / 2.0, weights / 2.0


def composite_legendre(edges: np.ndarray, order: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss–Legendre rule for the integral ∫ f(z) dz over panels between `edges`.

    The weights integrate (they sum to the length of the interval, not to 1); multiply by a
    density to get an expectation. Use narrow panels where f oscillates fast.
    """
    edges = np.sort(np.asarray(edges, dtype=np.float64))
    nodes, weights = _legendre(order)
    left, right = edges[:-1, None], edges[1:, None]
    half = (right - left) / 2.0
    return (left + half * (nodes + 1.0)).ravel(), (half * weights).ravel()
