"""Security: credentials and TLS to the broker, the example ACL, clamping, rate limiting, no pickle.

The broker tests configure a Mosquitto of their own (never the machine's) with a password file
made by deploy/mosquitto/make-passwd.sh, the ACL shipped in deploy/mosquitto/acl and a TLS
listener whose CA the test generates (`tests.brokers.generate_test_pki`). The agent is configured
as in a deployment, through `CBO_BROKER_*` variables; the simulator device as `cbo-agent sim`
configures it (`sim.device.run_device` with username, password and CA file).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import itertools
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.config import load_config
from agent.experiment import Experiment
from agent.runtime import AgentService
from connectors.metrics import AgentMetrics
from connectors.mqtt import BrokerConfig, MqttConnection, MqttConnectionError
from connectors.schemas import Action, Reading, decode, encode
from connectors.store import Store
from connectors.topics import Topics
from core.spec import ExperimentSpec, load_spec
from policies.base import Proposal
from sim.device import DeviceSettings, SimulatorDevice, run_device
from sim.registry import make_environment
from tests.brokers import MosquittoOptions, TlsListener, generate_test_pki

ROOT = Path(__file__).resolve().parents[1]
ACL = ROOT / "deploy" / "mosquitto" / "acl"
MAKE_PASSWD = ROOT / "deploy" / "mosquitto" / "make-passwd.sh"
WAIT_S = 60.0
# Mosquitto 2.0 answers a bad password or an unknown user with CONNACK 135 (not 134)
REFUSED = "connection refused by broker: [135] [code:135] Not authorized"
topics = Topics()


def fast_spec(name: str, rounds: int, **schedule: float) -> ExperimentSpec:
    spec = load_spec(ROOT / "examples" / "dropwave.yaml")
    return spec.model_copy(
        update={
            "name": name,
            "policy": spec.policy.model_copy(update={"name": "random", "settings": {}}),
            "schedule": spec.schedule.model_copy(
                update={
                    "max_rounds": rounds,
                    "ack_timeout_s": 2.0,
                    "round_timeout_s": 2.0,
                    **schedule,
                }
            ),
        }
    )


@dataclass
class SecureBroker:
    port: int
    tls_port: int | None
    pki: TlsListener | None
    passwords: dict[str, str]
    log_tail: Callable[[int], str]
    stop: Callable[[], None]

    def url(self, tls: bool = False) -> str:
        return f"mqtts://127.0.0.1:{self.tls_port}" if tls else f"mqtt://127.0.0.1:{self.port}"

    def config(self, user: str | None, password: str | None = None, **extra) -> BrokerConfig:
        credentials = {} if user is None else {"username": user}
        if user is not None:
            credentials["password"] = self.passwords.get(user, "") if password is None else password
        return BrokerConfig(port=self.port, timeout_s=5.0, protocol="5", **credentials, **extra)


DEVICES = ("sim-secure", "sim-acl", "forger")  # the devices' logins are their device ids


def make_passwords(directory: Path) -> tuple[Path, dict[str, str]]:
    """The deployment's users by its own script: agent, monitor and the devices (the first
    through MQTT_DEVICE_USER, the others through MQTT_DEVICES_FILE); plus a stranger, a valid
    login that is in no spec (the ACL's patterns grant it only its own device topics)."""
    if shutil.which("mosquitto_passwd") is None:
        pytest.skip("mosquitto_passwd is not installed (Debian: mosquitto)")
    passwords = {
        user: secrets.token_urlsafe(12) for user in ("agent", "monitor", "operator", *DEVICES)
    }
    passwd = directory / "passwd"
    devices_file = directory / "devices"
    devices_file.write_text("".join(f"{d} {passwords[d]}\n" for d in DEVICES[1:]))
    env = {
        "PATH": os.environ["PATH"],
        "MQTT_AGENT_PASSWORD": passwords["agent"],
        "MQTT_MONITOR_PASSWORD": passwords["monitor"],
        "MQTT_OPERATOR_PASSWORD": passwords["operator"],
        "MQTT_DEVICE_USER": DEVICES[0],
        "MQTT_DEVICE_PASSWORD": passwords[DEVICES[0]],
        "MQTT_DEVICES_FILE": str(devices_file),
    }
    subprocess.run(["sh", str(MAKE_PASSWD), str(passwd)], env=env, check=True, timeout=30)
    passwords["stranger"] = secrets.token_urlsafe(12)
    subprocess.run(
        ["mosquitto_passwd", "-b", str(passwd), "stranger", passwords["stranger"]],
        check=True,
        timeout=30,
    )
    return passwd, passwords


@pytest.fixture
def secure_broker(mosquitto_factory, tmp_path: Path) -> Iterator[SecureBroker]:
    """Mosquitto with no anonymous access, the password file, the example ACL, TLS."""
    try:
        pki = generate_test_pki(tmp_path / "pki")
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    passwd, passwords = make_passwords(tmp_path)
    broker = mosquitto_factory(
        MosquittoOptions(allow_anonymous=False, password_file=passwd, acl_file=ACL, tls=pki)
    )
    yield SecureBroker(broker.port, broker.tls_port, pki, passwords, broker.log_tail, broker.stop)


def connected_clients(log: str) -> dict[str, tuple[str, int]]:
    """Client id -> (user, listener port) of every client that got in, from Mosquitto's log."""
    ports = dict(re.findall(r"New connection from (\S+) on port (\d+)\.", log))
    clients = re.findall(r"New client connected from (\S+) as (\S+) \(.*u'([^']+)'\)", log)
    return {client: (user, int(ports[address])) for address, client, user in clients}


def agent_environment(broker: SecureBroker, store: Path, **changes: str) -> dict[str, str]:
    """The agent configured as in the compose stack and the Kubernetes manifests."""
    assert broker.pki is not None
    return {
        "CBO_AGENT_ID": "secure-agent",
        "CBO_BROKER_URL": broker.url(tls=True),
        "CBO_BROKER_USERNAME": "agent",
        "CBO_BROKER_PASSWORD": broker.passwords["agent"],
        "CBO_BROKER_CA_FILE": str(broker.pki.ca_file),
        "CBO_METRICS_PORT": "0",
        "CBO_STORE_PATH": str(store),
    } | changes


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@contextlib.asynccontextmanager
async def running(coroutine) -> AsyncIterator[asyncio.Task]:
    task = asyncio.create_task(coroutine)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, MqttConnectionError):
            await task


