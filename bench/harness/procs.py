"""The moving parts of `cbo-agent bench chaos` and the fault tests: CLI subprocesses and their logs.

`Child` runs one `cbo-agent` command (the agent, the simulator device) as a subprocess of its own,
logging JSON lines to a file, and can be killed with SIGKILL, paused (SIGSTOP) and resumed.
`JsonLog` reads such a file incrementally and waits, with a timeout, for an event. `Cluster`
puts a Mosquitto with persistence, one device and successive lives of the agent in one working
directory, and stops whatever it started; with ``via_proxy`` the agent reaches the broker through
a `TcpProxy` whose connections the harness can cut; with ``logins`` the broker runs the shipped
ACL (deploy/mosquitto/acl) with a password per user, made by deploy/mosquitto/make-passwd.sh:
the agent, the device (its id), and the extra device logins asked for (a forger, a flooder).
Everything listens on and connects to 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.paths import example_spec
from bench.harness.tcp_proxy import TcpProxy
from connectors.mosquitto import MosquittoBroker, MosquittoOptions

__all__ = [
    "AGENT_ID",
    "DEVICE_ID",
    "EXPERIMENT",
    "Child",
    "ChildDied",
    "Cluster",
    "DeviceOptions",
    "JsonLog",
    "child_environment",
    "cli",
    "distinct_rounds",
    "round_cost",
    "wait_until",
    "write_spec",
]

Event = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "chaos"
AGENT_ID = "chaos-agent"
DEVICE_ID = f"sim-{EXPERIMENT}"  # the simulator's default id: the spec's default device
ACL = ROOT / "deploy" / "mosquitto" / "acl"
MAKE_PASSWD = ROOT / "deploy" / "mosquitto" / "make-passwd.sh"
STOP_S = 10.0
# Save the broker's state after every change (not once a second): a broker killed with SIGKILL
# then loses at most the message it was handling, which keeps "readings lost" about the agent.
SHIPPED_BROKER_CONF = ROOT / "deploy" / "mosquitto" / "mosquitto.conf"
_SHIPPED_LIMITS = ("max_inflight_messages", "max_queued_messages", "max_queued_bytes")


def shipped_broker_limits() -> tuple[str, ...]:
    """The in-flight and queue limits of the shipped broker configuration, as its lines: a
    benchmark measures the broker as shipped (with Mosquitto's defaults, 1,000 queued messages
    per session, a flood beside a dead agent pushes its real readings out)."""
    lines = SHIPPED_BROKER_CONF.read_text().splitlines()
    return tuple(line.strip() for line in lines if line.split(" ", 1)[0] in _SHIPPED_LIMITS)


def durable_broker_lines() -> tuple[str, ...]:
    """The chaos broker's lines: saved after every change, with the shipped limits. Read when a
    cluster is made, not at import: an installed package (the image) has no deploy/ beside it."""
    return ("autosave_on_changes true", "autosave_interval 1", *shipped_broker_limits())


class ChildDied(RuntimeError):
    """A subprocess exited while we were waiting for it to do something."""


class JsonLog:
    """The JSON-lines log of one process, read as it grows (non-JSON lines are kept aside)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[Event] = []
        self.other: list[str] = []
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[Event]:
        """Read what was appended since the last call; return the new events."""
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                chunk = file.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # an incomplete last line waits for its newline
        fresh = []
        for raw in lines:
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            try:
                event = json.loads(text)
            except ValueError:
                self.other.append(text)
                continue
            if isinstance(event, dict) and "event" in event:
                fresh.append(event)
            else:
                self.other.append(text)
        self.events += fresh
        return fresh

    def named(self, name: str, **fields: Any) -> list[Event]:
        self.poll()
        return [e for e in self.events if e["event"] == name and _matches(e, fields)]

    def wait_for(
        self,
        name: str,
        timeout_s: float,
        *,
        since: int = 0,
        child: Child | None = None,
        poll_s: float = 0.003,
        **fields: Any,
    ) -> Event:
        """The first event `name` (with these field values) at index >= `since`.

        Raises:
            TimeoutError: none within `timeout_s` (the message shows the log's tail).
            ChildDied: `child` exited first.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            for event in self.events[since:]:
                if event["event"] == name and _matches(event, fields):
                    return event
            if child is not None and not child.alive:
                self.poll()
                raise ChildDied(f"{child.name} exited (code {child.returncode}) before {name}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no {name} {fields or ''} within {timeout_s} s\n{self.tail()}")
            time.sleep(poll_s)

    def tail(self, lines: int = 15) -> str:
        text = self.path.read_text(errors="replace") if self.path.exists() else ""
        return f"--- {self.path.name} ---\n" + "\n".join(text.splitlines()[-lines:])


def _matches(event: Event, fields: dict[str, Any]) -> bool:
    return all(event.get(key) == value for key, value in fields.items())


class Child:
    """One `cbo-agent` subprocess in its own session; stdout and stderr go to `log_path`."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log = JsonLog(log_path)
        self.started_at = time.time()
        with log_path.open("ab") as file:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        """SIGKILL (a crash: no finally blocks, no goodbye to the broker) and reap it."""
        if self.alive:
            self.popen.send_signal(signal.SIGCONT)  # a paused process dies just the same
            self.popen.kill()
        self.popen.wait(timeout=STOP_S)

    def dump_stacks(self) -> None:
        """SIGUSR1: the process prints every thread's stack to its log (`agent.cli`) and goes on."""
        if self.alive:
            self.popen.send_signal(signal.SIGUSR1)
            time.sleep(0.5)

    def pause(self) -> None:
        self.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.popen.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM (a clean stop), then SIGKILL if it does not go."""
        if not self.alive:
            return
        self.popen.send_signal(signal.SIGCONT)
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def wait(self, timeout_s: float) -> int:
        """Wait for a normal exit; TimeoutError (the process keeps running) after `timeout_s`."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"{self.name} still running after {timeout_s} s\n{self.log.tail()}"
            ) from None


