"""Stopping asyncio tasks that may have swallowed their cancellation.

On Python 3.11, `asyncio.wait_for` loses a cancellation that arrives in the same loop turn as
the result it waits for (CPython gh-86296, fixed in 3.12): it returns the result and the task
runs on. aiomqtt waits for CONNACK, SUBACK and PUBACK that way, so a service that stops while
its MQTT task is connecting can cancel that task once and then wait for it forever. Seen here:
`cbo-agent run` on an experiment already finished in its store ended its drivers before the
broker session was up; the session's task kept the cancel it got while connecting, went on to
route messages, and the process never exited (the CI job of 2026-12-05).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

import structlog

__all__ = ["RECANCEL_AFTER_S", "stop_tasks"]

log = structlog.get_logger("agent.tasks")

# How long a cancelled task has to end before it is cancelled again: long enough for the
# cleanup a cancellation starts (a goodbye publish and a DISCONNECT take milliseconds on a
# live link), short enough that a swallowed cancel costs a stopping service one second.
RECANCEL_AFTER_S = 1.0


async def stop_tasks(
    tasks: Iterable[asyncio.Future[Any]], *, recancel_after_s: float = RECANCEL_AFTER_S
) -> None:
    """Cancel the tasks and wait until every one has ended, cancelling again any that is still
    running `recancel_after_s` after its last cancel (it swallowed the cancellation).

    A task that ended with an error other than cancellation raises it here, the first such
    task in the given order, as `await task` would.
    """
    tasks = list(tasks)
    running = {task for task in tasks if not task.done()}
    while running:
        for task in running:
            task.cancel()
        _, running = await asyncio.wait(running, timeout=recancel_after_s)
        for task in running:
            log.info("task.cancel_ignored", task=_name(task), again_in_s=recancel_after_s)
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            task.result()


def _name(task: asyncio.Future[Any]) -> str:
    return task.get_name() if isinstance(task, asyncio.Task) else repr(task)