# ------------------------------------------------------------------------ passwords and TLS
@pytest.mark.integration
async def test_agent_and_device_run_rounds_over_tls_with_passwords(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    broker = secure_broker
    assert broker.pki is not None
    config = load_config(environ=agent_environment(broker, tmp_path / "agent.sqlite"))
    link = config.broker.to_broker_config(client_id=config.agent_id)
    assert (link.tls, link.port, link.username) == (True, broker.tls_port, "agent")
    settings = DeviceSettings(experiment="secure", seed=1)
    device = run_device(
        "dropwave",
        broker.url(tls=True),
        settings,
        username="sim-secure",  # the spec's default device of experiment "secure"
        password=broker.passwords["sim-secure"],
        ca_file=str(broker.pki.ca_file),
    )
    async with running(device):
        await asyncio.sleep(0)  # let the device connect first; the agent re-publishes anyway
        service = AgentService(config, [fast_spec("secure", rounds=2)])
        await asyncio.wait_for(service.run(), WAIT_S)
    with Store(tmp_path / "agent.sqlite") as store:
        assert [r.status for r in store.rounds("secure")] == ["closed", "closed"]
        assert len(store.readings("secure")) == 4
    broker.stop()  # Mosquitto writes its log through a buffer: complete once it exits
    clients = connected_clients(broker.log_tail(200))
    assert clients["secure-agent"] == ("agent", broker.tls_port)
    assert sorted(clients.values()) == [
        ("agent", broker.tls_port),
        ("sim-secure", broker.tls_port),
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("changes", "clear_error"),
    [
        ({"CBO_BROKER_PASSWORD": "not-the-password"}, REFUSED),
        ({"CBO_BROKER_USERNAME": "nobody"}, REFUSED),
        ({"CBO_BROKER_CA_FILE": ""}, "CERTIFICATE_VERIFY_FAILED"),  # the system CAs only
    ],
    ids=["wrong-password", "unknown-user", "untrusted-certificate"],
)
async def test_a_refused_agent_says_why_and_never_gets_in(
    secure_broker: SecureBroker, tmp_path: Path, changes: dict[str, str], clear_error: str
) -> None:
    environ = agent_environment(secure_broker, tmp_path / "agent.sqlite", **changes)
    config = load_config(environ=environ)
    service = AgentService(config, [fast_spec("secure", rounds=1)])
    with capture_logs() as events:
        async with running(service.run()):
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline:
                refusals = [e for e in events if e["event"] == "mqtt.reconnect_scheduled"]
                if refusals:
                    break
                await asyncio.sleep(0.05)
            assert not service.link.connected
            assert service.metrics_server is not None
            assert (
                await asyncio.to_thread(http_status, f"{service.metrics_server.url}/readyz") == 503
            )
    assert refusals, [e["event"] for e in events]
    assert clear_error in refusals[0]["error"]
    assert "mqtt.connected" not in [e["event"] for e in events]
    assert "mqtt.protocol_fallback" not in [e["event"] for e in events]


@pytest.mark.integration
async def test_a_device_with_a_wrong_password_is_refused(secure_broker: SecureBroker) -> None:
    config = secure_broker.config("sim-secure", password="guess")
    with pytest.raises(MqttConnectionError, match=r"refused by broker: \[135\].*Not authorized"):
        async with MqttConnection(config):
            pass
    with pytest.raises(MqttConnectionError, match="Not authorized"):
        async with MqttConnection(secure_broker.config(None)):  # anonymous
            pass


# ------------------------------------------------------------------------------------ the ACL
def forged_action(experiment: str) -> Action:
    return Action(
        experiment=experiment,
        round=0,
        action_id="forged" + secrets.token_hex(8),
        intervention={"a0": 0.5, "a1": 0.5},
        kind="soft",
        issued_at=time.time(),
        attempt=1,
    )


async def try_publish(config: BrokerConfig, topic: str, payload: bytes) -> str:
    """Publish as this client; what happened (the broker may refuse, or silently drop)."""
    try:
        async with MqttConnection(config) as connection:
            await connection.publish(topic, payload, qos=1)
    except MqttConnectionError as error:
        return f"refused: {error}"
    return "published"


@pytest.mark.integration
async def test_only_the_agent_can_move_an_actuator(secure_broker: SecureBroker, tmp_path) -> None:
    broker = secure_broker
    device = SimulatorDevice(
        make_environment("dropwave"),
        broker.config("sim-acl", client_id="actuator"),
        DeviceSettings(experiment="acl", seed=1),
    )
    with capture_logs() as events:
        async with running(device.run()):
            await asyncio.wait_for(device.ready.wait(), WAIT_S)
            outcomes = {
                user: await try_publish(
                    broker.config(user),
                    topics.action("acl", "sim-acl"),
                    encode(forged_action("acl")),
                )
                for user in ("forger", "monitor", "stranger", None)
            }
            await asyncio.sleep(1.0)  # time enough for a forged action to arrive, if it could
            assert device.applied == 0
            environ = agent_environment(broker, tmp_path / "agent.sqlite")
            service = AgentService(load_config(environ=environ), [fast_spec("acl", rounds=1)])
            await asyncio.wait_for(service.run(), WAIT_S)
    assert outcomes[None].startswith("refused")  # anonymous: not even connected
    # the others got in and the broker took their PUBLISH; the ACL dropped it on the floor
    assert [outcomes[user] for user in ("forger", "monitor", "stranger")] == ["published"] * 3
    received = [e for e in events if e["event"] == "device.action_received"]
    with Store(tmp_path / "agent.sqlite") as store:
        (round0,) = store.rounds("acl")
    assert [e["action_id"] for e in received] == [round0.action_id]
    assert device.applied == 1 and round0.status == "closed"


@pytest.mark.integration
async def test_no_login_can_publish_on_another_devices_topics(secure_broker: SecureBroker) -> None:
    """The ACL's %u patterns: on sim-acl's reading topic only sim-acl gets through; another
    device, the monitor, a stranger and the agent itself are dropped by the broker."""
    broker = secure_broker
    topic = topics.reading("acl", "sim-acl")

    def reading(device_id: str) -> bytes:
        return encode(
            Reading(
                experiment="acl",
                round=0,
                node="Y",
                value=1.0,
                seq=1,
                device_id=device_id,
                at=time.time(),
            )
        )

    async with MqttConnection(broker.config("agent", client_id="acl-agent")) as agent:
        await agent.subscribe(topic)
        for user in ("forger", "monitor", "stranger", "agent"):
            await try_publish(broker.config(user), topic, reading(f"forger-{user}"))
        await try_publish(broker.config("sim-acl"), topic, reading("sensor"))
        senders = []
        messages = agent.messages()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.5):
                async for message in messages:
                    senders.append(decode(message.payload, Reading).device_id)
    assert senders == ["sensor"]


