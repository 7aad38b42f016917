"""Property tests: over random small specs and constraints, every proposal is admissible.

Every registered policy (`policies.registry`) is checked — D-GP-UCB on the specs with a
decomposed reward — in plain and cost-aware mode, on chain specs, decomposed-reward specs and
finite candidate sets, with actions whose bounds exclude 0 (they cannot be switched off).

Admissible: values finite and inside their bounds; hard — the keys form an allowed target set;
soft — every action present (a candidate, when the spec lists them); at most
`max_interventions` actions used; cost within the per-round cap and the remaining total budget,
and equal to the spec's cost model of exactly the returned intervention. NothingAffordable
exactly when no admissible intervention fits (a brute-force check).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.network import NetworkModel
from core.spec import ExperimentSpec, load_spec, parse_spec
from policies.base import Constraints, NothingAffordable, Proposal, intervention_cost
from policies.registry import make_policy, policy_classes, policy_names
from tests.test_policies_helpers import FAST, random_intervention, truth

_BOUNDS = [(-1.0, 1.0), (0.0, 1.0), (0.5, 1.5), (-2.0, -0.5), (0.0, 2.0)]
_TOL = 1e-9
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


# ---------------------------------------------------------------------- specs
def _actions(draw, targets: list[list[str]]) -> list[dict]:
    return [
        {
            "name": f"a{i}",
            "targets": target,
            "bounds": list(draw(st.sampled_from(_BOUNDS))),
            "cost": draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
            "cost_per_unit": draw(st.sampled_from([0.0, 1.0, 3.0])),
        }
        for i, target in enumerate(targets)
    ]


def _target_sets(draw, actions: list[dict]) -> list[list[str]]:
    subsets = [
        [a["name"] for i, a in enumerate(actions) if (mask >> i) & 1]
        for mask in range(2 ** len(actions))
    ]
    return draw(st.lists(st.sampled_from(subsets), min_size=1, max_size=4, unique_by=tuple))


def _candidates(draw, actions: list[dict]) -> list[list[float]]:
    """A few points inside the bounds; 0 (the action unused) where the bounds allow it."""

    def values(bounds):
        low, high = bounds
        choices = [low, (low + high) / 2, high] + ([0.0] if low <= 0.0 <= high else [])
        return st.sampled_from(choices)

    point = st.tuples(*(values(a["bounds"]) for a in actions)).map(list)
    return draw(st.lists(point, min_size=1, max_size=5))


@st.composite
def chain_specs(draw) -> ExperimentSpec:
    """X0 -> ... -> Y, soft actions on any node or hard actions setting the X's."""
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
    actions = _actions(draw, [[t] for t in targets])
    data = {
        "name": "random",
        "intervention": intervention,
        "nodes": nodes,
        "actions": actions,
        "reward": {"node": "Y"},
    }
    if intervention == "hard":
        data["target_sets"] = _target_sets(draw, actions)
    elif draw(st.booleans()):
        data["candidates"] = _candidates(draw, actions)
    return parse_spec(data)


@st.composite
def decomposed_specs(draw) -> ExperimentSpec:
    """y = g(f_0, ..., f_J−1) of root components (paper 003), linear or an expression."""
    intervention = draw(st.sampled_from(["soft", "hard"]))
    components = [f"f{j}" for j in range(draw(st.integers(2, 3)))]
    nodes = [
        {"name": c, "bounds": [-2.0, 2.0], "noise_std": draw(st.sampled_from([0.0, 0.1]))}
        for c in components
    ]
    nodes.append({"name": "y", "parents": components, "bounds": [-10.0, 10.0]})
    if intervention == "hard":
        width = draw(st.integers(1, len(components)))
        targets = [[c] for c in draw(st.permutations(components))[:width]]
    else:
        subsets = st.lists(st.sampled_from(components), min_size=1, max_size=3, unique=True)
        targets = draw(st.lists(subsets, min_size=1, max_size=3))
    actions = _actions(draw, targets)
    if draw(st.booleans()):
        weight = st.sampled_from([1.0, -0.5, 2.0, "1 + a0", "2 - a0 * a0"])
        reward = {"aggregation": "linear", "weights": [draw(weight) for _ in components]}
    else:
        reward = {"aggregation": "expression", "expression": " * ".join(components) + " + f0"}
    data = {
        "name": "decomposed",
        "intervention": intervention,
        "nodes": nodes,
        "actions": actions,
        "reward": {"node": "y", "components": components, **reward},
        "model": {"refit_every": None, "misfit_z": None},
    }
    if intervention == "hard":
        data["target_sets"] = _target_sets(draw, actions)
    elif draw(st.booleans()):
        data["candidates"] = _candidates(draw, actions)
    return parse_spec(data)