def child_environment() -> dict[str, str]:
    """The caller's environment without CBO_* settings, one thread per process, unbuffered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CBO_")}
    return env | {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def cli() -> list[str]:
    """How to run `cbo-agent` with this interpreter (no installed script needed)."""
    return [sys.executable, "-m", "agent.cli", "--log-format", "json"]


def write_spec(
    path: Path,
    *,
    env: str = "dropwave",
    rounds: int,
    budget_total: float | None,
    ack_timeout_s: float = 2.0,
    ack_retries: int = 3,
    round_timeout_s: float = 2.0,
    policy: str = "random",
    name: str = EXPERIMENT,
) -> dict[str, Any]:
    """The example spec of `env`, renamed, with a quick policy, short timeouts and a budget."""
    spec = yaml.safe_load(example_spec(env).read_text())
    spec["name"] = name
    settings = {"max_seconds": 0.5} if policy in ("mcbo", "eifn", "gpucb", "dgpucb") else {}
    spec["policy"] = {"name": policy, "settings": settings}
    spec["schedule"] = {
        "max_rounds": rounds,
        "ack_timeout_s": ack_timeout_s,
        "ack_retries": ack_retries,
        "round_timeout_s": round_timeout_s,
    }
    spec["constraints"] = {} if budget_total is None else {"budget_total": budget_total}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return spec


def round_cost(spec: dict[str, Any]) -> float:
    """The cost of a round that uses every action (what the random policy does on soft specs)."""
    return float(sum(action.get("cost", 0.0) for action in spec["actions"]))


@dataclass
class DeviceOptions:
    delay_s: float = 0.1
    jitter_s: float = 0.2
    drop_rate: float = 0.0
    duplicate_rate: float = 0.0
    seed: int = 0


@dataclass
class Cluster:
    """A Mosquitto with persistence, a simulator device and successive agent lives.

    Every life of the agent runs the same spec, store and client id (so the same persistent
    session) and logs to its own file, ``agent-<n>.log``. With `via_proxy` every life connects
    through `proxy` (a `TcpProxy` in front of the broker), so that `proxy.cut()` severs the
    agent's connection while the broker and the device stay up.
    """

    workdir: Path
    spec_path: Path
    env: str = "dropwave"
    device_options: DeviceOptions = field(default_factory=DeviceOptions)
    broker_lines: tuple[str, ...] = field(default_factory=durable_broker_lines)
    via_proxy: bool = False
    logins: tuple[str, ...] | None = None  # extra device logins; None: an anonymous broker
    agent_lives: list[Child] = field(default_factory=list)
    device: Child | None = None
    _environ: dict[str, str] = field(default_factory=child_environment)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.store_path = self.workdir / "agent.sqlite"
        self.passwords: dict[str, str] = {}
        options = MosquittoOptions(
            persistence_dir=self.workdir / "mosquitto-data", extra_lines=self.broker_lines
        )
        if self.logins is not None:
            passwd = self.workdir / "passwd"
            self.passwords = write_passwords(passwd, (DEVICE_ID, *self.logins))
            options = MosquittoOptions(
                allow_anonymous=False,
                password_file=passwd,
                acl_file=ACL,
                persistence_dir=options.persistence_dir,
                extra_lines=self.broker_lines,
            )
        self.broker = MosquittoBroker(self.workdir / "mosquitto", options)
        self.proxy: TcpProxy | None = None
        if self.via_proxy:
            self.proxy = TcpProxy(self.broker.port)
            self.proxy.start()

    # ------------------------------------------------------------------ processes
    def start_broker(self) -> None:
        self.broker.start(timeout_s=10.0)

    def start_device(self, timeout_s: float = 60.0) -> Child:
        """Start the simulator device and wait until it is subscribed (if the broker is up)."""
        options = self.device_options
        argv = [
            *cli(),
            "sim",
            self.env,
            "--experiment",
            EXPERIMENT,
            "--broker",
            self.broker.url,
            "--delay",
            str(options.delay_s),
            "--jitter",
            str(options.jitter_s),
            "--drop-rate",
            str(options.drop_rate),
            "--duplicate-rate",
            str(options.duplicate_rate),
            "--seed",
            str(options.seed),
        ]
        if self.passwords:  # from a file, as a deployment would: never on the command line
            password_file = self.workdir / "device.password"
            password_file.write_text(self.passwords[DEVICE_ID] + "\n")
            password_file.chmod(0o600)
            argv += ["--username", DEVICE_ID, "--password-file", str(password_file)]
        self.device = Child("device", argv, self.workdir / "device.log", self._environ)
        if self.broker.running:
            self.device.log.wait_for("device.subscribed", timeout_s, child=self.device)
        return self.device

    def start_agent(self) -> Child:
        """Start the next life of the agent (it recovers from the store by itself)."""
        if self.agent is not None and self.agent.alive:
            raise RuntimeError("the previous life of the agent is still running")
        argv = [
            *cli(),
            "run",
            str(self.spec_path),
            "--store",
            str(self.store_path),
            "--broker",
            self.agent_broker_url,
            "--agent-id",
            AGENT_ID,
            "--metrics-port",
            "0",
        ]
        life = len(self.agent_lives)
        environ = self._environ
        if self.passwords:  # as in a deployment: credentials in the environment
            environ = environ | {
                "CBO_BROKER_USERNAME": "agent",
                "CBO_BROKER_PASSWORD": self.passwords["agent"],
            }
        child = Child(f"agent-{life}", argv, self.workdir / f"agent-{life}.log", environ)
        self.agent_lives.append(child)
        return child

    @property
    def agent(self) -> Child | None:
        return self.agent_lives[-1] if self.agent_lives else None

    @property
    def agent_broker_url(self) -> str:
        """Where the agent connects: the proxy when there is one, else the broker."""
        return self.proxy.url if self.proxy is not None else self.broker.url

    def metrics_url(self, life: Child, timeout_s: float) -> str:
        """Base URL of a life's /metrics (it binds a free port and logs which)."""
        event = life.log.wait_for("metrics.serving", timeout_s, child=life)
        return f"http://127.0.0.1:{int(event['port'])}"

    def close(self) -> None:
        """Stop everything this cluster started (agent, device, broker); idempotent."""
        for life in self.agent_lives:
            if life.alive:
                life.kill()
        if self.device is not None:
            self.device.stop()
        if self.proxy is not None:
            self.proxy.close()
        self.broker.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ logs
    def agent_events(self, name: str, **fields: Any) -> list[Event]:
        """Events `name` of every agent life, oldest life first."""
        return [e for life in self.agent_lives for e in life.log.named(name, **fields)]

    def device_events(self) -> list[Event]:
        assert self.device is not None
        self.device.log.poll()
        return list(self.device.log.events)

    def tails(self) -> str:
        parts = [life.log.tail() for life in self.agent_lives[-2:]]
        if self.device is not None:
            parts.append(self.device.log.tail())
        parts.append("--- mosquitto ---\n" + self.broker.log_tail(10))
        return "\n".join(parts)