# ------------------------------------------------------------------------------ actuator safety
class OutOfBounds:
    """A policy gone wrong: proposes values far outside the declared bounds."""

    name = "rogue"

    def __init__(self, intervention: dict[str, float]) -> None:
        self.intervention = intervention

    def propose(self, model, constraints, rng) -> Proposal:
        return Proposal(dict(self.intervention), 0.0, 2.0, tuple(self.intervention), {})


def test_outgoing_actions_are_clamped_to_the_declared_bounds() -> None:
    spec = fast_spec("clamp", rounds=5)
    with Store(":memory:") as store:
        exp = Experiment(spec, store)
        exp.policy = exp.explorer = OutOfBounds({"a0": 1e9, "a1": -float("inf")})
        with capture_logs() as events:
            live = exp.propose()
        assert live is not None
        assert live.action.intervention == {"a0": 1.0, "a1": 0.0}  # the bounds are [0, 1]
        assert store.get_round("clamp", live.number).intervention == {"a0": 1.0, "a1": 0.0}
        assert [e["action"] for e in events if e["event"] == "action.clamped"] == ["a0", "a1"]
        exp.policy = exp.explorer = OutOfBounds({"valve": 1.0})
        with pytest.raises(ValueError, match="unknown action 'valve'"):
            exp.propose()  # never published, never reserved
        assert [r.round for r in store.rounds("clamp")] == [live.number]


