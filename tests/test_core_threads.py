"""`core.threads.this_thread_only`: one thread's torch thread count, not the process's.

`torch.set_num_threads` in a worker also sets the count every thread that starts using torch
afterwards copies (ATen keeps one value for the process): the first test shows that leak on
this build of torch, the second that `this_thread_only` leaves no such trace.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from core.threads import process_threads, this_thread_only


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The process (and this thread) at 2 torch threads, whatever the machine has."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def in_worker(body: Callable[[], None]) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if errors:
        raise errors[0]


def started_meanwhile() -> int:
    """The count a thread that starts using torch now gets."""
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


def test_set_num_threads_in_a_worker_reaches_threads_started_meanwhile(two_threads) -> None:
    seen: list[int] = []

    def body() -> None:
        torch.set_num_threads(1)
        seen.append(started_meanwhile())
        torch.set_num_threads(2)

    in_worker(body)
    assert seen == [1]  # the leak this module exists for


def test_this_thread_only_sets_the_callers_count_alone_and_restores_it(two_threads) -> None:
    seen: dict[str, int] = {}

    def body() -> None:
        with this_thread_only(1):
            seen["inside"] = torch.get_num_threads()
            seen["started meanwhile"] = started_meanwhile()
            seen["process"] = process_threads()
        seen["after"] = torch.get_num_threads()

    in_worker(body)
    assert seen == {"inside": 1, "started meanwhile": 2, "process": 2, "after": 2}
    assert torch.get_num_threads() == 2 and process_threads() == 2


def test_the_callers_count_is_restored_when_the_body_raises(two_threads) -> None:
    with pytest.raises(RuntimeError, match="boom"), this_thread_only(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2 and process_threads() == 2


@pytest.mark.parametrize("runner", ["run_jobs", "factorize_jobs", "_fit_in_thread"])
def test_the_refits_worker_thread_keeps_its_one_thread_to_itself(
    two_threads, monkeypatch, runner
) -> None:
    """A refit in a worker thread runs on one torch thread; a thread that starts using torch
    meanwhile (a policy's worker) still gets the process's two."""
    import agent.refits as refits

    seen: dict[str, int] = {}

    def observe(*_: object) -> dict[str, object]:
        seen["worker"] = torch.get_num_threads()
        seen["meanwhile"] = started_meanwhile()
        return {}

    inner = {"run_jobs": "run_refit", "factorize_jobs": "factorize_job"}.get(runner, "fit_jobs")
    monkeypatch.setattr(refits, inner, observe)
    call = getattr(refits, runner)
    jobs = {"X": object()} if runner != "_fit_in_thread" else {}
    in_worker(lambda: call(jobs, {"X": None}) if runner == "factorize_jobs" else call(jobs))
    assert seen == {"worker": 1, "meanwhile": 2}
    assert torch.get_num_threads() == 2 and process_threads() == 2
