"""Issue 19: MCBO on ToyGraph must look inside X1's do-domain, not settle on its bound.

With X1 scaled by its sampled range [−15, 160], Y's GP was a smooth trend across the do-domain
[−5, 20] and MCBO proposed do(X1 = −5) (E[Y] ≈ 1.0) in every round of this very run (seed 2 of
`cbo-agent bench regret`, the same seed streams as the benchmark). Scaled by the do-domain, it
proposes do(X1 ≈ 3.1) (E[Y] ≈ 1.85) in its first rounds. The loop stops at the first such
proposal, so the test is short when it passes; `max_seconds` is raised so that the time cap
rarely cuts a proposal short on a loaded machine.
"""

from __future__ import annotations

import pytest
import torch

from agent.paths import example_spec
from bench.harness.episode import _initial_design, _StatesHandOver, seed_streams
from core.network import NetworkModel
from core.spec import load_spec
from policies._optimize import Deadline
from policies.base import Constraints
from policies.registry import make_policy
from sim.registry import make_environment

SEED = 2
ROUNDS = 20


def test_mcbo_proposes_inside_the_do_domain_of_x1():
    noise_seed, policy_seed, global_seed, design_seed = seed_streams(SEED)
    torch.manual_seed(global_seed)
    noise = torch.Generator().manual_seed(noise_seed)
    rng = torch.Generator().manual_seed(policy_seed)
    env = make_environment("toygraph", SEED)
    spec = load_spec(example_spec("toygraph"))
    model = NetworkModel(spec)
    policy = make_policy("mcbo", spec, {**spec.policy.settings, "max_seconds": 120.0})
    design = torch.Generator().manual_seed(design_seed)
    payload: dict = {"initial_design": [], "history": []}
    states = _StatesHandOver(env, policy)  # mcbo takes no states: records nothing
    try:
        _initial_design(env, spec, model, SEED, noise, design, payload, states)
    finally:
        states.close()
    proposed = []
    for _ in range(ROUNDS):
        proposal = policy.propose(model, Constraints.from_spec(spec), rng)
        value = proposal.intervention.get("do_X1")
        proposed.append(value)
        if value is not None and -4.0 < value < 19.0:  # inside, a unit away from either bound
            return
        model.learn(proposal.intervention, env.step(proposal.intervention, noise))
    raise AssertionError(f"no do(X1) inside (-4, 19) in {ROUNDS} rounds: {proposed}")


# ---------------------------------------------------------------- the +π trap (issue 19, part 2)
TRAP_SEED = 1  # seed 1 of the benchmark's streams: with β = 0.5 its optimism misses the optimum
TRAP_ROUNDS = 10  # rounds at the +π mode, as MCBO played them once it had found it
OPTIMUM, MODE = -3.2, 3.1  # do(X1): E[Y] ≈ 2.17 (the optimum) and ≈ 1.86 (the +π mode)


def _trapped_model(seed: int) -> tuple[NetworkModel, object]:
    """The paper's design, then TRAP_ROUNDS readings at do(X1) ∈ {2.9, 3.1, 3.3} (the +π mode)."""
    noise_seed, _, global_seed, design_seed = seed_streams(seed)
    torch.manual_seed(global_seed)
    noise = torch.Generator().manual_seed(noise_seed)
    env = make_environment("toygraph", seed)
    spec = load_spec(example_spec("toygraph"))
    model = NetworkModel(spec)
    design = torch.Generator().manual_seed(design_seed)
    states = _StatesHandOver(env, make_policy("mcbo", spec, spec.policy.settings))
    try:
        payload = {"initial_design": [], "history": []}
        _initial_design(env, spec, model, seed, noise, design, payload, states)
    finally:
        states.close()
    for k in range(TRAP_ROUNDS):
        intervention = {"do_X1": MODE + 0.2 * (k % 3 - 1)}
        model.learn(intervention, env.step(intervention, noise))
    return model, spec


def _optimism_at_optimum_and_mode(settings: dict) -> tuple[float, float, float, object]:
    """MCBO's optimistic value at do(X1 = −3.2) and at the +π mode, the truth at −3.2, and the
    acquisition problem, for the trapped model of TRAP_SEED under `settings`."""
    model, spec = _trapped_model(TRAP_SEED)
    policy = make_policy("mcbo", spec, settings)
    problem = policy.problem(model, 0, Deadline(60.0))
    actions = torch.stack([model.action_vector({"do_X1": x}) for x in (OPTIMUM, MODE)])
    eta = actions.new_zeros(2, len(problem.eta_nodes(("do_X1",))))  # X0's η: X1 is set
    optimum, mode = problem.optimistic_reward(actions, eta, ("do_X1",), problem.beta).tolist()
    truth = make_environment("toygraph", TRAP_SEED).expected_reward({"do_X1": OPTIMUM})
    return optimum, mode, truth, (model, problem)


def test_with_a_fixed_beta_alone_the_optimism_misses_the_unexplored_optimum():
    """Why the ToyGraph spec sets `lengthscale_decay`: after MCBO has exploited the +π mode,
    β = 0.5 with the fitted lengthscales neither bounds the unexplored optimum from above nor
    ranks it first (paper 004's calibration assumption A3, |f − μ| ≤ βσ, fails there): μ_Y(−3.2)
    ≈ 0.4, σ_Y ≈ 1.0 — Y's MAP lengthscale (~10 units of X1, the Gamma(3, 6) prior's pull) is too
    long for cos X1 to show where no round has looked — so μ + 0.5σ ≈ 0.7 against ≈ 1.7 at +π.
    If this fails, the model changed so that β = 0.5 alone suffices: measure again before
    keeping the decay (docs/benchmarks.md, issue 19)."""
    settings = dict(load_spec(example_spec("toygraph")).policy.settings)
    settings.pop("lengthscale_decay", None)
    optimum, mode, truth, _ = _optimism_at_optimum_and_mode(settings)
    assert optimum < truth and optimum < mode, (optimum, mode, truth)


def test_shrinking_lengthscales_cover_the_unexplored_optimum():
    """The same trapped model with `lengthscale_decay: 0.5` (Berkenkamp et al. 2019): Y's
    lengthscale capped at (1/3)·t^(−1/2) of the cube (t = 24 rounds: 1.7 units of X1, against
    cos X1's period 6.3) and β = 0.5·t^(1/4) ≈ 1.1. Away from the +π readings μ_Y reverts to the
    data mean and σ_Y to its prior, so the optimism at do(X1 = −3.2) exceeds both its true value
    and the value at the mode: what the spec's fitted lengthscale (≈ 10 units) and β = 0.5 do
    not give (the test above); the ToyGraph spec ships with it. Seeds 0 and 2 hold as well; seed
    3 ranks the optimum first but its optimism there (1.67) is below 2.17 (docs/benchmarks.md)."""
    spec = load_spec(example_spec("toygraph"))
    assert spec.policy.settings.get("lengthscale_decay") == 0.5  # as shipped
    optimum, mode, truth, (model, problem) = _optimism_at_optimum_and_mode(spec.policy.settings)
    assert problem.beta == pytest.approx(0.5 * len(model.history) ** 0.25)
    assert optimum >= truth, f"optimism {optimum:.2f} below E[Y | do(X1 = −3.2)] = {truth:.2f}"
    assert optimum > mode, f"optimism at the optimum {optimum:.2f} ≤ at the +π mode {mode:.2f}"
    # the policy's view, not the model: the model keeps its fitted lengthscales
    assert problem.model is not model
    y = model.member["Y"]
    assert float(model.gp.lengthscale[y, 0]) > float(problem.model.gp.lengthscale[y, 0])
