"""agent.tasks.stop_tasks: a stopping service ends tasks that swallowed their cancellation."""

from __future__ import annotations

import asyncio

import pytest

from agent.tasks import stop_tasks


async def _connect_then_serve(connack: asyncio.Future[int], served: list[int]) -> None:
    """aiomqtt's connect, in small: wait for CONNACK with wait_for, then serve until cancelled."""
    served.append(await asyncio.wait_for(connack, timeout=10.0))
    await asyncio.Event().wait()


async def _race_cancel_with_connack() -> tuple[asyncio.Task[None], list[int]]:
    """A task cancelled in the same loop turn as its CONNACK arrives (on Python 3.11 the
    cancellation is lost: gh-86296)."""
    connack: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    served: list[int] = []
    task = asyncio.create_task(_connect_then_serve(connack, served), name="mqtt")
    await asyncio.sleep(0)  # the task now waits for the CONNACK
    connack.set_result(0)
    task.cancel()
    return task, served


async def test_a_task_that_swallowed_its_cancel_is_cancelled_again_and_stops():
    task, _ = await _race_cancel_with_connack()
    async with asyncio.timeout(5.0):
        await stop_tasks([task], recancel_after_s=0.05)
    assert task.cancelled()


async def test_the_race_it_guards_against_is_real_on_this_python():
    """Cancelled once, the task may run on: why stop_tasks cancels again (a Python that honours
    the cancel ends the task either way)."""
    task, served = await _race_cancel_with_connack()
    await asyncio.wait([task], timeout=0.2)
    if not task.done():  # the cancellation was swallowed; the CONNACK was taken
        assert served == [0]
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_error_of_a_stopped_task_is_raised_and_the_others_still_stop():
    async def fail() -> None:
        raise RuntimeError("a driver bug")

    failed = asyncio.create_task(fail())
    waiting = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="a driver bug"):
        await stop_tasks([failed, waiting])
    assert waiting.cancelled()


async def test_tasks_already_done_are_left_as_they_are():
    done = asyncio.create_task(asyncio.sleep(0, result=3))
    await done
    await stop_tasks([done])
    assert done.result() == 3
