"""MCBO's η-net training is fast on a loaded machine and its results do not change (issue 17,
mcbo17): one intra-op thread, an Adam without torch.optim that gives torch's iterates."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

import policies.mcbo as mcbo
from policies._optimize import Adam
from policies.base import Constraints
from policies.registry import make_policy
from tests.test_policies_helpers import chain_spec, trained_model

ROOT = Path(__file__).resolve().parents[1]


def test_adam_gives_torch_optims_iterates_bitwise():
    """Same arithmetic in the same order as torch.optim.Adam's CPU path: equal to the last bit
    after 40 steps, a tensor that got no gradient in some steps included (its own step count
    waits, as torch's does)."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(16, 3), (16, 2, 8), (16,), ()]
    start = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
    ours = [p.clone().requires_grad_(True) for p in start]
    theirs = [p.clone().requires_grad_(True) for p in start]
    mine, reference = Adam(ours, lr=0.05), torch.optim.Adam(theirs, lr=0.05)
    for step in range(40):
        grads = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
        for params, optimizer in ((ours, mine), (theirs, reference)):
            optimizer.zero_grad()
            for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                if i == 3 and step % 3 == 0:
                    continue  # no gradient this step
                p.grad = g.clone()
            optimizer.step()
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    mine.zero_grad()
    assert all(p.grad is None for p in ours)


def test_the_training_runs_on_one_thread_and_gives_the_callers_count_back(monkeypatch):
    """A soft noisy chain (network η, one region): every rollout of the training sees one
    intra-op thread, whatever the caller's count, and the caller's count is back afterwards;
    the proposal is the one a one-thread caller gets."""
    spec = chain_spec(intervention="soft", noise=0.1, nodes=4)
    model = trained_model(spec, 10)
    settings = {"nn_restarts": 4, "steps": 16, "max_seconds": 600.0}
    counts: list[int] = []
    draws = mcbo._MCBOProblem._network_draws

    def spy(self, *args, **kwargs):
        counts.append(torch.get_num_threads())
        return draws(self, *args, **kwargs)

    monkeypatch.setattr(mcbo._MCBOProblem, "_network_draws", spy)
    before = torch.get_num_threads()
    proposals = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            policy = make_policy("mcbo", spec, settings)
            constraints = Constraints.from_spec(spec, 0.0)
            rng = torch.Generator().manual_seed(3)
            proposals.append(policy.propose(model, constraints, rng))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert proposals[0].diagnostics["eta"] == "network"
    assert counts and set(counts) == {1}
    assert proposals[0].intervention == proposals[1].intervention


def test_a_decision_does_not_import_torch_dynamo():
    """torch.optim's first optimizer imports torch._dynamo (1.3–2 s here, paid by the first
    decision of a process); the training's Adam does not use torch.optim. A fresh process
    makes one network-η proposal and must not have loaded it."""
    script = textwrap.dedent(
        """
        import sys
        import torch
        from policies.base import Constraints
        from policies.registry import make_policy
        from tests.test_policies_helpers import chain_spec, trained_model

        spec = chain_spec(intervention="soft", noise=0.1, nodes=4)
        model = trained_model(spec, 6)
        policy = make_policy("mcbo", spec, {"nn_restarts": 2, "steps": 8})
        proposal = policy.propose(model, Constraints.from_spec(spec, 0.0),
                                  torch.Generator().manual_seed(0))
        assert proposal.diagnostics["eta"] == "network", proposal.diagnostics
        print("dynamo" if "torch._dynamo" in sys.modules else "clean")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "clean"