class Broken:
    """A policy whose acquisition blew up: raises, or returns NaN."""

    name = "broken"

    def __init__(self, failure: Exception | None) -> None:
        self.failure = failure

    def propose(self, model, constraints, rng) -> Proposal:
        if self.failure is not None:
            raise self.failure
        return Proposal({"a0": math.nan, "a1": 0.5}, 0.0, 2.0, ("a0", "a1"), {})


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        (RuntimeError("cholesky\nfailed"), "RuntimeError: cholesky failed"),
        (None, "ValueError: broken proposed NaN for ['a0']"),
    ],
    ids=["raises", "nan"],
)
def test_a_failing_policy_falls_back_to_the_explorer(failure: Exception | None, error: str) -> None:
    """One warning line with the error's summary and a count; the traceback at debug level."""
    spec = fast_spec("fallback", rounds=5)
    metrics = AgentMetrics()
    with Store(":memory:") as store:
        exp = Experiment(spec, store, metrics=metrics)
        exp.policy = Broken(failure)
        for _ in range(spec.design_rounds):
            exp.propose()  # the initial design is the explorer's anyway
        with capture_logs() as events:
            live = exp.propose()
        assert live is not None and live.policy == exp.explorer.name
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in live.intervention.values())
        (failed,) = [e for e in events if e["event"] == "policy.failed"]
        assert failed["log_level"] == "warning" and "exc_info" not in failed
        assert (failed["policy"], failed["fallback"], failed["error"]) == (
            "broken",
            exp.explorer.name,
            error,
        )
        (traceback,) = [e for e in events if e["event"] == "policy.failed.traceback"]
        assert traceback["log_level"] == "debug" and traceback["exc_info"] is not None
    labels = {"experiment": "fallback", "policy": "broken", "error": error.split(":")[0]}
    assert metrics.registry.get_sample_value("cbo_policy_failures_total", labels) == 1


