"""`cbo-agent bench stream`: months of readings through a bounded node GP.

Feeds N readings per node, one round at a time (`learn_one`, every node at once, as the agent's
join does), through the model a spec with `model.capacity` and `model.budget` makes
(`core.gp.bounded`), and records at checkpoints: the rows each node holds, the process's
resident memory, the update time's median and 99th percentile over the readings since the
previous checkpoint, and how long one refit of every node (fit on the kept rows, then the
rebuild) takes — the work the agent runs beside its event loop.

The readings: inputs uniform in the unit cube half of the time and within 0.05 of a fixed point
the other half (a policy that has found its optimum keeps reading around it), outputs a smooth
function plus noise of std 0.1.

A long run goes in pieces: with `--json PATH` the model's state (`IncrementalGP.state`: the
kept rows, hyperparameters and counts) is written beside it (PATH with the suffix
`.state.npz`) at every checkpoint, and `--resume` continues the run of PATH from its last
checkpoint in a new process — its settings from the JSON, the readings regenerated from the
seed, the model resumed from the state — so a run cut off by a time limit loses only the
readings since its last checkpoint. `--stop-after N` ends a piece at the first checkpoint at
or past N. Resident memory is the process's: a resumed piece starts from a fresh process, so
the JSON lists where each piece began (`resumed_at`).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil
import torch
from rich.console import Console

from bench.report import machine_info, print_table, progress_bar, wide_console, write_json
from core.gp import GPConfig
from core.gp.bounded import BoundedGP, make_gp

__all__ = [
    "Checkpoint",
    "ResumeError",
    "checkpoints",
    "flat_after_budget",
    "run",
    "state_path",
    "stream_readings",
]


class ResumeError(ValueError):
    """A run cannot be resumed (no JSON or state, or a finished run)."""


def state_path(json_path: Path) -> Path:
    """Where the model's state of the run written to `json_path` is kept."""
    return json_path.with_suffix(".state.npz")


def _save_state(path: Path, gp, n: int) -> None:
    """The model after n readings per node, written whole or not at all (numeric arrays)."""
    arrays = {k: v.detach().cpu().numpy() for k, v in gp.state().items()}
    partial = path.with_name(path.name + ".partial.npz")
    np.savez(partial, n=np.array(n), **arrays)
    os.replace(partial, path)


def _load_state(path: Path) -> tuple[int, dict[str, torch.Tensor]]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: torch.from_numpy(data[k].copy()) for k in data.files}
    return int(arrays.pop("n")), arrays


@dataclass
class Checkpoint:
    """The model after n readings per node."""

    n: int
    rows: int  # rows the widest node holds
    rss_mb: float
    update_p50_ms: float
    update_p99_ms: float
    refit_s: float | None  # None: not measured at this checkpoint
    switched: bool
    mode: str = "model"  # "model": the model alone; "service": through the agent (--service)
    # the model-only run: the updates' CPU time on their thread, which time the process spent
    # preempted by others (a busy machine) does not inflate; None through the service
    update_cpu_p50_ms: float | None = None
    update_cpu_p99_ms: float | None = None


def checkpoints(rounds: int, capacity: int | None) -> list[int]:
    """Where to record: a geometric ladder from 1,000 to `rounds`, the capacity, its double."""
    points = {rounds}
    n = 1000
    while n < rounds:
        points.add(n)
        n = n * 2 if str(n)[0] in "15" else n * 5 // 2  # 1k, 2k, 5k, 10k, 20k, 50k, ...
    if capacity is not None:
        points |= {c for c in (capacity, 2 * capacity) if c < rounds}
    return sorted(points)


def _rss_mb() -> float:
    return psutil.Process(os.getpid()).memory_info().rss / 2**20


