"""An embedded MQTT broker (amqtt, MQTT 3.1.1) for the demo: no Mosquitto needed on a laptop.

Production uses Mosquitto; this broker only exists so `cbo-agent demo` runs anywhere Python
does. It listens on loopback only.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog

log = structlog.get_logger(__name__)


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@asynccontextmanager
async def embedded_broker(port: int | None = None, timeout_s: float = 10.0) -> AsyncIterator[int]:
    """Run amqtt's broker in this event loop on 127.0.0.1; yields the port it listens on."""
    from amqtt.broker import Broker  # heavy import, only when a broker is wanted

    port = port or free_loopback_port()
    broker = Broker(
        {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
    )
    # amqtt logs every client hiccup at WARNING through the standard library; the demo's own
    # logs say what matters.
    logging.getLogger("amqtt").setLevel(logging.ERROR)
    await asyncio.wait_for(broker.start(), timeout_s)  # returns once the listener is bound
    try:
        log.info("embedded_broker.started", host="127.0.0.1", port=port)
        yield port
    finally:
        await asyncio.wait_for(broker.shutdown(), timeout_s)
        log.info("embedded_broker.stopped", port=port)
