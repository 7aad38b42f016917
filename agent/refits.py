"""Hyperparameter refits beside the event loop: one worker job per experiment at a time.

The service's models learn in deferred mode (`NetworkModel(deferred_refits=True)`): a reading
only appends rows, in O(n²). When the refit schedule fires (every `model.refit_every` new
observations of a node, a misfit, or a drift of the data from the frozen standardization),
the driver copies the due nodes' data (`NetworkModel.refit_jobs`), a worker *process* fits their
hyperparameters on that copy (`core.gp.refit.fit_job`: BoTorch's fit is Python-heavy, and in a
thread it would hold the interpreter lock the event loop needs — measured: the loop then
handled a fraction of its messages), a worker thread refactorizes them (`factorize_job`: LAPACK,
which releases the lock), and when it is done the driver — between batches, never while the
policy thinks — swaps the result in, appending the rows that arrived meanwhile
(`NetworkModel.install`). The event loop never waits for a fit or an O(n³) rebuild.

Readings that arrive while a job runs are learned at once with the old hyperparameters, and
again with the new ones when it is installed: the installed model is the exact GP of all rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING

import structlog
import torch

from agent import join
from core.gp.refit import RefitFit, RefitJob, RefitResult, factorize_job, fit_job, run_refit

if TYPE_CHECKING:
    from agent.experiment import Experiment

__all__ = ["BackgroundRefits", "FitWorker", "run_jobs"]

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


def _init_worker(parent: int) -> None:
    """The fit process's initializer: one torch thread (the other core is the event loop's),
    and an exit as soon as the agent is gone — a SIGKILLed agent would otherwise leave it
    running, holding its memory (measured: still alive ten minutes after the kill)."""
    torch.set_num_threads(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def fit_jobs(jobs: dict[str, RefitJob]) -> dict[str, RefitFit]:
    """The fits of every job (in the worker process)."""
    return {key: fit_job(job) for key, job in jobs.items()}


def factorize_jobs(jobs: dict[str, RefitJob], fits: dict[str, RefitFit]) -> dict[str, RefitResult]:
    """The factorizations of every job under its fit (in a worker thread, one torch thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {key: factorize_job(job, fits[key]) for key, job in jobs.items()}
    finally:
        torch.set_num_threads(threads)


def _ready() -> bool:
    return True


class FitWorker:
    """One process that fits hyperparameters for every experiment of a service (spawned: it
    imports torch and BoTorch once, seconds, beside the loop — `warm` starts that early)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(os.getpid(),),
            )
        return self._pool

    def warm(self) -> None:
        """Start the process now (its imports take seconds) rather than at the first refit."""
        self._started().submit(_ready)

    async def fit(self, jobs: dict[str, RefitJob]) -> dict[str, RefitFit]:
        pool = self._started()
        return await asyncio.get_running_loop().run_in_executor(pool, fit_jobs, jobs)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class BackgroundRefits:
    """One experiment's refit worker: start a job when one is due, install it when done.

    Args:
        exp: the experiment (its model learns in deferred mode).
        wake: called (on the event loop) when a result is ready, so the driver installs it.
        worker: the fit process (shared by a service's experiments); None fits in a thread.
    """

    def __init__(
        self, exp: Experiment, wake: Callable[[], None], worker: FitWorker | None = None
    ) -> None:
        self.exp = exp
        self._wake = wake
        self._worker = worker
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
            if self._worker is None:
                self._ready = await asyncio.to_thread(run_jobs, jobs)
            else:
                fits = await self._worker.fit(jobs)
                self._ready = await asyncio.to_thread(factorize_jobs, jobs, fits)
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
