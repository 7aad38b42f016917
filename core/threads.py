"""Torch's intra-op thread count for the calling thread alone.

ATen keeps the count in two places: each thread's own (OpenMP's and MKL's setting, which its
pool reads), and one value for the process, which a thread copies once, the first time it uses
torch. `torch.set_num_threads` writes both. So a worker thread that asks for one thread for
itself also gives one to every thread that starts using torch while the worker runs — the
policy's next worker thread, a refit's factorization thread — and those keep it for good.
`this_thread_only` sets the calling thread's count and puts the process's value straight back,
from a short-lived thread of its own (the only way to write it without also changing the
caller's). What remains is a window of one thread start (about 0.1 ms) in which a thread using
torch for the first time would still copy the caller's count.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch

__all__ = ["process_threads", "this_thread_only"]

_T = TypeVar("_T")
_LOCK = threading.Lock()  # one change of the process's value at a time


def _in_new_thread(work: Callable[[], _T]) -> _T:
    results: list[_T] = []
    thread = threading.Thread(target=lambda: results.append(work()), name="torch-threads")
    thread.start()
    thread.join()
    return results[0]


def process_threads() -> int:
    """The count a thread that starts using torch now begins with."""
    return _in_new_thread(torch.get_num_threads)


@contextmanager
def this_thread_only(count: int) -> Iterator[None]:
    """Run the body with `count` intra-op threads in the calling thread; threads that start
    using torch meanwhile still begin with the process's count. The caller's own count is
    restored on exit."""
    with _LOCK:
        process = process_threads()
        before = torch.get_num_threads()
        torch.set_num_threads(count)
        _in_new_thread(lambda: torch.set_num_threads(process))
    try:
        yield
    finally:
        with _LOCK:
            process = process_threads()  # as it is now: another thread may have changed it
            torch.set_num_threads(before)
            _in_new_thread(lambda: torch.set_num_threads(process))
