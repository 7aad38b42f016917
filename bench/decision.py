"""`cbo-agent bench decision`: how long a policy takes to propose, per shipped example.

For each environment with a spec in examples/, one episode is played in this process (the regret
benchmark's harness, `bench.harness.episode.play`: the paper's initial design or the random
explorer's, then R policy rounds against the simulator) and every proposal is timed — the
policy's `propose`, which is nearly all of a decision (the agent's join, GP append, store and
publish add tens of milliseconds; `bench ingest` measures the whole path through a broker).
The table gives p50, p95 and the maximum over the R rounds, how many proposals hit the policy's
wall-clock cap (`diagnostics["timed_out"]`), and the episode's cumulative regret (one seed: a
sanity check, not a regret estimate — `bench regret` is that).

Two clocks: wall time, what a plant waits for, and the process's CPU time, the work a proposal
needs. On a machine shared with other work the wall time grows with the load, and a policy's
wall-clock cap (`max_seconds`) then cuts its search short; CPU time with one torch thread
(`--threads 1`) and a cap raised out of the way (`--setting max_seconds=600`) measures the work
itself: what the wall time is on an idle core.

Torch keeps its default thread count (the agent's), unless `--threads` says otherwise.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from agent.paths import example_spec as example_spec_path
from bench.harness.episode import RunConfig, play
from bench.report import (
    device_info,
    machine_info,
    print_table,
    progress_bar,
    wide_console,
    write_json,
)
from core.spec import load_spec

SCHEMA = "cbo-agent/bench-decision"
VERSION = 1


class BadArguments(ValueError):
    """A user's mistake in the command's arguments (one line, exit code 2)."""


@dataclass
class DecisionRow:
    """One environment's proposal times (seconds) over its policy rounds."""

    env: str
    policy: str
    rounds: int
    p50_s: float
    p95_s: float
    max_s: float
    mean_s: float
    cpu_p50_s: float
    cpu_p95_s: float
    cpu_max_s: float
    timed_out: int
    cumulative_regret: float
    status: str
    seconds: list[float]
    cpu_seconds: list[float]
    device: str = "cpu"
    device_name: str = ""


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` (inclusive method; NaN when empty)."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def env_names(names: Sequence[str] | None) -> list[str]:
    """The environments to measure: those named, or every one with a spec (in the registry's
    order). Raises BadArguments for a name that is not one."""
    from bench.ingest import latency_env_names

    try:
        return latency_env_names(None if not names else list(names))
    except ValueError as error:
        raise BadArguments(str(error)) from None


Setting = tuple[str | None, str, Any]  # (policy it applies to, or None for any; key; value)


def measure(
    env: str,
    policy: str | None,
    rounds: int,
    seed: int,
    settings: Sequence[Setting] = (),
    device: str = "cpu",
) -> DecisionRow:
    """Play one episode of `env` with `policy` (None: the spec's, with the spec's settings) and
    time its proposals; `settings` apply where their policy runs."""
    spec_path = example_spec_path(env)
    spec_policy = load_spec(spec_path).policy
    name = policy or spec_policy.name
    chosen = dict(spec_policy.settings) if policy is None else {}
    chosen.update({key: value for who, key, value in settings if who in (None, name)})
    config = RunConfig(env, name, seed, rounds, chosen, str(spec_path), device)
    payload = play(config)
    history = payload["history"]
    seconds = [float(r["decision_seconds"]) for r in history]
    cpu = [float(r.get("decision_cpu_seconds", "nan")) for r in history]
    timed_out = sum(bool((r.get("diagnostics") or {}).get("timed_out")) for r in history)
    regrets = [r["regret"] for r in history if r.get("regret") is not None]
    regret = float(sum(regrets)) if regrets else float("nan")  # paper 001's runs keep none
    status = payload["status"] if payload["error"] is None else f"failed: {payload['error']}"
    return DecisionRow(
        env,
        name,
        len(seconds),
        quantile(seconds, 0.5),
        quantile(seconds, 0.95),
        max(seconds, default=float("nan")),
        statistics.fmean(seconds) if seconds else float("nan"),
        quantile(cpu, 0.5),
        quantile(cpu, 0.95),
        max(cpu, default=float("nan")),
        timed_out,
        regret,
        status,
        seconds,
        cpu,
        **device_info(device),
    )


def run(
    envs: Sequence[str] | None,
    policy: str | None,
    rounds: int,
    seed: int,
    settings: Sequence[Setting],
    json_path: Path | None,
    threads: int | None = None,
    device: str = "cpu",
) -> list[DecisionRow]:
    """Measure every environment in `envs`, print the table, write JSON to `json_path`."""
    names = env_names(envs)
    if threads is not None:
        torch.set_num_threads(threads)
    console = wide_console()
    rows: list[DecisionRow] = []
    started = time.perf_counter()
    with progress_bar(console) as progress:
        task = progress.add_task("decision", total=len(names))
        for name in names:
            progress.update(task, description=f"decision {name}")
            rows.append(measure(name, policy, rounds, seed, settings, device))
            progress.advance(task)
    _print(rows, console, device)
    if json_path is not None:
        write_json(
            json_path,
            {
                "schema": SCHEMA,
                "version": VERSION,
                "machine": machine_info(device),
                **device_info(device),
                "policy": policy,
                "rounds": rounds,
                "seed": seed,
                "settings": [list(s) for s in settings],
                "wall_seconds": time.perf_counter() - started,
                "load_average": os.getloadavg(),
                "rows": [asdict(r) for r in rows],
            },
        )
    return rows


def _print(rows: Sequence[DecisionRow], console: Console, device: str = "cpu") -> None:
    where = device_info(device)
    print_table(
        f"Proposal time per round (seconds; {where['device']}: {where['device_name']})",
        [
            "env",
            "policy",
            "rounds",
            "p50",
            "p95",
            "max",
            "cpu p50",
            "cpu p95",
            "timed out",
            "cum. regret",
            "status",
        ],
        (
            [
                r.env,
                r.policy,
                r.rounds,
                r.p50_s,
                r.p95_s,
                r.max_s,
                r.cpu_p50_s,
                r.cpu_p95_s,
                r.timed_out,
                r.cumulative_regret,
                r.status,
            ]
            for r in rows
        ),
        console,
    )