constraints_strategy = st.builds(
    Constraints,
    max_interventions=st.sampled_from([None, 1, 2]),
    budget_per_round=st.sampled_from([None, 0.3, 1.0, 2.5, 5.0]),
    budget_remaining=st.sampled_from([None, 0.0, 0.7, 3.0]),
)


def applicable(spec: ExperimentSpec) -> list[str]:
    """The registered policies that take this spec (D-GP-UCB: a decomposed reward, soft)."""
    decomposed = spec.reward.decomposed and spec.intervention == "soft"
    return [n for n in policy_names() if (n != "dgpucb" or decomposed) and _takes(n, spec)]


def _takes(name: str, spec: ExperimentSpec) -> bool:
    """Whether the policy accepts the spec (the multi-fidelity ones refuse a plain spec)."""
    try:
        make_policy(name, spec)
    except ValueError:
        return False
    return True


def trained(spec: ExperimentSpec, rounds: int, seed: int) -> NetworkModel:
    """A model that learned `rounds` random interventions of `truth` (a decomposed reward is
    composed from its components, as readings arrive in the agent)."""
    model = NetworkModel(spec)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        intervention = random_intervention(spec, generator)
        readings = truth(spec, intervention)
        if spec.reward.decomposed:
            del readings[spec.reward.node]
        model.learn(intervention, readings)
    return model


# ---------------------------------------------------------------------- the oracle
def _min_cost(action) -> float:
    low, high = action.bounds
    nearest = 0.0 if low <= 0.0 <= high else min(abs(low), abs(high))
    return action.cost + action.cost_per_unit * nearest


def _affordable(spec: ExperimentSpec, constraints: Constraints) -> bool:
    """Brute force: does any admissible intervention fit?"""
    limit, cap = constraints.max_interventions, constraints.round_cap
    if spec.intervention == "hard":
        return any(
            (limit is None or len(s) <= limit)
            and sum(_min_cost(spec.action(a)) for a in s) <= cap + _TOL
            for s in spec.allowed_target_sets()
        )
    if spec.candidates is not None:
        for point in spec.candidates:
            intervention = dict(zip(spec.action_names, point, strict=True))
            used = sum(v != 0.0 for v in point)
            if (limit is None or used <= limit) and intervention_cost(
                spec, intervention
            ) <= cap + _TOL:
                return True
        return False
    mandatory = [a for a in spec.actions if not a.bounds[0] <= 0.0 <= a.bounds[1]]
    if limit is not None and len(mandatory) > limit:
        return False
    return sum(_min_cost(a) for a in mandatory) <= cap + _TOL


def assert_admissible(spec: ExperimentSpec, constraints: Constraints, proposal: Proposal) -> None:
    intervention = proposal.intervention
    for action, value in intervention.items():
        low, high = spec.action(action).bounds
        assert math.isfinite(value) and low <= value <= high, (action, value)
    if spec.intervention == "hard":
        assert sorted(intervention) in [sorted(s) for s in spec.allowed_target_sets()]
        used = set(intervention)
    else:
        assert list(intervention) == spec.action_names
        used = {name for name, value in intervention.items() if value != 0.0}
        if spec.candidates is not None:
            assert [intervention[a] for a in spec.action_names] in spec.candidates
    assert set(proposal.target_set) == used
    if constraints.max_interventions is not None:
        assert len(used) <= constraints.max_interventions, intervention
    cost = intervention_cost(spec, intervention)
    assert proposal.cost == cost
    for cap in (constraints.budget_per_round, constraints.budget_remaining):
        if cap is not None:
            assert cost <= cap * (1 + 1e-12) + 1e-12, (cost, cap, intervention)


def check(policy, spec, constraints, model, rng) -> None:
    """One proposal: admissible, or NothingAffordable exactly when nothing fits."""
    try:
        proposal = policy.propose(model, constraints, rng)
    except NothingAffordable:
        assert not _affordable(spec, constraints)
        return
    assert _affordable(spec, constraints)
    assert_admissible(spec, constraints, proposal)