def stream_readings(
    rounds: int, batch: int, dim: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rounds, batch, dim) inputs and (rounds, batch) outputs, see the module."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(rounds, batch, dim, dtype=torch.float64, generator=gen)
    near = torch.rand(rounds, batch, 1, generator=gen) < 0.5
    local = 0.3 + 0.05 * (
        2 * torch.rand(rounds, batch, dim, dtype=torch.float64, generator=gen) - 1
    )
    x = torch.where(near, local, x)
    y = torch.sin(3 * x).sum(-1) + torch.cos(5 * x[..., 0]) * x[..., -1]
    y = y + 0.1 * torch.randn(rounds, batch, dtype=torch.float64, generator=gen)
    return x, y


def _save(
    path: Path,
    rounds: int,
    batch: int,
    dim: int,
    capacity: int | None,
    budget: int | None,
    seconds: float,
    flat: dict[str, float],
    rows: list[Checkpoint],
    extra: dict,
) -> None:
    write_json(
        path,
        {
            "machine": machine_info(),
            "load_average": os.getloadavg(),
            "rounds": rounds,
            "batch": batch,
            "dim": dim,
            "capacity": capacity,
            "budget": budget,
            "seconds": seconds,
            "flat_after_budget": flat,
            "checkpoints": [asdict(r) for r in rows],
            **extra,
        },
    )


def _spread(values: list[float]) -> float:
    """max/min of the values (NaN when there are none)."""
    return max(values) / min(values) if values and min(values) > 0 else math.nan


def _cpu(row: Checkpoint) -> str:
    if row.update_cpu_p50_ms is None or row.update_cpu_p99_ms is None:
        return "-"
    return f"{row.update_cpu_p50_ms:.2f}/{row.update_cpu_p99_ms:.2f}"


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def _settled(rows: list[Checkpoint], budget: int | None) -> list[Checkpoint]:
    """The checkpoints whose whole window of readings came after the nodes settled at their
    budget."""
    return [
        r
        for before, r in itertools.pairwise(rows)
        if budget is not None and before.switched and before.rows <= budget
    ]


def flat_after_budget(rows: list[Checkpoint], budget: int | None) -> dict[str, float | None]:
    """max/min of RSS and of update p99 over the settled checkpoints (None: no such checkpoint,
    or a value that is not a positive number)."""
    settled = _settled(rows, budget)
    keys = ["rss_mb", "update_p99_ms"]
    if settled and all(r.update_cpu_p99_ms is not None for r in settled):
        keys.append("update_cpu_p99_ms")
    flat = {key: _spread([getattr(r, key) for r in settled]) for key in keys}
    return {key: value if math.isfinite(value) else None for key, value in flat.items()}


