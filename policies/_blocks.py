"""A parameter vector's cardinality: at most k of its blocks changed from its default per round.

The units are `ParametersSpec.units` (the spec's blocks, and every coordinate outside them as a
block of its own). A proposal keeps the limit by choosing ≤ k units and setting every other
coordinate to its default (`ParametersSpec.reference`): the random policy chooses them
uniformly, `addgpucb`, `hagpucb` (phase 2) and `gpucb` greedily by their acquisition
(`greedy_units`), `cmaes` by distance (`nearest_units`: each candidate is projected onto the
admissible set).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from core.spec import ExperimentSpec

__all__ = ["greedy_units", "keep_units", "nearest_units", "random_units"]


def keep_units(spec: ExperimentSpec, values: Sequence[float], keep: Sequence[str]) -> list[float]:
    """θ (`values`, in coordinate order) with every unit outside `keep` back at the default."""
    params = spec.parameters
    assert params is not None
    out = list(params.reference)
    units = params.units
    for unit in keep:
        start, stop = units[unit]
        out[start:stop] = values[start:stop]
    return out


def random_units(spec: ExperimentSpec, limit: int, rng: torch.Generator) -> list[str]:
    """`limit` units drawn uniformly without replacement (all of them when fewer)."""
    assert spec.parameters is not None
    names = list(spec.parameters.units)
    order = torch.randperm(len(names), generator=rng)[:limit].tolist()
    return [names[i] for i in sorted(order)]


def nearest_units(spec: ExperimentSpec, values: Sequence[float], limit: int) -> list[str]:
    """The `limit` units whose change from the default is largest, as the sum over their
    coordinates of (change / the coordinate's span)²: keeping them and setting every other unit
    back to the default is the Euclidean projection (in the unit cube of the bounds) of `values`
    onto the θ that change at most `limit` units. Units that do not change are never chosen."""
    params = spec.parameters
    assert params is not None
    reference = params.reference
    change: dict[str, float] = {}
    for unit, (start, stop) in params.units.items():
        total = 0.0
        for i in range(start, stop):
            low, high = params.coordinate_bound(i)
            total += ((float(values[i]) - reference[i]) / (high - low)) ** 2
        if total > 0.0:
            change[unit] = total
    ranked = sorted(change, key=lambda unit: -change[unit])[:limit]
    order = list(params.units)
    return sorted(ranked, key=order.index)


def greedy_units(
    spec: ExperimentSpec,
    values: Sequence[float],
    limit: int,
    score: Callable[[list[list[float]]], list[float]],
) -> list[str]:
    """Up to `limit` units chosen greedily: starting from the default, each step moves the unit
    whose `values` raise `score` most; it stops early when no unit raises it.

    Args:
        values: the unconstrained target θ, in coordinate order.
        score: a batch of θ (coordinate order) -> their acquisition values.
    """
    params = spec.parameters
    assert params is not None
    reference = params.reference
    units = [
        unit
        for unit, (start, stop) in params.units.items()
        if any(values[i] != reference[i] for i in range(start, stop))
    ]
    chosen: list[str] = []
    current = score([keep_units(spec, values, chosen)])[0]
    while len(chosen) < limit and units:
        trials = [keep_units(spec, values, [*chosen, u]) for u in units]
        scores = score(trials)
        best = max(range(len(units)), key=scores.__getitem__)
        if scores[best] <= current:
            break
        current = scores[best]
        chosen.append(units.pop(best))
    return chosen