# ---------------------------------------------------------------------- the tests
@st.composite
def cases(draw):
    spec = draw(st.one_of(chain_specs(), decomposed_specs()))
    name = draw(st.sampled_from(applicable(spec)))
    settings_ = dict(FAST.get(name, {}))
    if "cost_aware" in policy_classes()[name].Settings.model_fields:
        settings_["cost_aware"] = draw(st.booleans())
    return spec, name, settings_


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=cases(),
    constraints=constraints_strategy,
    seed=st.integers(0, 2**16),
    rounds=st.sampled_from([0, 3]),  # 0: no data yet, the acquisition is flat
)
def test_proposals_respect_every_constraint(case, constraints, seed, rounds):
    spec, name, settings_ = case
    model = trained(spec, rounds, seed)
    policy = make_policy(name, spec, settings_)
    check(policy, spec, constraints, model, torch.Generator().manual_seed(seed))


def _mandatory_spec(intervention: str = "soft") -> ExperimentSpec:
    """a0 on [0.5, 1.5] cannot be switched off; a1, a2 can."""
    actions = [
        {"name": "a0", "targets": ["X0"], "bounds": [0.5, 1.5], "cost": 1.0, "cost_per_unit": 1.0},
        {"name": "a1", "targets": ["X1"], "bounds": [0.0, 1.0], "cost": 0.5},
        {"name": "a2", "targets": ["Y"], "bounds": [-1.0, 1.0], "cost_per_unit": 1.0},
    ]
    nodes = [
        {"name": n, "parents": [p] if p else [], "bounds": [-3.0, 3.0], "noise_std": 0.0}
        for n, p in (("X0", None), ("X1", "X0"), ("Y", "X1"))
    ]
    data = {"name": "m", "intervention": intervention, "nodes": nodes, "actions": actions}
    return parse_spec({**data, "reward": {"node": "Y"}})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.one_of(chain_specs(), decomposed_specs()),
    constraints=constraints_strategy,
    seed=st.integers(0, 2**16),
)
@example(spec=_mandatory_spec(), constraints=Constraints(max_interventions=1), seed=0)
@example(spec=_mandatory_spec(), constraints=Constraints(budget_per_round=1.6), seed=0)
def test_random_proposals_respect_every_constraint(spec, constraints, seed):
    """The random policy is the agent's explorer and fallback: many draws per spec."""
    policy = make_policy("random", spec, FAST["random"])
    model = NetworkModel(spec)  # random reads no posterior
    rng = torch.Generator().manual_seed(seed)
    for _ in range(20):
        check(policy, spec, constraints, model, rng)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_policy_proposes_on_every_example_before_any_data(path):
    """A model with no data is the prior everywhere: a flat acquisition with no gradient. Every
    policy still proposes an admissible intervention, without an exception (the agent would
    otherwise log the failure and fall back to the explorer)."""
    spec = load_spec(path)
    constraints = Constraints.from_spec(spec)
    for name in applicable(spec):
        policy = make_policy(name, spec, FAST[name])
        check(policy, spec, constraints, NetworkModel(spec), torch.Generator().manual_seed(0))


def test_eicbo_on_noiseless_decomposed_nodes_proposes_despite_nan_gradients():
    """Found by the property test above: EICBO on noiseless components (y = f0·f1 + f0, hard
    interventions, 3 rounds) gave NaN gradients to BoTorch's climb, which raised instead of
    proposing; the best scored start is the proposal then."""
    nodes = [
        {"name": "f0", "parents": [], "bounds": [-2.0, 2.0], "noise_std": 0.0},
        {"name": "f1", "parents": [], "bounds": [-2.0, 2.0], "noise_std": 0.0},
        {"name": "y", "parents": ["f0", "f1"], "bounds": [-10.0, 10.0]},
    ]
    actions = [
        {"name": "a0", "targets": ["f0"], "bounds": [-1.0, 1.0]},
        {"name": "a1", "targets": ["f1"], "bounds": [-1.0, 1.0]},
    ]
    reward = {"node": "y", "components": ["f0", "f1"], "aggregation": "expression"}
    spec = parse_spec(
        {
            "name": "decomposed",
            "intervention": "hard",
            "nodes": nodes,
            "actions": actions,
            "target_sets": [[], ["a0", "a1"]],
            "reward": {**reward, "expression": "f0 * f1 + f0"},
        }
    )
    settings_ = {**FAST["eicbo"], "cost_aware": False}
    constraints = Constraints(max_interventions=None, budget_per_round=None, budget_remaining=None)
    model = trained(spec, 3, 0)
    policy = make_policy("eicbo", spec, settings_)
    check(policy, spec, constraints, model, torch.Generator().manual_seed(0))
