"""Issue 19: MCBO on ToyGraph must look inside X1's do-domain, not settle on its bound.

With X1 scaled by its sampled range [−15, 160], Y's GP was a smooth trend across the do-domain
[−5, 20] and MCBO proposed do(X1 = −5) (E[Y] ≈ 1.0) in every round of this very run (seed 2 of
`cbo-agent bench regret`, the same seed streams as the benchmark). Scaled by the do-domain, it
proposes do(X1 ≈ 3.1) (E[Y] ≈ 1.85) in its first rounds. The loop stops at the first such
proposal, so the test is short when it passes; `max_seconds` is raised so that the time cap
rarely cuts a proposal short on a loaded machine.
"""

from __future__ import annotations

import torch

from agent.paths import example_spec
from bench.harness.episode import _initial_design, seed_streams
from core.network import NetworkModel
from core.spec import load_spec
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
    _initial_design(env, spec, model, SEED, noise, design, payload)
    proposed = []
    for _ in range(ROUNDS):
        proposal = policy.propose(model, Constraints.from_spec(spec), rng)
        value = proposal.intervention.get("do_X1")
        proposed.append(value)
        if value is not None and -4.0 < value < 19.0:  # inside, a unit away from either bound
            return
        model.learn(proposal.intervention, env.step(proposal.intervention, noise))
    raise AssertionError(f"no do(X1) inside (-4, 19) in {ROUNDS} rounds: {proposed}")
