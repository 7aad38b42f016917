"""Property tests: over random small specs and constraints, every proposal is admissible.

Admissible: values inside their bounds; hard — the keys form an allowed target set; soft — every
action present; at most `max_interventions` actions used; cost within the round cap and equal to
the spec's cost model. NothingAffordable exactly when no admissible intervention fits.
"""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.spec import parse_spec
from policies.base import Constraints, NothingAffordable, intervention_cost
from policies.registry import make_policy
from tests.test_policies_helpers import FAST, POLICIES, trained_model

_BOUNDS = [(-1.0, 1.0), (0.0, 1.0), (0.5, 1.5), (-2.0, -0.5), (0.0, 2.0)]


@st.composite
def specs(draw):
    intervention = draw(st.sampled_from(["soft", "hard"]))
    count = draw(st.integers(2, 3))
    names = [f"X{i}" for i in range(count - 1)] + ["Y"]
    nodes = [
        {
            "name": name,
            "parents": [names[i - 1]] if i else [],
            "bounds": [-3.0, 3.0],
            "noise_std": draw(st.sampled_from([0.0, 0.1])),
        }
        for i, name in enumerate(names)
    ]
    settable = names if intervention == "soft" else names[:-1]
    width = draw(st.integers(1, len(settable) if intervention == "hard" else 3))
    targets = (
        draw(st.permutations(settable))[:width]
        if intervention == "hard"
        else [draw(st.sampled_from(settable)) for _ in range(width)]
    )
    actions = [
        {
            "name": f"a{i}",
            "targets": [target],
            "bounds": list(draw(st.sampled_from(_BOUNDS))),
            "cost": draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
            "cost_per_unit": draw(st.sampled_from([0.0, 1.0, 3.0])),
        }
        for i, target in enumerate(targets)
    ]
    data = {
        "name": "random",
        "intervention": intervention,
        "nodes": nodes,
        "actions": actions,
        "reward": {"node": "Y"},
    }
    if intervention == "hard":
        subsets = [
            [a["name"] for i, a in enumerate(actions) if (mask >> i) & 1]
            for mask in range(2 ** len(actions))
        ]
        chosen = draw(st.lists(st.sampled_from(subsets), min_size=1, max_size=4, unique_by=tuple))
        data["target_sets"] = chosen
    return parse_spec(data)


constraints_strategy = st.builds(
    Constraints,
    max_interventions=st.sampled_from([None, 1, 2]),
    budget_per_round=st.sampled_from([None, 0.3, 1.0, 2.5, 5.0]),
    budget_remaining=st.sampled_from([None, 0.0, 0.7, 3.0]),
)


def _min_cost(action) -> float:
    low, high = action.bounds
    nearest = 0.0 if low <= 0.0 <= high else min(abs(low), abs(high))
    return action.cost + action.cost_per_unit * nearest


def _affordable(spec, constraints: Constraints) -> bool:
    """Brute force: does any admissible intervention fit?"""
    limit, cap = constraints.max_interventions, constraints.round_cap
    if spec.intervention == "hard":
        return any(
            (limit is None or len(s) <= limit)
            and sum(_min_cost(spec.action(a)) for a in s) <= cap + 1e-9
            for s in spec.allowed_target_sets()
        )
    mandatory = [a for a in spec.actions if not a.bounds[0] <= 0.0 <= a.bounds[1]]
    if limit is not None and len(mandatory) > limit:
        return False
    return sum(_min_cost(a) for a in mandatory) <= cap + 1e-9


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=specs(),
    constraints=constraints_strategy,
    name=st.sampled_from(POLICIES),
    seed=st.integers(0, 2**16),
)
def test_proposals_respect_every_constraint(spec, constraints, name, seed):
    model = trained_model(spec, 3, seed=seed)
    policy = make_policy(name, spec, FAST[name])
    rng = torch.Generator().manual_seed(seed)
    try:
        proposal = policy.propose(model, constraints, rng)
    except NothingAffordable:
        assert not _affordable(spec, constraints)
        return
    assert _affordable(spec, constraints)
    intervention = proposal.intervention
    for action, value in intervention.items():
        low, high = spec.action(action).bounds
        assert low <= value <= high and math.isfinite(value)
    if spec.intervention == "hard":
        assert sorted(intervention) in [sorted(s) for s in spec.allowed_target_sets()]
        used = len(intervention)
    else:
        assert list(intervention) == spec.action_names
        used = sum(v != 0.0 for v in intervention.values())
    if constraints.max_interventions is not None:
        assert used <= constraints.max_interventions
    cost = intervention_cost(spec, intervention)
    assert proposal.cost == cost
    assert cost <= constraints.round_cap * (1 + 1e-9) + 1e-12
