"""The dependency graph of an additive function from Hessian estimates (paper 000, Alg. 4 phase 1).

An additive v(θ) = Σ_i v_i(θ^(i)) has ∂²v/∂θ_a∂θ_b = 0 unless a and b share a group
(Proposition 1), so the entries of summed Hessian estimates that exceed a cut-off c_h are the
edges of the dependency graph, and its maximal cliques are the groups of the additive kernel.

For a black box (the paper's future work) the Hessian is estimated from reward queries only, by
second-order finite differences on a stencil around a base point x in the unit cube:

    Ĥ_ab = [v(x + h e_a + h e_b) − v(x + h e_a) − v(x + h e_b) + v(x)] / h²,

1 + D + D(D−1)/2 queries per base point (the base and single steps are shared by all pairs).
A stencil may step down a coordinate instead (direction d_a = −1, for a base at the top of the
box; the estimate is then multiplied by d_a·d_b) and may query a subset of the pairs (under a
block limit a point may change only so many blocks): the entries of pairs not queried are 0.
For an additive v the numerator is exactly zero when no group holds both a and b — not only
to second order — so the test has no truncation error on non-edges; its noise is Gaussian with
standard deviation 2σ/h² per entry (σ the reward noise). Summing T0·C1 such estimates (T0 base
points, C1 repeats of each stencil) and thresholding at the paper's

    c_h = T0·C1 · σ_n · √(2 log(2D²/δ)),   σ_n = 2σ/h²,

keeps every non-edge out with probability ≥ 1 − δ (a union bound over the D² entries, the
paper's Theorem 1 with the sum taken over all queries).

For a differentiable policy π(θ; s) the paper uses a surrogate instead (its Sec. 4.5, Eq. 5–6):
H_π = ∂²π/∂θ_a∂θ_b, the Hessian of the policy's output, which is nonzero wherever H_v is (for a
generic reward). `surrogate_hessian` reduces it to one (D, D) query: the mean over the given
states of Σ_k |∂²π_k/∂θ_a∂θ_b| over the outputs k (absolute values, so that outputs and states
cannot cancel; the paper leaves the reduction open). It is exact — no observation noise — so an
entry that is zero is zero for every state: a structural zero of the policy's form.

The edge cap: the paper reports its additive GP tractable up to about 1,500 edges; beyond
`max_edges`, only the `max_edges` largest |Σ Ĥ_ab| are kept (the strongest interactions), and
the caller is told how many were dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import networkx as nx
import torch

__all__ = [
    "MAX_EDGES",
    "Pairs",
    "Structure",
    "all_pairs",
    "cutoff",
    "hessian_from_stencil",
    "maximal_cliques",
    "stencil",
    "stencil_size",
    "structure_from_hessian",
    "structure_scores",
    "surrogate_hessian",
]

MAX_EDGES = 1500  # the paper's tractability limit for the dependency graph


Pairs = tuple[torch.Tensor, torch.Tensor]  # (rows, cols) of the queried pairs, rows < cols


def all_pairs(dim: int) -> Pairs:
    """Every pair a < b, in row-major order."""
    rows, cols = torch.triu_indices(dim, dim, offset=1)
    return rows, cols


def stencil_size(dim: int, pairs: Pairs | None = None) -> int:
    """Queries of one finite-difference Hessian: 1 + D + (the pairs: D(D−1)/2 by default)."""
    count = dim * (dim - 1) // 2 if pairs is None else int(pairs[0].numel())
    return 1 + dim + count


def stencil(
    base: torch.Tensor,
    step: float,
    pairs: Pairs | None = None,
    directions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The points of one finite-difference Hessian around `base`.

    Args:
        base: (D,) unit-cube point with base + d_a·step within [0, 1] in every coordinate.
        step: h, in unit-cube units.
        pairs: the pairs queried (`all_pairs` by default).
        directions: (D,) +1 or −1, the way each coordinate steps (+1 by default).

    Returns:
        (1 + D + len(pairs), D): the base, then base + d_a h e_a for a = 0..D−1, then
        base + d_a h e_a + d_b h e_b for each pair (a, b), in the pairs' order.
    """
    dim = base.shape[-1]
    rows, cols = all_pairs(dim) if pairs is None else pairs
    steps = torch.full((dim,), step, dtype=base.dtype)
    if directions is not None:
        steps = steps * directions.to(base.dtype)
    eye = torch.diag(steps)
    return torch.cat([base.unsqueeze(0), base + eye, base + eye[rows] + eye[cols]])


def hessian_from_stencil(
    values: torch.Tensor,
    dim: int,
    step: float,
    pairs: Pairs | None = None,
    directions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mixed second differences from the stencil's values.

    Args:
        values: rewards at `stencil(base, step, pairs, directions)`'s points, in that order.

    Returns:
        (D, D) symmetric estimate of ∂²v/∂θ_a∂θ_b (unit-cube coordinates), zero on the diagonal
        and at the pairs not queried.
    """
    if values.shape[-1] != stencil_size(dim, pairs):
        raise ValueError(f"expected {stencil_size(dim, pairs)} values, got {values.shape[-1]}")
    rows, cols = all_pairs(dim) if pairs is None else pairs
    base, single, mixed_values = values[0], values[1 : dim + 1], values[dim + 1 :]
    mixed = (mixed_values - single[rows] - single[cols] + base) / step**2
    if directions is not None:  # stepping down a coordinate flips the difference's sign
        d = directions.to(values.dtype)
        mixed = mixed * d[rows] * d[cols]
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


def surrogate_hessian(
    policy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    theta: torch.Tensor,
    states: torch.Tensor,
) -> torch.Tensor:
    """One surrogate Hessian query (see the module docstring).

    Args:
        policy: (θ (D,), one state) -> the outputs (any shape), differentiable twice in θ.
        theta: (D,) where the Hessian is taken.
        states: (S, ...) the states it is averaged over (each passed to `policy` alone).

    Returns:
        (D, D): mean over the states of Σ_k |∂²π_k/∂θ_a∂θ_b|, zero on the diagonal.
    """
    from torch.func import hessian

    theta = theta.detach()
    total = torch.zeros(theta.shape[0], theta.shape[0], dtype=theta.dtype)
    for state in states:
        h = hessian(lambda th, s=state: policy(th, s).reshape(-1))(theta)  # (K, D, D)
        total += h.abs().sum(0)
    total /= max(len(states), 1)
    total.fill_diagonal_(0.0)
    return total
