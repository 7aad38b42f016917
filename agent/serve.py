"""`cbo-agent run SPEC...` and `cbo-agent sim ENV`: the long-running processes.

Both stop cleanly on SIGINT or SIGTERM (a container's stop): the service publishes its
retained "offline" status and closes the store; an interrupted round is re-published (same id)
by the next start.

When every experiment has finished (round limit or budget), the service exits 0 — or, with
`keep_serving` (`--keep-serving`, CBO_KEEP_SERVING), stays up until it is signalled: /metrics
keeps the final values, /healthz and /readyz keep answering, the broker session stays open and
late feedback is still stored. It reports the end as the log event `agent.finished` and the
gauge `cbo_experiment_finished{experiment}` (0 while running, 1 once finished).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine, Sequence
from typing import Any

import structlog

from agent.config import AgentConfig
from agent.experiment import Experiment
from agent.fatal import report_fatal
from agent.runtime import AgentService
from connectors.mqtt import BrokerConfig, tls_context
from core.spec import ExperimentSpec

log = structlog.get_logger(__name__)


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


class ServedAgent(AgentService):
    """The service as `cbo-agent run` runs it: reports finished experiments, may stay up.

    Args:
        config: where and as whom to run; `config.keep_serving` keeps the process up (serving
            metrics, health and the broker session) after every experiment has finished.
        specs: the experiments.
    """

    def __init__(self, config: AgentConfig, specs: Sequence[ExperimentSpec]) -> None:
        super().__init__(config, specs)
        self.keep_serving = config.keep_serving
        self.done: set[str] = set()

    async def _driver(self, exp: Experiment) -> None:
        # `_driver`, not `_drive`: "agent.finished" is the agent's event, not the experiment's
        await super()._driver(exp)  # returns once the experiment has finished
        self.done.add(exp.name)
        if self.done == set(self.experiments):
            log.info(
                "agent.finished",
                experiments=sorted(self.done),
                keep_serving=self.keep_serving,
                next="serving until stopped" if self.keep_serving else "exiting",
            )
        if self.keep_serving:
            await self._serve_finished(exp)

    async def _serve_finished(self, exp: Experiment) -> None:
        """Keep draining a finished experiment's input: late readings are stored and still
        teach the model, anything else is rejected with a reason, and every message is
        acknowledged (unacknowledged ones would fill the broker's in-flight window)."""
        inbox = self._inboxes[exp.name]
        with structlog.contextvars.bound_contextvars(experiment=exp.name):
            while True:
                batch = await self._next_batch(inbox, None)
                await self._handle(exp, batch)


def run_service(specs: Sequence[ExperimentSpec], config: AgentConfig) -> int:
    """Serve the (checked) specs until they finish (or, with keep_serving, until signalled).

    Returns 0 when done or stopped; on a fault it cannot go on from (no broker session within
    `broker.connect_timeout_s`, a store that cannot be written, a metrics port in use, TLS
    files that cannot be used) one `agent.fatal` event and a non-zero exit (`agent.fatal`).
    """
    try:
        tls_context(config.broker.to_broker_config(client_id="check"))
        asyncio.run(_until_signalled(ServedAgent(config, specs).run()))
    except Exception as error:
        return report_fatal("run", error)
    return 0


def run_simulator(env: str, broker: BrokerConfig, settings: Any, env_seed: int) -> int:
    """Run one environment as an MQTT device until stopped."""
    from sim.device import SimulatorDevice
    from sim.errors import StatesNotRecorded
    from sim.registry import make_environment

    # Before the fault handler: an environment whose optional extra is missing, or
    # `--send-states` for one that records no states, is the user's to fix, one line and exit
    # 2 (agent.cli), not an `agent.fatal` internal error.
    environment = make_environment(env, env_seed)
    if getattr(settings, "send_states", False) and not getattr(
        environment, "records_states", False
    ):
        raise StatesNotRecorded(env)
    try:
        tls_context(broker)
        device = SimulatorDevice(environment, broker, settings)
        asyncio.run(_until_signalled(device.run()))
    except Exception as error:
        return report_fatal("sim", error)
    return 0
