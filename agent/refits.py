"""Hyperparameter refits beside the event loop: one worker job per experiment at a time.

The service's models learn in deferred mode (`NetworkModel(deferred_refits=True)`): a reading
only appends rows, in O(n²). When the refit schedule fires (every `model.refit_every` new
observations of a node, a misfit, or a drift of the data from the frozen standardization),
the driver copies the due nodes' data (`NetworkModel.refit_jobs`), a worker *process* fits their
hyperparameters on that copy, one member at a time (`core.gp.refit.fit_job`: BoTorch's fit is
Python-heavy, and in a thread it would hold the interpreter lock the event loop needs —
measured: the loop then handled a fraction of its messages), a worker thread refactorizes each
over the rows the model holds when its fit is back (`factorize_job`: LAPACK, which releases the
lock), and the driver — between batches, never while the policy thinks — swaps the result in,
appending the few rows that arrived during the factorization and forgetting those the window
dropped meanwhile (`NetworkModel.install`, O(k·n²)). The event loop never waits for a fit or
an O(n³) rebuild. The fit process lives as long as the service (`FitWorker`).

Readings that arrive while a job runs are learned at once with the old hyperparameters, and
again with the new ones when it is installed: the installed model is the exact GP of all rows.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import structlog
import torch

from agent import fit_process, join
from core.gp.field import FieldRefitJob
from core.gp.refit import RefitFit, RefitJob, RefitResult, factorize_job, fit_job, run_refit
from core.threads import this_thread_only

if TYPE_CHECKING:
    from agent.experiment import Experiment

__all__ = ["RECENT_RECORDS", "BackgroundRefits", "FitWorker", "run_jobs"]

log = structlog.get_logger(__name__)

# Per-install records kept for benchmarks and tests (the latest only): about 16 bytes each,
# so at most a few hundred KiB per experiment however long the service runs.
RECENT_RECORDS = 4096


def run_jobs(jobs: dict[str, Any]) -> dict[str, Any]:
    """Run each job (in the calling thread, with one torch thread: the other core is the
    event loop's): node GP refits (`run_refit`) and array nodes' field refits (`job.run`)."""
    # this_thread_only: torch.set_num_threads would also hand one thread, for good, to every
    # thread that starts using torch during the refit (a policy's worker, MCBO's region threads)
    with this_thread_only(1):
        return {
            key: job.run() if isinstance(job, FieldRefitJob) else run_refit(job)
            for key, job in jobs.items()
        }


def _watch_parent(parent: int) -> None:
    """Exit as soon as the agent is gone — a SIGKILLed agent would otherwise leave the fit
    process running, holding its memory (measured: still alive ten minutes after the kill)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve_fits(conn: Connection, parent: int) -> None:
    """The fit process (entered through `agent.fit_process.main`, which lowered its priority
    before importing this): one torch thread (the other core is the event loop's); fit each
    job received, send back ("ok", fits) or ("error", exception); stop at None or a closed
    pipe."""
    torch.set_num_threads(1)
    _watch_parent(parent)
    while True:
        try:
            jobs = conn.recv()
        except (EOFError, OSError):
            return
        if jobs is None:
            return
        try:
            reply: tuple[str, Any] = ("ok", fit_jobs(jobs))
        except Exception as error:  # the agent logs it; the process serves the next job
            reply = ("error", error)
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


def _exchange(conn: Connection, jobs: dict[str, RefitJob]) -> tuple[str, Any]:
    conn.send(jobs)
    return conn.recv()


def fit_jobs(jobs: dict[str, RefitJob]) -> dict[str, RefitFit]:
    """The fits of every job (in the worker process)."""
    return {key: fit_job(job) for key, job in jobs.items()}


def factorize_jobs(jobs: dict[str, RefitJob], fits: dict[str, RefitFit]) -> dict[str, RefitResult]:
    """The factorizations of every job under its fit (in a worker thread, one torch thread)."""
    with this_thread_only(1):  # as in run_jobs: not the process's count
        return {key: factorize_job(job, fits[key]) for key, job in jobs.items()}


def _fit_in_thread(jobs: dict[str, RefitJob]) -> dict[str, RefitFit]:
    with this_thread_only(1):  # as in run_jobs: not the process's count
        return fit_jobs(jobs)


def _retrieved(done: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a fit nobody waits for any more (`keep_worker`)."""
    if not done.cancelled():
        done.exception()


class FitWorker:
    """One process that fits hyperparameters for every experiment of a service (spawned: it
    imports torch and BoTorch once, seconds, beside the loop — `warm` starts that early).

    Its life is the service's: `close` ends it, and a fit whose waiter is cancelled (its
    experiment or the service stopped) is ended with it rather than left to finish — a fit of
    six nodes at n = 1,000 takes minutes of a core, and one left running after its service
    stopped competed with the next service for the two cores (measured: `bench latency`'s
    later repeats ran beside the earlier repeats' fits, and their p99 went from 18 ms to
    seconds). One fit at a time; the next experiment's waits.
    """

    def __init__(self) -> None:
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._lock = asyncio.Lock()
        self.fits = 0  # fits finished; `ended` fits ended unfinished (benchmarks read these)
        self.ended = 0

    @property
    def pid(self) -> int | None:
        """The fit process's id, None when none runs."""
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def _started(self) -> Connection:
        if self._conn is None or self._process is None or not self._process.is_alive():
            self._stop()
            context = multiprocessing.get_context("spawn")
            ours, theirs = context.Pipe()
            process = context.Process(
                target=fit_process.main, args=(theirs, os.getpid()), name="cbo-fit", daemon=True
            )
            process.start()
            theirs.close()
            self._process, self._conn = process, ours
        return self._conn

    def warm(self) -> None:
        """Start the process now (its imports take seconds) rather than at the first refit."""
        self._started()

    async def fit(self, jobs: dict[str, RefitJob]) -> dict[str, RefitFit]:
        """The jobs' fits, from the fit process (one at a time)."""
        async with self._lock:
            conn = self._started()
            try:
                status, value = await asyncio.to_thread(_exchange, conn, jobs)
            except asyncio.CancelledError:
                # nobody waits for this fit any more: end it (the thread waiting for its reply
                # sees the pipe close and returns); the next fit starts a fresh process
                self.ended += 1
                self._stop()
                raise
            except (EOFError, OSError) as error:
                self._stop()
                raise RuntimeError(f"the fit process ended: {error!r}") from error
        if status == "error":
            raise value
        self.fits += 1
        return value

    def _stop(self) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is not None and process.is_alive():
            process.terminate()
            process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """End the process and any fit in it (the service is stopping)."""
        if self._process is not None and self._process.is_alive() and self._lock.locked():
            self.ended += 1
        self._stop()


class BackgroundRefits:
    """One experiment's refit worker: start a job when one is due, install it when done.

    A job's node GP members are fit one at a time (`RefitJob.split`), each factorized as soon
    as its fit is back and handed to the driver to install: the first new values arrive after
    one member's fit, not after all of them. The factorization runs on the rows the model holds
    when the fit is back (`NetworkModel.refresh_job`), again if more than `CATCH_UP_ROWS` came
    or went meanwhile, so that the install on the loop appends (or forgets) only the few rows
    of the last factorization's time, O(k·n²), and never rebuilds.

    Args:
        exp: the experiment (its model learns in deferred mode).
        wake: called (on the event loop) when a result is ready, so the driver installs it.
        worker: the fit process (shared by a service's experiments); None fits in a thread.
        keep_worker: `close` leaves a fit under way in the fit process to finish (its result
            is dropped) instead of ending the process: a fleet replica lets go of experiments
            while the others it carries go on, and a fresh fit process imports torch and
            BoTorch again (seconds of a core) before the next fit.
    """

    CATCH_UP_ROWS = 32  # most late rows per member an install appends on the loop, if it can
    PASSES = 3  # factorizations per member at most (each over the rows held when it starts)

    def __init__(
        self,
        exp: Experiment,
        wake: Callable[[], None],
        worker: FitWorker | None = None,
        *,
        keep_worker: bool = False,
    ) -> None:
        self.exp = exp
        self._wake = wake
        self.worker = worker
        self.keep_worker = keep_worker
        self._task: asyncio.Task[None] | None = None
        self._ready: list[tuple[str, Any]] = []
        # tests and benchmarks read these: jobs started, results installed (one per member of
        # a node GP job, one per field), the seconds each install held the loop, and the rows
        # each install appended or forgot
        # each install; the per-install records keep the latest RECENT_RECORDS only (a daemon
        # installs every few readings for months), the counts are all-time
        self.started = 0
        self.installed = 0
        self.install_seconds: collections.deque[float] = collections.deque(maxlen=RECENT_RECORDS)
        self.install_rows: collections.deque[int] = collections.deque(maxlen=RECENT_RECORDS)
        self.install_at: collections.deque[float] = collections.deque(maxlen=RECENT_RECORDS)
        # and the seconds of each node GP result installed (one member's fit and factorization)
        self.fit_seconds: collections.deque[float] = collections.deque(maxlen=RECENT_RECORDS)
        self.fits_installed = 0

    @property
    def running(self) -> bool:
        return self._task is not None

    def maybe_start(self) -> bool:
        """Start a job for the due refits unless one is running or waits to be installed."""
        if self._task is not None or self._ready:
            return False
        jobs = self.exp.model.refit_jobs()
        if not jobs:
            return False
        self._task = asyncio.create_task(self._run(jobs), name=f"refit:{self.exp.name}")
        self.started += 1
        return True

    async def _run(self, jobs: dict[str, Any]) -> None:
        # An array node's field fit runs in a thread of this process (its result holds the
        # fitted kernel module, which stays here); node GP fits go to the fit worker.
        fields = {k: j for k, j in jobs.items() if isinstance(j, FieldRefitJob)}
        nodes = {k: j for k, j in jobs.items() if k not in fields}
        try:
            try:
                if fields:
                    self._deliver(await asyncio.to_thread(run_jobs, fields))
            except Exception:  # a failed fit never stops the experiment: the old model stays
                self.exp.log.exception("model.refit_failed", nodes=self._nodes(fields))
                for key in fields:  # and its schedule may hand out a field job again
                    self.exp.model.fields[key.removeprefix("field:")].job_out = False
            for key, job in nodes.items():
                for part in job.split():
                    try:
                        result = await self._refit(key, part)
                    except Exception:  # the old values stay; the member is due again later
                        self.exp.log.exception("model.refit_failed", nodes=self._nodes({key: part}))
                        continue
                    if result is not None:
                        self._deliver({key: result})
        finally:
            self._task = None

    async def _refit(self, key: str, job: RefitJob) -> RefitResult | None:
        """Fit one part, then factorize it over the rows held by then (None: it went stale)."""
        if self.worker is None:
            fit = (await asyncio.to_thread(_fit_in_thread, {key: job}))[key]
        elif self.keep_worker:
            # cancelled meanwhile (`close`), this task ends at once and the fit goes on
            fitting = asyncio.ensure_future(self.worker.fit({key: job}))
            fitting.add_done_callback(_retrieved)
            fit = (await asyncio.shield(fitting))[key]
        else:
            fit = (await self.worker.fit({key: job}))[key]
        model, result = self.exp.model, None
        for _ in range(self.PASSES):
            async with self.exp.learning:  # not while the driver's worker changes the rows
                fresh = model.refresh_job(key, job)
            if fresh is None:
                return None
            result = (await asyncio.to_thread(factorize_jobs, {key: fresh}, {key: fit}))[key]
            if model.late_rows(key, fresh) <= self.CATCH_UP_ROWS:
                break
        return result

    def _deliver(self, ready: dict[str, Any]) -> None:
        self._ready.extend(ready.items())
        self._wake()

    def _nodes(self, jobs: dict[str, RefitJob]) -> list[str]:
        order = self.exp.model.order
        names = [order[j] for j in jobs["nodes"].members] if "nodes" in jobs else []
        fields = [key.removeprefix("field:") for key in jobs if key.startswith("field:")]
        return names + fields + (["(flat)"] if "flat" in jobs else [])

    def install_ready(self) -> bool:
        """Swap in finished results (on the driver, between batches); True if any."""
        ready, self._ready = self._ready, []
        if not ready:
            return False
        exp = self.exp
        for key, result in ready:
            started = time.perf_counter()
            late = 0 if key.startswith("field:") else exp.model.late_rows(key, result.job)
            try:
                report = exp.model.install(key, result)
            except Exception:
                exp.log.exception("model.install_failed", model=key)
                continue
            if key == "nodes":
                join.save_snapshot(exp)
                join.log_refit(exp, report, fit_s=result.seconds)
                self.fit_seconds.append(result.seconds)
                self.fits_installed += 1
            elif key.startswith("field:"):
                exp.log.info(
                    "model.refit", nodes=[key.removeprefix("field:")], fit_s=result.seconds
                )
            self.installed += 1
            self.install_seconds.append(time.perf_counter() - started)
            self.install_rows.append(late)
            self.install_at.append(time.time())
            exp.log.debug("model.installed", seconds=self.install_seconds[-1], late_rows=late)
        return True

    async def close(self) -> None:
        """Cancel a running job (its fit in the fit process is ended, unless `keep_worker`;
        a factorization in a thread finishes and is dropped)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