def run(
    rounds: int,
    json_path: Path | None,
    *,
    capacity: int | None = 2000,
    budget: int | None = 1000,
    batch: int = 3,
    dim: int = 3,
    refits: bool = True,
    seed: int = 0,
    console: Console | None = None,
    resume: bool = False,
    stop_after: int | None = None,
) -> list[Checkpoint]:
    """Feed `rounds` readings per node; print the checkpoints and save them as JSON (and the
    model's state beside it). With `resume`, continue the run saved at `json_path` (its
    settings replace the arguments); with `stop_after`, end at the first checkpoint at or past
    it."""
    console = console or wide_console()
    torch.set_num_threads(1)  # as the agent's event loop: one thread, the refits beside it
    rows: list[Checkpoint] = []
    start, spent_before, resumed_at = 0, 0.0, []
    state: dict[str, torch.Tensor] | None = None
    if resume:
        if json_path is None or not json_path.exists() or not state_path(json_path).exists():
            raise ResumeError("--resume needs the --json file of a run and its .state.npz")
        saved = json.loads(json_path.read_text())
        rounds, batch, dim = saved["rounds"], saved["batch"], saved["dim"]
        capacity, budget, seed = saved["capacity"], saved["budget"], saved.get("seed", 0)
        refits, spent_before = saved.get("refits", refits), saved["seconds"]
        start, state = _load_state(state_path(json_path))
        rows = [Checkpoint(**c) for c in saved["checkpoints"] if c["n"] <= start]
        resumed_at = [*saved.get("resumed_at", []), start]
        if start >= rounds:
            raise ResumeError(f"the run in {json_path} is finished ({rounds} readings)")
    bounds = torch.tensor([[0.0, 1.0]] * dim, dtype=torch.float64).expand(batch, dim, 2)
    config = GPConfig(
        capacity=capacity, budget=budget, refit_every=None, misfit_z=None, noise_variance=0.01
    )
    gp = make_gp(bounds, config)
    if state is not None:
        gp.resume(state, replay=False)
    extra = {"seed": seed, "refits": refits, "resumed_at": resumed_at}
    x, y = stream_readings(rounds, batch, dim, seed)
    marks = checkpoints(rounds, capacity)
    times: list[float] = []
    cpu: list[float] = []  # the same updates' CPU time of this thread (not preempted time)
    started = time.perf_counter()
    with progress_bar(console) as progress:
        task = progress.add_task("stream", total=rounds, completed=start)
        for t in range(start, rounds):
            tick, cpu_tick = time.perf_counter(), time.thread_time()
            gp.learn_one(x[t], y[t])
            times.append(time.perf_counter() - tick)
            cpu.append(time.thread_time() - cpu_tick)
            if t + 1 in marks:
                refit_s = None
                if refits:
                    tick = time.perf_counter()
                    gp.refit()
                    refit_s = time.perf_counter() - tick
                cuts = statistics.quantiles(times, n=100) if len(times) > 1 else times * 99
                rows.append(
                    Checkpoint(
                        n=t + 1,
                        rows=int(gp.num_observations.max()),
                        rss_mb=_rss_mb(),
                        update_p50_ms=1e3 * statistics.median(times),
                        update_p99_ms=1e3 * cuts[98],
                        update_cpu_p50_ms=1e3 * statistics.median(cpu),
                        update_cpu_p99_ms=1e3 * _p99(cpu),
                        refit_s=refit_s,
                        switched=isinstance(gp, BoundedGP) and all(gp.switched),
                    )
                )
                times, cpu = [], []
                if json_path is not None:  # at every checkpoint: a cut-off run keeps its rows
                    spent = spent_before + time.perf_counter() - started
                    _save(json_path, rounds, batch, dim, capacity, budget, spent, {}, rows, extra)
                    _save_state(state_path(json_path), gp, t + 1)
                if stop_after is not None and t + 1 >= stop_after and t + 1 < rounds:
                    console.print(f"stopped after {t + 1} readings per node: --resume goes on")
                    return rows
            progress.advance(task)
    elapsed = spent_before + time.perf_counter() - started
    flat = flat_after_budget(rows, budget)
    print_table(
        f"Stream of {rounds} readings per node ({batch} nodes, dim {dim}, capacity {capacity}, "
        f"budget {budget}; {elapsed:.0f} s)",
        ["n", "rows", "rss MB", "update p50 ms", "update p99 ms", "cpu p50/p99 ms", "refit s"],
        [
            (r.n, r.rows, r.rss_mb, r.update_p50_ms, r.update_p99_ms, _cpu(r), r.refit_s)
            for r in rows
        ],
        console,
    )
    if None not in flat.values():  # there were windows after the nodes settled
        console.print(
            "after the budget was reached: max/min rss {:.3f}, max/min update p99 {:.3f} "
            "(target: within 1.2)".format(flat["rss_mb"], flat["update_p99_ms"])
            + (
                f"; its CPU time {flat['update_cpu_p99_ms']:.3f}"
                if "update_cpu_p99_ms" in flat
                else ""
            )
        )
    if json_path is not None:
        _save(json_path, rounds, batch, dim, capacity, budget, elapsed, flat, rows, extra)
        console.print(f"results: {json_path}")
    return rows