def test_actions_are_rate_limited_per_experiment() -> None:
    spec = fast_spec("slow", rounds=10, min_interval_s=30.0, pipeline=4, ack_timeout_s=100.0)
    now = [1000.0]
    with Store(":memory:") as store:
        exp = Experiment(spec, store, clock=lambda: now[0])
        first = exp.propose()
        assert first is not None
        exp.mark_published(first.number)
        assert not exp.can_propose(now[0] + 29.9)  # room in the pipeline, but too soon
        assert exp.next_deadline(now[0]) == pytest.approx(30.0)
        assert exp.can_propose(now[0] + 30.0)


def test_the_rate_limit_holds_across_a_restart(tmp_path: Path) -> None:
    spec = fast_spec("slow", rounds=10, min_interval_s=30.0, pipeline=4, ack_timeout_s=100.0)
    now = [1000.0]
    with Store(tmp_path / "agent.sqlite") as store:
        exp = Experiment(spec, store, clock=lambda: now[0])
        first = exp.propose()
        assert first is not None
        exp.mark_published(first.number)
    now[0] += 5.0  # a crash and a quick restart (a crash loop, say)
    with Store(tmp_path / "agent.sqlite") as store:
        restarted = Experiment(spec, store, clock=lambda: now[0])
        assert not restarted.can_propose(now[0])


@pytest.mark.integration
async def test_the_service_keeps_the_rate_limit_on_the_wire(mosquitto, tmp_path: Path) -> None:
    spec = fast_spec("paced", rounds=4, min_interval_s=0.4, pipeline=4)
    device = SimulatorDevice(
        make_environment("dropwave"),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="paced", seed=1),
    )
    published: list[float] = []
    environ = {
        "CBO_BROKER_URL": mosquitto.url,
        "CBO_METRICS_PORT": "0",
        "CBO_STORE_PATH": str(tmp_path / "agent.sqlite"),
    }

    def on_event(event) -> None:
        if event.kind == "published":
            published.append(time.monotonic())

    async with running(device.run()):
        await asyncio.wait_for(device.ready.wait(), WAIT_S)
        service = AgentService(load_config(environ=environ), [spec], on_event=on_event)
        await asyncio.wait_for(service.run(), WAIT_S)
    gaps = [b - a for a, b in itertools.pairwise(published)]
    assert len(published) == 4 and min(gaps) >= 0.4 - 0.01, gaps


# ---------------------------------------------------------------------------------- no pickle
SOURCE_DIRS = ("agent", "bench", "connectors", "core", "policies", "sim", "tests", "deploy")
UNPICKLERS = {  # module -> functions that unpickle (or run code) on what they read
    "pickle": {"load", "loads", "Unpickler"},
    "_pickle": {"load", "loads", "Unpickler"},
    "cPickle": {"load", "loads"},
    "dill": {"load", "loads"},
    "cloudpickle": {"load", "loads"},
    "joblib": {"load"},
    "marshal": {"load", "loads"},
    "shelve": {"open"},
    "torch": {"load"},
    "pandas": {"read_pickle"},
    "pd": {"read_pickle"},
}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}


def dangerous_calls(source: str) -> list[str]:
    """Calls that could unpickle untrusted bytes, by name, with their line."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> "module.function" or "module"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        if name is None:
            continue
        module, _, function = name.rpartition(".")
        keywords = {k.arg: k.value for k in node.keywords}
        root = module.split(".")[0]
        if function in UNPICKLERS.get(module, ()) or function in UNPICKLERS.get(root, ()):
            found.append(f"{node.lineno}: {name}")  # torch.load too, even with weights_only
        elif root in ("numpy", "np") and function in ("load", "read_array"):
            if not _is_false(keywords.get("allow_pickle")):
                found.append(f"{node.lineno}: {name} without allow_pickle=False")
        elif root == "yaml" and function in ("unsafe_load", "full_load", "unsafe_load_all"):
            found.append(f"{node.lineno}: {name}")
        elif root == "yaml" and function in ("load", "load_all"):
            loader = keywords.get("Loader", node.args[1] if len(node.args) > 1 else None)
            if _dotted(loader, aliases, leaf=True) not in SAFE_YAML_LOADERS:
                found.append(f"{node.lineno}: {name} without a safe Loader")
    return found


def _dotted(node, aliases: dict[str, str], leaf: bool = False) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    dotted = ".".join(reversed(parts))
    return dotted.rpartition(".")[2] if leaf else dotted


def _is_false(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def test_the_scanner_finds_every_kind_of_unpickling() -> None:
    sample = """
