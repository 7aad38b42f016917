"""Structure learning from finite-difference Hessians: edges of a function with known structure."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.structure import (
    cutoff,
    hessian_from_stencil,
    maximal_cliques,
    stencil,
    stencil_size,
    structure_from_hessian,
    structure_scores,
)

EDGES = {(0, 3), (3, 5), (0, 5), (1, 2), (6, 7)}  # a triangle, two pairs; 4 alone
D = 8


def _f(x: torch.Tensor) -> torch.Tensor:
    """Additive over the cliques {0,3,5}, {1,2}, {6,7}, {4}: known dependency graph EDGES."""
    return (
        (1 + x[..., 0]) * (1 + x[..., 3]) * (1 + x[..., 5])
        + 0.2 * torch.sin(3 * x[..., 0] * x[..., 3] + x[..., 5]) * torch.cos(2 * x[..., 5])
        + torch.exp(x[..., 1] * x[..., 2])
        + (x[..., 6] - x[..., 7]) ** 2
        + torch.sin(5 * x[..., 4])
        + x[..., 1] ** 3
    )


def test_stencil_has_base_singles_and_pairs():
    base = torch.full((4,), 0.2, dtype=torch.float64)
    points = stencil(base, 0.1)
    assert points.shape == (stencil_size(4), 4) == (11, 4)
    assert torch.equal(points[0], base)
    assert torch.allclose(points[1] - base, torch.tensor([0.1, 0, 0, 0], dtype=torch.float64))
    assert torch.allclose(points[5] - base, torch.tensor([0.1, 0.1, 0, 0], dtype=torch.float64))


def test_noiseless_mixed_differences_are_exactly_zero_off_the_graph_and_find_every_edge():
    g = torch.Generator().manual_seed(0)
    base = torch.rand(D, generator=g, dtype=torch.float64) * 0.7
    hessian = hessian_from_stencil(_f(stencil(base, 0.3)), D, 0.3)
    for a in range(D):
        for b in range(a + 1, D):
            if (a, b) not in EDGES:
                assert abs(float(hessian[a, b])) < 1e-9
    found = structure_from_hessian(hessian, 1e-6)
    assert set(found.edges) == EDGES
    assert found.groups == ((0, 3, 5), (1, 2), (4,), (6, 7))


def test_noisy_queries_summed_over_base_points_recover_the_edges_with_the_papers_cutoff():
    g = torch.Generator().manual_seed(1)
    noise, step, bases = 0.01, 0.3, 3
    total = torch.zeros(D, D, dtype=torch.float64)
    for _ in range(bases):
        base = torch.rand(D, generator=g, dtype=torch.float64) * (1 - step)
        points = stencil(base, step)
        y = _f(points) + noise * torch.randn(points.shape[0], generator=g, dtype=torch.float64)
        total += hessian_from_stencil(y, D, step)
    found = structure_from_hessian(total, cutoff(bases, noise, step, D))
    scores = structure_scores(EDGES, found.edges)
    assert scores["precision"] == 1.0
    assert scores["recall"] >= 0.8


def test_the_edge_cap_keeps_the_largest_entries():
    hessian = torch.zeros(4, 4, dtype=torch.float64)
    for (a, b), v in {(0, 1): 5.0, (1, 2): -9.0, (2, 3): 1.0}.items():
        hessian[a, b] = hessian[b, a] = v
    found = structure_from_hessian(hessian, 0.5, max_edges=2)
    assert found.edges == ((0, 1), (1, 2)) and found.dropped == 1
    assert found.groups == ((0, 1), (1, 2), (3,))


@settings(max_examples=50, deadline=None)
@given(st.sets(st.tuples(st.integers(0, 6), st.integers(0, 6)).filter(lambda e: e[0] < e[1])))
def test_cliques_cover_every_edge_and_coordinate(edges):
    groups = maximal_cliques(7, edges)
    assert {c for g in groups for c in g} == set(range(7))
    for a, b in edges:
        assert any(a in g and b in g for g in groups)
    for g in groups:  # every pair in a group is an edge
        for i, a in enumerate(g):
            for b in g[i + 1 :]:
                assert (a, b) in edges


def test_scores():
    assert structure_scores([(0, 1), (1, 2)], [(1, 0), (2, 3)]) == {
        "precision": 0.5,
        "recall": 0.5,
        "f1": 0.5,
    }
    assert math.isclose(structure_scores([(0, 1)], [])["f1"], 0.0)
