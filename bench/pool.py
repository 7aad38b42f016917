"""Independent benchmark runs on several cores: a spawn pool of one-thread workers.

`bench regret` and `bench drift` run many (environment, policy or model, seed) jobs that share
nothing. `run_all` yields each job's outcome as it finishes: in this process for one worker,
else in a pool of spawned processes (a fork after torch's thread pools were started can hang),
each on one torch thread so that the workers do not oversubscribe the cores and their timings
compare with a one-worker run. Ctrl-C reaches the whole process group: the parent alone
decides, stops its workers and does not wait for the runs in flight.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import TypeVar

import torch

__all__ = ["one_torch_thread", "run_all"]

Job = TypeVar("Job")
Result = TypeVar("Result")


def run_all(
    work: Callable[[Job], Result], jobs: Sequence[Job], workers: int
) -> Iterator[tuple[Job, Result | BaseException]]:
    """(job, its result) as each finishes; a job whose worker raised or died yields the error
    instead, and the others go on. `work` must be importable (a module-level function)."""
    if not jobs:
        return
    if workers == 1 or len(jobs) == 1:
        with one_torch_thread():
            for job in jobs:
                yield job, work(job)
        return
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(min(workers, len(jobs)), context, initializer=_init_worker)
    finished = False
    try:
        futures = {pool.submit(work, job): job for job in jobs}
        for future in as_completed(futures):
            yield futures[future], _outcome(future)
        finished = True
    finally:
        if not finished:  # interrupted (Ctrl-C) or abandoned: do not wait for runs in flight
            _stop_workers(pool)
        pool.shutdown(wait=finished, cancel_futures=True)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run in-process with one thread, as a pool worker does, so timings compare."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _outcome(future: Future) -> object:
    try:
        return future.result()
    except Exception as error:  # the worker raised or died: this run failed, the others go on
        return error


def _init_worker() -> None:
    torch.set_num_threads(1)  # workers share the cores: one BLAS thread each
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate this pool's own worker processes (no public call for it before Python 3.14)."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