def write_passwords(path: Path, devices: Iterable[str]) -> dict[str, str]:
    """Mosquitto's password file for the agent, the monitor, the operator and `devices` (each
    its own login, its device id), by the deployment's own script; returns user -> password."""
    devices = list(devices)
    users = ("agent", "monitor", "operator", *devices)
    passwords = {user: secrets.token_urlsafe(12) for user in users}
    extra = path.with_name(path.name + ".devices")
    extra.write_text("".join(f"{device} {passwords[device]}\n" for device in devices[1:]))
    environ = {
        "PATH": os.environ["PATH"],
        "MQTT_AGENT_PASSWORD": passwords["agent"],
        "MQTT_MONITOR_PASSWORD": passwords["monitor"],
        "MQTT_OPERATOR_PASSWORD": passwords["operator"],
        "MQTT_DEVICE_USER": devices[0],
        "MQTT_DEVICE_PASSWORD": passwords[devices[0]],
        "MQTT_DEVICES_FILE": str(extra),
    }
    subprocess.run(
        ["sh", str(MAKE_PASSWD), str(path)], env=environ, check=True, capture_output=True,
        timeout=60,
    )  # fmt: skip
    return passwords


def wait_until(what: str, check: Callable[[], Any], timeout_s: float, poll_s: float = 0.02) -> Any:
    """Poll `check` until it returns something truthy; TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def distinct_rounds(events: Iterable[Event]) -> set[int]:
    return {int(e["round"]) for e in events if e.get("round") is not None}
