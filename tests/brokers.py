"""Real MQTT brokers for tests: Mosquitto in a subprocess (`connectors.mosquitto`), amqtt
in-process, and a throwaway PKI for TLS tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from connectors.mosquitto import (
    HOST,
    MosquittoBroker,
    MosquittoOptions,
    TlsListener,
    find_mosquitto,
    free_port,
    wait_for_port,
)

__all__ = [
    "HOST",
    "MosquittoBroker",
    "MosquittoOptions",
    "TlsListener",
    "amqtt_broker",
    "find_mosquitto",
    "free_port",
    "generate_test_pki",
    "shipped_limits",
    "wait_for_port",
]


SHIPPED_CONF = Path(__file__).resolve().parents[1] / "deploy" / "mosquitto" / "mosquitto.conf"


def shipped_limits() -> tuple[str, ...]:
    """The queue and in-flight lines (`max_*`) of the shipped deploy/mosquitto/mosquitto.conf,
    for a test broker that must behave as the deployment's does under load."""
    lines = SHIPPED_CONF.read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip().startswith("max_"))


def generate_test_pki(directory: Path, timeout_s: float = 10.0) -> TlsListener:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI.

    Raises FileNotFoundError if openssl is not installed (callers skip).
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("openssl is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, request, cert = (
        directory / "server.key",
        directory / "server.csr",
        directory / "server.crt",
    )
    extensions = directory / "server.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    ec_key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ca_extensions = (
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
    )
    commands = [
        (openssl, "req", "-x509", *ec_key, "-keyout", ca_key, "-out", ca_cert, "-days", "1",
         "-subj", "/CN=cbo-test-ca", *ca_extensions),
        (openssl, "req", *ec_key, "-keyout", key, "-out", request, "-subj", "/CN=127.0.0.1"),
        (openssl, "x509", "-req", "-in", request, "-CA", ca_cert, "-CAkey", ca_key,
         "-CAcreateserial", "-out", cert, "-days", "1", "-extfile", extensions),
    ]  # fmt: skip
    for command in commands:
        subprocess.run(
            [str(part) for part in command], check=True, capture_output=True, timeout=timeout_s
        )
    return TlsListener(ca_file=ca_cert, cert_file=cert, key_file=key)


@contextlib.asynccontextmanager
async def amqtt_broker(
    plugins: dict[str, dict[str, Any]] | None = None, timeout_s: float = 5.0
) -> AsyncIterator[int]:
    """Run amqtt's broker (MQTT 3.1.1 only) in this event loop; yields its port.

    `plugins` adds amqtt plugins (dotted class path -> options) to anonymous authentication.
    """
    from amqtt.broker import Broker  # imported here: only a few tests need it

    port = free_port()
    anonymous = {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}}
    broker = Broker(
        {
            "listeners": {"default": {"type": "tcp", "bind": f"{HOST}:{port}"}},
            "plugins": anonymous | (plugins or {}),
        }
    )
    await asyncio.wait_for(broker.start(), timeout_s)
    try:
        await asyncio.to_thread(wait_for_port, port, timeout_s)
        yield port
    finally:
        await asyncio.wait_for(broker.shutdown(), timeout_s)
