"""hagpucb's lazy phase-1 plan (`policies._stencil_plan`) against the eager plan it replaced.

The reference below is the code hagpucb ran before (commit 38a0ebc): every stencil point built
in the constructor, each keyed by its coordinates rounded to 9 decimals, the history's records
looked up by key. The lazy plan must give the same points bit for bit, the same proposals in
the same order (an expired round and an off-plan record included) and the same structure.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from core.network import NetworkModel
from core.spec import load_spec, parse_spec
from core.structure import all_pairs, hessian_from_stencil, stencil, structure_from_hessian
from policies._stencil_plan import StencilPlan, key
from policies.base import Constraints
from policies.registry import make_policy

D = 6
BLOCKS = {"a": [0, 2], "b": [2, 4], "c": [4, 6]}
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _spec(limit: int | None, settings: dict) -> object:
    return parse_spec(
        {
            "name": "plan",
            "intervention": "soft",
            "nodes": [{"name": "R", "bounds": [-30, 30], "noise_std": 0.01}],
            "parameters": {
                "name": "theta",
                "dimension": D,
                "bounds": [-1.0, 2.0],
                "targets": ["R"],
                "blocks": BLOCKS,
                "default": 1.9,  # near the top: the stencil steps down (directions −1)
            },
            "reward": {"node": "R"},
            "model": {"refit_every": None, "misfit_z": None},  # the plans are under test
            **({"constraints": {"max_interventions": limit}} if limit else {}),
            "policy": {"name": "hagpucb", "settings": settings},
            "initial_design": {"rounds": 0, "seed": 7},
        }
    )


def _old_points(policy) -> torch.Tensor:
    """The eager plan, as `HAGPUCBPolicy._phase_one_points` built it at 38a0ebc."""
    s, spec = policy.settings, policy.spec
    g = torch.Generator().manual_seed(spec.initial_design.seed)
    lower, span = policy.bounds[:, 0], policy.bounds[:, 1] - policy.bounds[:, 0]
    limit = spec.constraints.max_interventions
    if limit is not None:
        reference = torch.tensor(spec.parameters.reference, dtype=torch.float64)
        base = (reference - lower) / span
        directions = torch.where(base + s.step <= 1.0, 1.0, -1.0).to(torch.float64)
        steps = torch.diag(directions * s.step * span)
        rows, cols = policy._admissible_pairs(limit)
        points = torch.cat(
            [reference.unsqueeze(0), reference + steps, reference + steps[rows] + steps[cols]]
        )
        return torch.cat([points] * (s.t0 * s.c1))
    blocks = []
    for _ in range(s.t0):
        base = torch.rand(policy.dim, generator=g, dtype=torch.float64) * (1.0 - s.step)
        blocks += [lower + stencil(base, s.step) * span] * s.c1
    return torch.cat(blocks)


def _old_choice(points: torch.Tensor, spec, model: NetworkModel) -> tuple[int | None, int, list]:
    """The eager lookup: (pick or None when every point has a reward, points left, rewards)."""
    keys = [key(p) for p in points.tolist()]
    seen: dict[tuple, list[float]] = {}
    played = set()
    for record in model.history:
        k = key(record.intervention.get(n, 0.0) for n in spec.action_names)
        played.add(k)
        if "R" in record.readings:
            seen.setdefault(k, []).append(float(record.readings["R"]))
    rewards = [sum(seen[k]) / len(seen[k]) if k in seen else None for k in keys]
    missing = [i for i, r in enumerate(rewards) if r is None]
    if not missing:
        return None, 0, rewards
    unplayed = [i for i in missing if keys[i] not in played]
    return (unplayed or missing)[0], len(missing), rewards


def _reward(theta: torch.Tensor) -> float:
    """Edges (0, 1) and (2, 5); deterministic, so both plans see the same readings."""
    x = theta
    return float(x[0] * x[1] + torch.sin(x[2] * x[5]) - (x[3] - 0.2) ** 2 + 0.5 * x[4])


@pytest.mark.parametrize(
    ("limit", "settings"),
    [(None, {"t0": 2, "c1": 2}), (1, {"t0": 2, "c1": 1}), (2, {"t0": 1, "c1": 2})],
    ids=["free-t0=2-c1=2", "k=1", "k=2"],
)
def test_lazy_plan_plays_the_eager_plans_points_and_learns_its_structure(limit, settings):
    spec = _spec(limit, {**settings, "candidates": 8, "sweeps": 1, "polish": 0})
    policy = make_policy("hagpucb", spec, spec.policy.settings)
    points = _old_points(policy)
    plan = policy._plan
    assert policy.phase_one_rounds == len(plan) == points.shape[0]
    assert all(torch.equal(plan.point(k), points[k]) for k in range(len(plan)))

    model, rng = NetworkModel(spec), torch.Generator().manual_seed(0)
    off_plan = {n: 0.123 for n in spec.action_names}  # a record that is no stencil point
    model.learn(off_plan, {"R": 1.0})
    for step in range(points.shape[0] + 4):
        want, left, rewards = _old_choice(points, spec, model)
        if want is None:  # the eager plan would learn now: so would the lazy one
            break
        proposal = policy.propose(model, Constraints.from_spec(spec), rng)
        assert proposal.diagnostics["phase"] == 1
        assert proposal.diagnostics["query"] == want and proposal.diagnostics["left"] == left
        assert list(proposal.intervention.values()) == points[want].tolist()
        if step == 3:  # played, but the reading never came: asked again at the end
            model.start_round(proposal.intervention)
        else:
            theta = torch.tensor(list(proposal.intervention.values()))
            model.learn(proposal.intervention, {"R": _reward(theta)})
    assert want is None
    progress, _ = policy._phase_one_progress(model)
    assert len(progress) == plan.bases * plan.size  # every point has its reward
    policy._learn_structure(progress)  # what propose does next, before phase 2's acquisition

    q = plan.size
    values = torch.tensor(rewards, dtype=torch.float64).reshape(-1, q)
    total = sum(
        hessian_from_stencil(v, D, policy.settings.step, policy._pairs, policy._directions)
        for v in values
    )
    old = structure_from_hessian(
        total, policy._threshold(total, len(values)), max_edges=policy.settings.max_edges
    )
    assert policy.structure == old
    assert (0, 1) in old.edges  # the comparison is not between two empty structures


def test_match_finds_every_point_with_the_key_when_a_step_is_below_the_rounding():
    """Coordinate 2 steps by 1e-12: its stepped and unstepped keys are equal, so several points
    share a key; `match` returns exactly the entries the key-by-key lookup would."""
    g = torch.Generator().manual_seed(3)
    low = torch.rand(2, 5, generator=g, dtype=torch.float64)
    high = low + 0.25
    high[:, 2] = low[:, 2] + 1e-12
    rows, cols = all_pairs(5)
    keep = torch.arange(rows.numel()) % 3 != 1  # a subset of the pairs, as under a block limit
    plan = StencilPlan(low, high, 2, (rows[keep], cols[keep]))
    keys = [key(plan.point(k).tolist()) for k in range(len(plan))]
    probes = [*sorted(set(keys)), key([0.5] * 5)]
    for probe in probes:
        want = {plan.entry(k) for k in range(len(plan)) if keys[k] == probe}
        assert set(plan.match(probe)) == want
    assert any(len(plan.match(p)) > 1 for p in probes)


@pytest.mark.parametrize("name", ["mpe-tag-hom", "mpe-tag-het-hom", "mpe-tag-hom-no-ra"])
def test_hagpucb_is_ready_to_propose_within_seconds_on_the_hom_specs(name):
    """414 coordinates, 85,491 pairs: the constructor and the first proposal used to take
    47-70 s (the eager plan); the bound is loose for a loaded 2-core machine."""
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    make_policy("random", spec)  # the policies' modules imported before the clock
    started = time.perf_counter()
    policy = make_policy("hagpucb", spec, {"candidates": 32, "sweeps": 1})
    proposal = policy.propose(
        NetworkModel(spec), Constraints.from_spec(spec), torch.Generator().manual_seed(0)
    )
    elapsed = time.perf_counter() - started
    assert proposal.diagnostics["phase"] == 1 and proposal.diagnostics["query"] == 0
    assert policy.phase_one_rounds == 1 + spec.parameters.dimension + len(policy._pairs[0])
    assert elapsed < 5.0, f"{elapsed:.1f} s"
