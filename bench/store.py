"""`cbo-agent bench store`: the store alone — rounds written per second and bytes on disk per
1,000 rounds, SQLite beside PostgreSQL, repeats interleaved.

A round is what the agent writes for one round of the spec's experiment, call for call and
transaction for transaction (agent/experiment.py): propose (the round and its reservation, one
transaction), publish (status and attempt), ack (status and settlement), the readings of every
node of the spec (one transaction, as a batch of feedback is stored), close (status). Each
commit is durable as the backend ships (SQLite ``synchronous=FULL``, PostgreSQL
``synchronous_commit`` as the server has it). Model snapshots, which the agent writes after
refits and whose size is the model's, are left out.

Each repeat opens a fresh store per backend — a new SQLite file, a new scratch PostgreSQL
database on the `--postgres` server — writes `rounds` rounds through one `Store` from one thread
(as the agent's event loop does) and measures the time of the writes and what the store's
tables and indexes grew by (`Store.size_bytes`). Backends alternate which goes first from one
repeat to the next. Rows of the JSON: one per run, and per backend the median and spread.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.harness.postgres import scratch_database
from bench.report import machine_info, print_table, progress_bar, wide_console, write_json
from connectors.store import Store
from core.spec import ExperimentSpec, load_spec

__all__ = ["BACKENDS", "StoreRun", "run", "write_rounds"]

BACKENDS = ("sqlite", "postgresql")
COMMITS_PER_ROUND = 5  # propose, publish, ack, readings, close: write_rounds' transactions


@dataclass(frozen=True)
class StoreRun:
    """One backend's run of one repeat."""

    backend: str
    repeat: int
    rounds: int
    writes_per_round: int  # Store calls per round
    commits_per_round: int
    seconds: float
    rounds_per_s: float
    bytes_per_1000_rounds: float


def write_rounds(store: Store, spec: ExperimentSpec, rounds: int) -> int:
    """Write `rounds` rounds of `spec`'s experiment as the agent does; the Store calls a round
    makes."""
    name = spec.name
    store.upsert_experiment(name, spec.model_dump(mode="json", by_alias=True))
    intervention = {a.name: (a.bounds[0] + a.bounds[1]) / 2 for a in spec.actions}
    targets = [a.name for a in spec.actions]
    cost = sum(a.cost + a.cost_per_unit * abs(intervention[a.name]) for a in spec.actions)
    budget = spec.constraints.budget_total
    budget = None if budget is None else max(budget, 2 * cost * rounds)  # spent, never refused
    nodes = spec.node_names
    ack_window = spec.schedule.ack_timeout_s * (spec.schedule.ack_retries + 1)
    for r in range(rounds):
        now = time.time()
        with store.transaction():  # propose
            store.add_round(name, r, f"{name}-{r}", intervention, targets, cost,
                            spec.intervention, now, expires_at=now + ack_window)  # fmt: skip
            store.reserve(name, r, cost, budget, now)
        with store.transaction():  # publish
            store.set_round_status(name, r, "published", now)
            store.bump_attempt(name, r)
        with store.transaction():  # ack
            store.set_round_status(name, r, "acked", now)
            store.settle(name, r, now)
        with store.transaction():  # the readings, one per node
            for i, node in enumerate(nodes):
                store.add_reading(name, r, node, 0.5 + i, r * len(nodes) + i, "bench", now)
        store.set_round_status(name, r, "closed", now, "complete")  # close
    return 7 + len(nodes)


def _sqlite_store(workdir: Path) -> Callable[[], AbstractContextManager[str]]:
    @contextmanager
    def fresh() -> Iterator[str]:
        with tempfile.TemporaryDirectory(dir=workdir) as directory:
            yield str(Path(directory) / "store.sqlite")

    return fresh


def _postgres_store(admin_url: str) -> Callable[[], AbstractContextManager[str]]:
    def fresh() -> AbstractContextManager[str]:
        return scratch_database(admin_url, prefix="cbo_bench")

    return fresh


def _one_run(
    backend: str,
    fresh: Callable[[], AbstractContextManager[str]],
    spec: ExperimentSpec,
    rounds: int,
    repeat: int,
) -> StoreRun:
    with fresh() as target, Store(target) as store:
        before = store.size_bytes()
        start = time.perf_counter()
        writes = write_rounds(store, spec, rounds)
        seconds = time.perf_counter() - start
        grown = store.size_bytes() - before
    return StoreRun(
        backend=backend,
        repeat=repeat,
        rounds=rounds,
        writes_per_round=writes,
        commits_per_round=COMMITS_PER_ROUND,
        seconds=seconds,
        rounds_per_s=rounds / seconds,
        bytes_per_1000_rounds=grown * 1000 / rounds,
    )


def summarize(runs: Sequence[StoreRun]) -> list[dict[str, Any]]:
    """Per backend: the median, min and max of each measure over the repeats."""
    rows = []
    for backend in dict.fromkeys(run.backend for run in runs):
        mine = [run for run in runs if run.backend == backend]
        speed = [run.rounds_per_s for run in mine]
        size = [run.bytes_per_1000_rounds for run in mine]
        rows.append(
            {
                "backend": backend,
                "repeats": len(mine),
                "rounds": mine[0].rounds,
                "rounds_per_s": statistics.median(speed),
                "rounds_per_s_min": min(speed),
                "rounds_per_s_max": max(speed),
                "bytes_per_1000_rounds": statistics.median(size),
                "bytes_per_1000_rounds_min": min(size),
                "bytes_per_1000_rounds_max": max(size),
            }
        )
    return rows


def run(
    spec_path: Path,
    rounds: int,
    repeats: int,
    backends: Sequence[str],
    postgres_admin_url: str,
    json_path: Path | None,
    workdir: Path | None = None,
) -> list[dict[str, Any]]:
    """Run the benchmark, print its table, write its JSON; the summary rows."""
    spec = load_spec(spec_path)
    workdir = workdir or Path(tempfile.gettempdir())
    workdir.mkdir(parents=True, exist_ok=True)
    stores = {
        "sqlite": _sqlite_store(workdir),
        "postgresql": _postgres_store(postgres_admin_url),
    }
    console = wide_console()
    runs: list[StoreRun] = []
    with progress_bar(console) as progress:
        task = progress.add_task("store", total=repeats * len(backends))
        for repeat in range(repeats):
            order = list(backends) if repeat % 2 == 0 else list(reversed(backends))
            for backend in order:
                runs.append(_one_run(backend, stores[backend], spec, rounds, repeat))
                progress.advance(task)
    summary = summarize(runs)
    print_table(
        f"store: {rounds} rounds of {spec.name} ({len(spec.node_names)} readings a round), "
        f"{repeats} repeats interleaved; median [min, max]",
        ["backend", "rounds/s", "min", "max", "bytes / 1000 rounds", "min", "max"],
        [
            [
                row["backend"],
                row["rounds_per_s"],
                row["rounds_per_s_min"],
                row["rounds_per_s_max"],
                row["bytes_per_1000_rounds"],
                row["bytes_per_1000_rounds_min"],
                row["bytes_per_1000_rounds_max"],
            ]
            for row in summary
        ],
        console,
    )
    if json_path is not None:
        write_json(
            json_path,
            {
                "machine": machine_info(),
                "spec": str(spec_path),
                "rounds": rounds,
                "repeats": repeats,
                "summary": summary,
                "runs": [asdict(run) for run in runs],
            },
        )
    return summary
