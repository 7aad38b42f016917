"""Decision time of the parameter-vector policies against D (paper 000's experiments).

`python -m bench.decision_additive [--dims 20 50 100 500] [--observations 200] [--repeats 5]
[--threads 1]`

For each D: the dependency graph of `sim.additive_er` (an Erdős–Rényi graph, mean degree 1.5)
and `observations` random rounds of its function, learned by a `NetworkModel`. Then, with the
policies interleaved, `repeats` timed decisions each:
  addgpucb   the additive GP-UCB of phase 2 on the true groups (what hagpucb runs after phase 1),
             with the model already synchronised and refitted: the decision itself;
  refit      one additive-GP hyperparameter refit (`AdditiveGP.fit`), which a decision pays
             every `refit_every` rounds;
  cmaes      one CMA-ES proposal;
  gpucb      the full-dimensional GP-UCB (skipped above `--gpucb-max-dim`).
Reported: median, min and max seconds per decision, on this machine, with `--threads` torch
threads (1 by default; 2 is the service's 2-core machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from core.network import NetworkModel
from core.spec import parse_spec
from policies.base import Constraints
from policies.registry import make_policy
from sim.additive_er import AdditiveER


def _spec(dim: int, policy: str, settings: dict) -> object:
    return parse_spec(
        {
            "name": f"decision-{dim}",
            "intervention": "soft",
            "nodes": [{"name": "R", "bounds": [-50, 50], "noise_std": 0.1}],
            "parameters": {"name": "theta", "dimension": dim, "bounds": [0, 1], "targets": ["R"]},
            "reward": {"node": "R"},
            "model": {"refit_every": None, "misfit_z": None},
            "policy": {"name": policy, "settings": settings},
            "initial_design": {"rounds": 0},
        }
    )


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(dim: int, observations: int, repeats: int, gpucb_max_dim: int) -> dict[str, list]:
    env = AdditiveER(dim, seed=0)
    groups = [list(g) for g in env.groups]
    g = torch.Generator().manual_seed(dim)
    thetas = torch.rand(observations, dim, generator=g, dtype=torch.float64)
    rewards = env.value(thetas) + 0.1 * torch.randn(observations, generator=g, dtype=torch.float64)
    policies = {
        "addgpucb": make_policy("addgpucb", _spec(dim, "addgpucb", {}), {"groups": groups}),
        "cmaes": make_policy("cmaes", _spec(dim, "cmaes", {}), {}),
    }
    if dim <= gpucb_max_dim:
        policies["gpucb"] = make_policy("gpucb", _spec(dim, "gpucb", {}), {})
    model = NetworkModel(_spec(dim, "addgpucb", {}))
    names = model.action_names
    for theta, y in zip(thetas, rewards, strict=True):
        model.learn(dict(zip(names, theta.tolist(), strict=True)), {"R": float(y)})
    ucb = policies["addgpucb"]._ucb
    ucb.sync(model)  # the first call learns the history and refits once: not a decision
    times: dict[str, list] = {name: [] for name in [*policies, "refit"]}
    rng = torch.Generator().manual_seed(0)
    for _ in range(repeats):  # interleaved
        for name, policy in policies.items():
            times[name].append(_timed(lambda p=policy: p.propose(model, Constraints(), rng)))
        times["refit"].append(_timed(ucb.gp.fit))
        print(  # each repeat as it ends, so that a run cut short still says something
            f"D={dim} repeat {len(times['refit'])}: "
            + ", ".join(f"{name} {values[-1]:.3f} s" for name, values in times.items()),
            file=sys.stderr,
            flush=True,
        )
    times["groups"] = [len(groups), max(len(x) for x in groups)]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 50, 100, 500])
    parser.add_argument("--observations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpucb-max-dim", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"observations={args.observations} repeats={args.repeats} threads={args.threads} "
        "(seconds per decision)"
    )
    print("| D | groups (largest) | policy | median s | min s | max s |")
    print("|---|---|---|---|---|---|")
    for dim in args.dims:
        times = measure(dim, args.observations, args.repeats, args.gpucb_max_dim)
        count, largest = times.pop("groups")
        for name, values in times.items():
            print(
                f"| {dim} | {count} ({largest}) | {name} | {statistics.median(values):.3f} "
                f"| {min(values):.3f} | {max(values):.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
