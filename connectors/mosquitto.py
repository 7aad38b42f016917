"""A local Mosquitto in a subprocess, for tests and benchmarks (production runs its own).

It listens on 127.0.0.1 only, on a port picked free at first start and kept across restarts (so
clients can reconnect to the same address). Every wait is bounded. `MosquittoOptions` covers what
tests and benchmarks configure: a password file, an ACL file, a TLS listener, persistence, and
extra configuration lines.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

HOST = "127.0.0.1"
MOSQUITTO_PATHS = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


def find_mosquitto() -> str | None:
    """Path of the mosquitto executable, or None if it is not installed."""
    for candidate in MOSQUITTO_PATHS:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("mosquitto")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Block until 127.0.0.1:`port` accepts TCP connections; TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"server on port {port} exited before accepting connections")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing accepted connections on {HOST}:{port} within {timeout_s} s")


@dataclass(frozen=True)
class TlsListener:
    """A second, TLS listener; the files come from a CA the test generates."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    require_certificate: bool = False


@dataclass(frozen=True)
class MosquittoOptions:
    """What the test wants from the broker beyond a plain anonymous listener."""

    allow_anonymous: bool = True
    password_file: Path | None = None
    acl_file: Path | None = None
    tls: TlsListener | None = None
    persistence_dir: Path | None = None
    # With persistence: save the in-memory database after this many seconds, or — where
    # `extra_lines` say ``autosave_on_changes true`` — after this many changes. 1: after
    # every change, so a broker killed in a test loses nothing it acknowledged.
    autosave_interval: int = 1
    extra_lines: tuple[str, ...] = field(default_factory=tuple)


class MosquittoBroker:
    """A Mosquitto subprocess with a generated configuration; a context manager."""

    def __init__(
        self,
        workdir: Path,
        options: MosquittoOptions | None = None,
        executable: str | None = None,
    ) -> None:
        executable = executable or find_mosquitto()
        if executable is None:
            raise FileNotFoundError("mosquitto is not installed")
        self.executable = executable
        self.options = options or MosquittoOptions()
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf_path = workdir / "mosquitto.conf"
        self.log_path = workdir / "mosquitto.log"
        self.host = HOST
        self.port = free_port()
        self.tls_port = free_port() if self.options.tls else None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:<port>`` of the plain listener."""
        return f"mqtt://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 5.0) -> None:
        """Start the broker and wait until every listener accepts connections."""
        if self.running:
            raise RuntimeError("mosquitto is already running")
        self.conf_path.write_text(self._render_config())
        with self.log_path.open("ab") as log_file:
            self._process = subprocess.Popen(
                [self.executable, "-c", str(self.conf_path)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        try:
            for port in (self.port, self.tls_port):
                if port is not None:
                    wait_for_port(port, timeout_s, alive=lambda: self.running)
        except (RuntimeError, TimeoutError) as error:
            self.stop()
            raise RuntimeError(f"mosquitto did not start: {error}\n{self.log_tail()}") from None

    def stop(self, timeout_s: float = 5.0, *, graceful: bool = True) -> None:
        """Stop the broker: SIGTERM (or SIGKILL, to simulate a crash), then wait."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)

    def restart(self, timeout_s: float = 5.0, *, graceful: bool = True) -> None:
        """Stop and start again on the same ports."""
        self.stop(timeout_s, graceful=graceful)
        self.start(timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker's log, for failure messages."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _render_config(self) -> str:
        options = self.options
        lines = [
            "# generated by connectors/mosquitto.py",
            # Running as root, mosquitto drops to user "mosquitto", which cannot write the
            # test's directories; staying the current user is harmless otherwise.
            f"user {pwd.getpwuid(os.getuid()).pw_name}",
            "per_listener_settings false",
            f"allow_anonymous {str(options.allow_anonymous).lower()}",
            "log_dest stdout",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "connection_messages true",
            "log_timestamp true",
        ]
        if options.password_file is not None:
            lines.append(f"password_file {options.password_file}")
        if options.acl_file is not None:
            lines.append(f"acl_file {options.acl_file}")
        lines += self._persistence_lines()
        lines += list(options.extra_lines)
        lines.append(f"listener {self.port} {self.host}")
        lines += self._tls_lines()
        return "\n".join(lines) + "\n"

    def _persistence_lines(self) -> list[str]:
        directory = self.options.persistence_dir
        if directory is None:
            return ["persistence false"]
        directory.mkdir(parents=True, exist_ok=True)
        return [
            "persistence true",
            f"persistence_location {directory}/",
            f"autosave_interval {self.options.autosave_interval}",
        ]

    def _tls_lines(self) -> list[str]:
        tls = self.options.tls
        if tls is None:
            return []
        # Listener-scoped settings: they must follow their `listener` line.
        return [
            f"listener {self.tls_port} {self.host}",
            f"cafile {tls.ca_file}",
            f"certfile {tls.cert_file}",
            f"keyfile {tls.key_file}",
            f"require_certificate {str(tls.require_certificate).lower()}",
        ]
