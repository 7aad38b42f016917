"""`cbo-agent run SPEC...` and `cbo-agent sim ENV`: the long-running processes.

Both stop cleanly on SIGINT or SIGTERM (a container's stop): the service publishes its
retained "offline" status and closes the store; an interrupted round is re-published (same id)
by the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

import structlog

from agent.config import AgentConfig
from agent.runtime import AgentService
from core.spec import SpecError, load_spec

log = structlog.get_logger("agent.serve")


async def _until_signalled(work: Coroutine[Any, Any, None]) -> None:
    """Run `work`, cancelling it on SIGINT/SIGTERM."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        log.info("process.stopping", reason="signal")


def run_service(spec_paths: Sequence[str], config: AgentConfig) -> int:
    """Load specs and serve them until they finish or the process is told to stop."""
    specs = []
    for path in spec_paths:
        try:
            specs.append(load_spec(path))
        except SpecError as error:
            for problem in error.problems:
                print(f"{path}: {problem}", file=sys.stderr)
            return 2
    asyncio.run(_until_signalled(AgentService(config, specs).run()))
    return 0


def run_simulator(env: str, broker_url: str, settings: Any, env_seed: int, **broker: Any) -> int:
    """Run one environment as an MQTT device until stopped."""
    from sim.device import run_device

    asyncio.run(
        _until_signalled(run_device(env, broker_url, settings, env_seed=env_seed, **broker))
    )
    return 0
