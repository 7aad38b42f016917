"""Time to a policy's first proposal on a spec: its constructor, then one decision with no data.

`python -m bench.first_proposal SPEC [--policy hagpucb] [--setting KEY=JSON ...]`

One measurement per process (imports, the spec and the model are ready before the clock
starts), printed as one JSON line: the spec, the policy, `construct_s` (the policy's
constructor), `propose_s` (its first proposal on an empty model), `phase_one_rounds` where the
policy has one, and the 1-minute load average at the start and the end. The command is meant
to be repeated, interleaved with another checkout's code (`PYTHONPATH` picks the tree), to
compare two versions of a policy: see docs/benchmarks.md, "hagpucb's constructor".
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from core.network import NetworkModel
from core.spec import load_spec
from policies.base import Constraints
from policies.registry import make_policy, policy_classes


def _setting(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    return name, json.loads(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="an experiment spec (YAML)")
    parser.add_argument("--policy", default="hagpucb")
    parser.add_argument(
        "--setting", action="append", default=[], type=_setting, help="KEY=JSON, repeatable"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = load_spec(args.spec)
    settings = dict(args.setting)
    model, constraints = NetworkModel(spec), Constraints.from_spec(spec)
    rng = torch.Generator().manual_seed(0)
    policy_classes()  # the policies' modules imported before the clock
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    policy = make_policy(args.policy, spec, settings)
    built = time.perf_counter()
    proposal = policy.propose(model, constraints, rng)
    done = time.perf_counter()
    row = {
        "spec": spec.name,
        "policy": args.policy,
        "construct_s": round(built - started, 4),
        "propose_s": round(done - built, 4),
        "phase": proposal.diagnostics.get("phase"),
        "phase_one_rounds": getattr(policy, "phase_one_rounds", None),
        "load": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
