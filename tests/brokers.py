"""Real MQTT brokers for tests: Mosquitto in a subprocess (`connectors.mosquitto`), RabbitMQ
with its MQTT plugin in a subprocess (a node of the test's own), amqtt in-process, and a
throwaway PKI for TLS tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
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
    "find_rabbitmq_server",
    "free_port",
    "generate_test_pki",
    "rabbitmq_mqtt_broker",
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


RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # Debian's; /usr/sbin's runs `su`
RABBITMQ_START_S = 90.0  # a node boots in ~15 s on a busy 2-core machine
RABBITMQ_STOP_S = 30.0


def find_rabbitmq_server() -> str | None:
    """The rabbitmq-server script that starts a node as the calling user, or None.

    Debian's /usr/sbin/rabbitmq-server switches to the `rabbitmq` user (and its node, cookie
    and directories); the script it wraps honours the RABBITMQ_* variables as it is.
    """
    if Path(RABBITMQ_SERVER).is_file():
        return RABBITMQ_SERVER
    found = shutil.which("rabbitmq-server")
    if found is None:
        return None
    return None if Path(found).resolve().parent == Path("/usr/sbin") else found


@contextlib.contextmanager
def rabbitmq_mqtt_broker(workdir: Path, timeout_s: float = RABBITMQ_START_S) -> Iterator[str]:
    """A RabbitMQ node of this test's own, with the MQTT plugin on a free 127.0.0.1 port;
    yields its MQTT URL (``mqtt://guest:guest@127.0.0.1:PORT``) and stops the node after.

    Nothing is shared with a RabbitMQ already on the machine: its own node name, AMQP,
    distribution and epmd ports, directories (data, logs, enabled plugins, config) and
    Erlang cookie (HOME is the work folder); the management plugin stays off.

    Raises:
        FileNotFoundError: rabbitmq-server is not installed (callers skip).
        TimeoutError: the MQTT listener did not open within `timeout_s` (the log's tail says why).
    """
    server = find_rabbitmq_server()
    if server is None:
        raise FileNotFoundError("rabbitmq-server is not installed")
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    mqtt, amqp, dist, epmd = (free_port() for _ in range(4))
    plugins = workdir / "enabled_plugins"
    plugins.write_text("[rabbitmq_mqtt].\n")
    config = workdir / "rabbitmq.conf"
    config.write_text(
        f"listeners.tcp.1 = {HOST}:{amqp}\n"
        f"mqtt.listeners.tcp.1 = {HOST}:{mqtt}\n"
        "mqtt.allow_anonymous = true\n"
        "loopback_users = none\n"
    )
    env_file = workdir / "rabbitmq-env.conf"  # instead of the machine's /etc/rabbitmq one
    env_file.write_text("")
    env = os.environ | {
        "HOME": str(home),  # the Erlang cookie is made here
        "RABBITMQ_CONF_ENV_FILE": str(env_file),
        "RABBITMQ_NODENAME": f"cbo-test-{os.getpid()}-{mqtt}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": HOST,
        "RABBITMQ_NODE_PORT": str(amqp),
        "RABBITMQ_DIST_PORT": str(dist),
        "ERL_EPMD_ADDRESS": HOST,
        "ERL_EPMD_PORT": str(epmd),  # an epmd of its own, stopped with the node
        "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(workdir / "log"),
        "RABBITMQ_LOGS": "-",
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
        "RABBITMQ_CONFIG_FILE": str(config),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
        "RABBITMQ_PID_FILE": str(workdir / "rabbitmq.pid"),
    }
    log_path = workdir / "rabbitmq.log"
    with log_path.open("wb") as log:
        node = subprocess.Popen(
            [server],
            env=env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the node and what it starts
        )
    try:
        try:
            wait_for_port(mqtt, timeout_s, alive=lambda: node.poll() is None)
        except (TimeoutError, RuntimeError) as error:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise TimeoutError(f"RabbitMQ's MQTT listener did not open: {error}\n{tail}") from None
        yield f"mqtt://guest:guest@{HOST}:{mqtt}"
    finally:
        _stop_group(node)
        epmd_tool = shutil.which("epmd")
        if epmd_tool is not None:  # the epmd the node started on its own port
            subprocess.run(
                [epmd_tool, "-kill"],
                env=env,
                capture_output=True,
                timeout=RABBITMQ_STOP_S,
                check=False,
            )


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group (beam stops cleanly on it), SIGKILL what is left after."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + RABBITMQ_STOP_S
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=RABBITMQ_STOP_S)
