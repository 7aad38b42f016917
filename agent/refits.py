"""Hyperparameter refits beside the event loop: one worker job per experiment at a time.

The service's models learn in deferred mode (`NetworkModel(deferred_refits=True)`): a reading
only appends rows, in O(n²). When the refit schedule fires (every `model.refit_every` new
observations of a node, a misfit, or a drift of the data from the frozen standardization),
the driver copies the due nodes' data (`NetworkModel.refit_jobs`), a worker thread fits their
hyperparameters and refactorizes them on that copy (`core.gp.refit.run_refit`), and when it is
done the driver — between batches, never while the policy thinks — swaps the result in,
appending the rows that arrived meanwhile (`NetworkModel.install`). The event loop never waits
for a fit or an O(n³) rebuild.

Readings that arrive while a job runs are learned at once with the old hyperparameters, and
again with the new ones when it is installed: the installed model is the exact GP of all rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
import torch

from agent import join
from core.gp.refit import RefitJob, RefitResult, run_refit

if TYPE_CHECKING:
    from agent.experiment import Experiment

__all__ = ["BackgroundRefits", "run_jobs"]

log = structlog.get_logger(__name__)


def run_jobs(jobs: dict[str, RefitJob]) -> dict[str, RefitResult]:
    """Run each job (in the calling thread, with one torch thread: the other core is the
    event loop's)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {key: run_refit(job) for key, job in jobs.items()}
    finally:
        torch.set_num_threads(threads)


class BackgroundRefits:
    """One experiment's refit worker: start a job when one is due, install it when done.

    Args:
        exp: the experiment (its model learns in deferred mode).
        wake: called (on the event loop) when a result is ready, so the driver installs it.
    """

    def __init__(self, exp: Experiment, wake: Callable[[], None]) -> None:
        self.exp = exp
        self._wake = wake
        self._task: asyncio.Task[None] | None = None
        self._ready: dict[str, RefitResult] | None = None
        self.started = 0  # jobs started (tests and benchmarks read these)
        self.installed = 0

    @property
    def running(self) -> bool:
        return self._task is not None

    def maybe_start(self) -> bool:
        """Start a job for the due refits unless one is running or waits to be installed."""
        if self._task is not None or self._ready is not None:
            return False
        jobs = self.exp.model.refit_jobs()
        if not jobs:
            return False
        self._task = asyncio.create_task(self._run(jobs), name=f"refit:{self.exp.name}")
        self.started += 1
        return True

    async def _run(self, jobs: dict[str, RefitJob]) -> None:
        try:
            self._ready = await asyncio.to_thread(run_jobs, jobs)
        except Exception:  # a failed fit never stops the experiment: the old model stays
            self.exp.log.exception("model.refit_failed", nodes=self._nodes(jobs))
        finally:
            self._task = None
        if self._ready is not None:
            self._wake()

    def _nodes(self, jobs: dict[str, RefitJob]) -> list[str]:
        order = self.exp.model.order
        names = [order[j] for j in jobs["nodes"].members] if "nodes" in jobs else []
        return names + (["(flat)"] if "flat" in jobs else [])

    def install_ready(self) -> bool:
        """Swap in a finished job's results (on the driver, between batches); True if any."""
        ready, self._ready = self._ready, None
        if ready is None:
            return False
        started = time.perf_counter()
        exp = self.exp
        for key, result in ready.items():
            try:
                report = exp.model.install(key, result)
            except Exception:
                exp.log.exception("model.install_failed", model=key)
                continue
            if key == "nodes":
                join.save_snapshot(exp)
                join.log_refit(exp, report, fit_s=result.seconds)
        self.installed += 1
        exp.log.debug("model.installed", seconds=time.perf_counter() - started)
        return True

    async def close(self) -> None:
        """Cancel a running job's wait (the worker thread finishes its fit and is dropped)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
