"""The dependency graph of an additive function from Hessian estimates (paper 000, Alg. 4 phase 1).

An additive v(θ) = Σ_i v_i(θ^(i)) has ∂²v/∂θ_a∂θ_b = 0 unless a and b share a group
(Proposition 1), so the entries of summed Hessian estimates that exceed a cut-off c_h are the
edges of the dependency graph, and its maximal cliques are the groups of the additive kernel.

For a black box (the paper's future work) the Hessian is estimated from reward queries only, by
second-order finite differences on a stencil around a base point x in the unit cube:

    Ĥ_ab = [v(x + h e_a + h e_b) − v(x + h e_a) − v(x + h e_b) + v(x)] / h²,

1 + D + D(D−1)/2 queries per base point (the base and single steps are shared by all pairs).
For an additive v the numerator is exactly zero when no group holds both a and b — not only
to second order — so the test has no truncation error on non-edges; its noise is Gaussian with
standard deviation 2σ/h² per entry (σ the reward noise). Summing T0·C1 such estimates (T0 base
points, C1 repeats of each stencil) and thresholding at the paper's

    c_h = T0·C1 · σ_n · √(2 log(2D²/δ)),   σ_n = 2σ/h²,

keeps every non-edge out with probability ≥ 1 − δ (a union bound over the D² entries, the
paper's Theorem 1 with the sum taken over all queries).

The edge cap: the paper reports its additive GP tractable up to about 1,500 edges; beyond
`max_edges`, only the `max_edges` largest |Σ Ĥ_ab| are kept (the strongest interactions), and
the caller is told how many were dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import networkx as nx
import torch

__all__ = [
    "MAX_EDGES",
    "Structure",
    "cutoff",
    "hessian_from_stencil",
    "maximal_cliques",
    "stencil",
    "stencil_size",
    "structure_from_hessian",
    "structure_scores",
]

MAX_EDGES = 1500  # the paper's tractability limit for the dependency graph


def stencil_size(dim: int) -> int:
    """Queries of one finite-difference Hessian: 1 + D + D(D−1)/2."""
    return 1 + dim + dim * (dim - 1) // 2


def stencil(base: torch.Tensor, step: float) -> torch.Tensor:
    """The points of one finite-difference Hessian around `base`.

    Args:
        base: (D,) unit-cube point with base + step ≤ 1 in every coordinate.
        step: h, in unit-cube units.

    Returns:
        (1 + D + D(D−1)/2, D): the base, then base + h e_a for a = 0..D−1, then
        base + h e_a + h e_b for a < b in row-major order.
    """
    dim = base.shape[-1]
    eye = torch.eye(dim, dtype=base.dtype) * step
    rows, cols = torch.triu_indices(dim, dim, offset=1)
    pairs = base + eye[rows] + eye[cols]
    return torch.cat([base.unsqueeze(0), base + eye, pairs])


def hessian_from_stencil(values: torch.Tensor, dim: int, step: float) -> torch.Tensor:
    """Mixed second differences from the stencil's values.

    Args:
        values: (1 + D + D(D−1)/2,) rewards at `stencil(base, step)`'s points, in that order.

    Returns:
        (D, D) symmetric estimate of ∂²v/∂θ_a∂θ_b (unit-cube coordinates), zero diagonal.
    """
    if values.shape[-1] != stencil_size(dim):
        raise ValueError(f"expected {stencil_size(dim)} values, got {values.shape[-1]}")
    base, single, pairs = values[0], values[1 : dim + 1], values[dim + 1 :]
    rows, cols = torch.triu_indices(dim, dim, offset=1)
    mixed = (pairs - single[rows] - single[cols] + base) / step**2
    hessian = torch.zeros(dim, dim, dtype=values.dtype)
    hessian[rows, cols] = mixed
    hessian[cols, rows] = mixed
    return hessian


def cutoff(queries: int, noise_std: float, step: float, dim: int, delta: float = 0.05) -> float:
    """c_h for the sum of `queries` Hessian estimates (see the module docstring)."""
    sigma_n = 2.0 * noise_std / step**2
    return queries * sigma_n * math.sqrt(2.0 * math.log(2.0 * dim**2 / delta))


@dataclass(frozen=True)
class Structure:
    """A learned decomposition.

    Attributes:
        dim: D.
        edges: the kept edges (a, b), a < b.
        groups: the maximal cliques (isolated coordinates are singleton groups), sorted.
        dropped: edges above the cut-off left out by the cap.
    """

    dim: int
    edges: tuple[tuple[int, int], ...]
    groups: tuple[tuple[int, ...], ...]
    dropped: int = 0


def maximal_cliques(dim: int, edges: Iterable[tuple[int, int]]) -> tuple[tuple[int, ...], ...]:
    """The maximal cliques of the graph on 0..D−1 (`networkx.find_cliques`), sorted."""
    graph = nx.Graph()
    graph.add_nodes_from(range(dim))
    graph.add_edges_from(edges)
    return tuple(sorted(tuple(sorted(c)) for c in nx.find_cliques(graph)))


def structure_from_hessian(
    hessian_sum: torch.Tensor, threshold: float, *, max_edges: int = MAX_EDGES
) -> Structure:
    """Edges where |Σ Ĥ_ab| > threshold (at most `max_edges`, the largest), and their cliques.

    Args:
        hessian_sum: (D, D) summed Hessian estimates.
        threshold: c_h (≥ 0).
    """
    dim = hessian_sum.shape[-1]
    rows, cols = torch.triu_indices(dim, dim, offset=1)
    magnitude = hessian_sum[rows, cols].abs()
    above = torch.nonzero(magnitude > threshold).reshape(-1)
    dropped = max(int(above.numel()) - max_edges, 0)
    if dropped:
        above = above[magnitude[above].argsort(descending=True)[:max_edges]]
    edges = tuple(sorted((int(rows[k]), int(cols[k])) for k in above.tolist()))
    return Structure(dim, edges, maximal_cliques(dim, edges), dropped)


def structure_scores(
    true_edges: Iterable[Sequence[int]], found_edges: Iterable[Sequence[int]]
) -> dict[str, float]:
    """Precision, recall and F1 of found edges against the true ones (undirected).

    An empty true graph recovered empty scores 1.0 everywhere.
    """
    truth = {tuple(sorted(e)) for e in true_edges}
    found = {tuple(sorted(e)) for e in found_edges}
    hits = len(truth & found)
    precision = hits / len(found) if found else (1.0 if not truth else 0.0)
    recall = hits / len(truth) if truth else 1.0
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return {"precision": precision, "recall": recall, "f1": f1}