import pickle, torch, yaml
import numpy as np
from pickle import loads as undo
from yaml import SafeLoader
pickle.load(f); undo(b); torch.load("m.pt"); torch.load("m.pt", weights_only=True)
np.load("a.npy"); np.load("a.npy", allow_pickle=True); np.lib.format.read_array(f)
yaml.load(text); yaml.load(text, Loader=yaml.Loader); yaml.unsafe_load(text)
np.load("a.npy", allow_pickle=False); np.lib.format.read_array(f, allow_pickle=False)
yaml.load(text, Loader=SafeLoader); yaml.safe_load(text); json.loads(text)
"""
    assert len(dangerous_calls(sample)) == 10


def test_nothing_in_the_project_unpickles_or_torch_loads() -> None:
    files = [path for d in SOURCE_DIRS for path in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 50
    found = {
        str(path.relative_to(ROOT)): calls
        for path in files
        if (calls := dangerous_calls(path.read_text(encoding="utf-8")))
    }
    assert not found
    # and the one place that reads arrays back says so explicitly
    store_source = (ROOT / "connectors" / "store" / "snapshots.py").read_text()
    assert "read_array(io.BytesIO(blob), allow_pickle=False)" in store_source


# ------------------------------------------------------------- secrets off the command line
@pytest.mark.integration
async def test_passwords_come_from_files_never_from_the_command_line(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """The agent (broker.password_file) and the simulator (--password-file) log in with
    passwords read from files; the simulator's command line never holds it; `sim --password`
    is refused."""
    assert secure_broker.pki is not None
    agent_file, device_file = tmp_path / "agent.pw", tmp_path / "device.pw"
    agent_file.write_text(secure_broker.passwords["agent"] + "\n")
    device_file.write_text(secure_broker.passwords["sim-secure"] + "\n")
    environ = agent_environment(
        secure_broker,
        tmp_path / "agent.sqlite",
        CBO_BROKER_PASSWORD="",
        CBO_BROKER_PASSWORD_FILE=str(agent_file),
    )
    service = AgentService(load_config(environ=environ), [fast_spec("secure", rounds=1)])
    async with running(service.run()):
        deadline = time.monotonic() + 20.0
        while not service.link.connected:
            assert time.monotonic() < deadline, secure_broker.log_tail()
            await asyncio.sleep(0.05)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CBO_BROKER_")}
    device = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--log-format", "json", "sim", "dropwave",
         "--experiment", "secure", "--broker", secure_broker.url(tls=True),
         "--username", "sim-secure", "--password-file", str(device_file),
         "--ca-file", str(secure_broker.pki.ca_file)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert device.stderr is not None
        # its first session is a login with the password from the file ("Not authorized" else)
        line = await asyncio.wait_for(
            _event_line(device.stderr, ("mqtt.connected", "mqtt.reconnect_scheduled")), 60.0
        )
        assert '"mqtt.connected"' in line, line
        cmdline = Path(f"/proc/{device.pid}/cmdline").read_bytes()
        assert secure_broker.passwords["sim-secure"].encode() not in cmdline
    finally:
        device.terminate()
        # read its stderr to the end while it stops: a full pipe would block its logging, and
        # with it the shutdown (seen as a 30 s timeout under load)
        device.communicate(timeout=30)
    refused = subprocess.run(
        [sys.executable, "-m", "agent.cli", "sim", "dropwave", "--experiment", "x",
         "--password", "hunter2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--password is not accepted" in refused.stderr and "--password-file" in refused.stderr


async def _event_line(stream, events: tuple[str, ...]) -> str:
    """The first line of a JSON log stream naming one of `events` ("" at its end)."""
    while True:
        line = await asyncio.to_thread(stream.readline)
        if not line or any(f'"event": "{event}"' in line for event in events):
            return line
