"""Many simulated devices in one process: `python -m bench.harness.devices`, for fleet runs.

A fleet benchmark or test needs one device per experiment; a process each (torch imported each
time) would cost more than the agents under test. This runs one `SimulatorDevice` per
experiment named, all on one event loop, each with its own MQTT connection, and logs JSON lines:
``device.ack_published`` (status applied: an action applied), ``device.reading_published``,
``device.action_stale_epoch`` — the evidence the fleet audit (`bench.fleet`) reads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from agent.logs import configure_logging
from agent.tasks import stop_tasks
from connectors.mqtt import Backoff, BrokerConfig
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment


async def serve(
    broker_url: str, env: str, experiments: list[str], delay_s: float, jitter_s: float
) -> None:
    """Run a device for each experiment until cancelled."""
    broker = BrokerConfig.from_url(broker_url, timeout_s=10.0)
    backoff = Backoff(base_s=0.05, cap_s=0.5, stable_after_s=1.0)
    devices = [
        SimulatorDevice(
            make_environment(env, 0),
            broker,
            DeviceSettings(
                experiment=name,
                delay_s=delay_s,
                jitter_s=jitter_s,
                seed=i,
                publish_oracle=False,
                max_in_flight=8,
            ),
            backoff=backoff,
        )
        for i, name in enumerate(experiments)
    ]
    tasks = [asyncio.create_task(device.run()) for device in devices]
    try:
        await asyncio.gather(*tasks)
    finally:
        with contextlib.suppress(Exception):  # each task ends; a device's error is not ours
            await stop_tasks(tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--broker", required=True)
    parser.add_argument("--env", default="toygraph")
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--jitter", type=float, default=0.05)
    parser.add_argument("experiments", nargs="+")
    args = parser.parse_args()
    configure_logging("info", "json")

    async def until_signalled() -> None:
        task = asyncio.ensure_future(
            serve(args.broker, args.env, args.experiments, args.delay, args.jitter)
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(until_signalled())


if __name__ == "__main__":
    main()
