"""The service image, built and run for real: `make test-image` (CI runs it after `make test`).

Marked `image`: skipped unless CBO_TEST_IMAGE names the service image, which `make test-image`
sets (with CBO_TEST_MOSQUITTO_IMAGE and CBO_TEST_ENGINE) after `make image` built both images,
so the default suite needs no container engine. What runs, with podman where no Docker engine
is running (CONTAINERS_CONF=deploy/image/containers.conf) and with docker where one is:

- the image without arguments exits 2 with one line saying how to mount specs;
- torch in it is the pinned CPU build; it runs as its non-root user, keeps its HEALTHCHECK, and
  holds no pip configuration of the machine that built it;
- `cbo-agent demo` in a container serves /metrics and /healthz on a published loopback port;
- the compose stack's core as deploy/docker-compose.yml defines it (mosquitto-init, mosquitto,
  agent, sim: their commands, environment, mounts, ports; Mosquitto from Debian's package,
  deploy/mosquitto/Containerfile, standing in for eclipse-mosquitto) on a network of its own:
  the agent runs rounds with the simulator through the password- and ACL-protected broker, a
  Prometheus on this machine (Debian's package) scrapes the agent's published port, the image's
  health check passes, and `cbo-agent export --format parquet` writes files pyarrow reads back;
- afterwards no container, volume or network of the run is left (checked at teardown).

Every engine call and every wait is bounded; the whole module takes about two minutes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.brokers import HOST, free_port
from tests.test_deploy import AGENT_JOB, COMPOSE, DEPLOY, DOCKERFILE, ROOT, interpolate
from tests.test_deploy_e2e import http_get, processes, prometheus_config, promql, wait_until

IMAGE = os.environ.get("CBO_TEST_IMAGE", "")
MOSQUITTO_IMAGE = os.environ.get("CBO_TEST_MOSQUITTO_IMAGE", "cbo-mosquitto:local")
RUN_ID = f"cbo-smoke-{os.getpid()}-{secrets.token_hex(3)}"  # names every container, volume, net
LABEL = f"cbo-smoke={RUN_ID}"
ENGINE_S = 180.0  # one engine command (a `run` imports torch on two busy cores)
STARTUP_S = 120.0  # a container from start to serving, or to its first rounds
ROUNDS = 3  # rounds the stack's agent must close

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(not IMAGE, reason="CBO_TEST_IMAGE is not set: `make test-image` runs these"),
]


# ---------------------------------------------------------------------------- the engine


@dataclass(frozen=True)
class Engine:
    """docker or podman, called with a bounded time and its output captured."""

    name: str
    env: dict[str, str]

    def __call__(
        self, *args: str, timeout: float = ENGINE_S, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.name, *args], capture_output=True, text=True, timeout=timeout, env=self.env
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{self.name} {' '.join(args)} -> exit {result.returncode}\n{result.stderr[-3000:]}"
            )
        return result

    def running(self, container: str) -> bool:
        state = self("inspect", "--format", "{{.State.Running}}", container, check=False)
        return state.stdout.strip() == "true"

    def logs(self, container: str) -> str:
        result = self("logs", "--tail", "40", container, check=False)
        return f"--- {container} ---\n{result.stdout}{result.stderr}"

    def names(self, *listing: str) -> set[str]:
        return set(self(*listing).stdout.split())


def detect_engine() -> Engine:
    """The engine `make image` used: CBO_TEST_ENGINE, else docker if one runs, else podman."""
    env = dict(os.environ)
    name = os.environ.get("CBO_TEST_ENGINE", "")
    if not name:
        docker = shutil.which("docker")
        answers = docker is not None and subprocess.run(
            [docker, "info"], capture_output=True, timeout=30
        ).returncode == 0  # fmt: skip
        name = "docker" if answers else "podman"
    if name == "podman":
        env.setdefault("CONTAINERS_CONF", str(DEPLOY / "image" / "containers.conf"))
    if shutil.which(name) is None:
        pytest.fail(f"{name} is not installed; `make image` builds the images with it")
    return Engine(name, env)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """The engine, with the images present; at the end everything this run made is removed,
    and the teardown fails if anything is left."""
    engine = detect_engine()
    for image in (IMAGE, MOSQUITTO_IMAGE):
        if engine("image", "inspect", image, check=False).returncode != 0:
            pytest.fail(f"image {image} is missing: run `make image` first")
    volumes_before = engine.names("volume", "ls", "--quiet")
    yield engine
    containers = engine.names("ps", "--all", "--quiet", "--filter", f"label={LABEL}")
    if containers:
        engine("rm", "--force", "--volumes", *containers)
    for volume in engine.names("volume", "ls", "--quiet") - volumes_before:
        engine("volume", "rm", "--force", volume, check=False)
    networks = {n for n in engine.names("network", "ls", "--format", "{{.Name}}") if RUN_ID in n}
    for network in networks:
        engine("network", "rm", network, check=False)
    assert not engine.names("ps", "--all", "--quiet", "--filter", f"label={LABEL}")
    assert not engine.names("volume", "ls", "--quiet") - volumes_before, "volumes left"
    assert not [n for n in engine.names("network", "ls", "--format", "{{.Name}}") if RUN_ID in n]


def container_name(role: str) -> str:
    return f"{RUN_ID}-{role}"


def wait_for(what: str, check: Callable[[], Any], engine: Engine, container: str) -> Any:
    """Poll `check` until it returns something truthy, while the container runs."""
    deadline = time.monotonic() + STARTUP_S
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (OSError, ValueError) as error:  # not serving yet
            last_error = error
        if not engine.running(container):
            raise AssertionError(f"{container} stopped before {what}\n{engine.logs(container)}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} after {STARTUP_S} s ({last_error})\n{engine.logs(container)}")


def metric_values(text: str, name: str) -> list[float]:
    """The values of one metric's samples in a /metrics page."""
    return [float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)]


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, f"no ARG {name}=... in the Dockerfile"
    return match.group(1)


# ---------------------------------------------------------------------------- the image alone


def test_without_arguments_the_image_exits_2_with_one_line(engine: Engine) -> None:
    result = engine("run", "--rm", "--no-healthcheck", "--label", LABEL, IMAGE, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "/specs/experiment.yaml: no such spec file" in line and "mount your specs" in line


def test_torch_in_the_image_is_the_pinned_cpu_build(engine: Engine) -> None:
    probe = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"
    result = engine(
        "run", "--rm", "--no-healthcheck", "--label", LABEL, "--entrypoint", "python", IMAGE,
        "-c", probe,
    )  # fmt: skip
    version, cuda = json.loads(result.stdout.strip().splitlines()[-1])
    assert version == f"{dockerfile_arg('TORCH_VERSION')}+cpu" and cuda is None


def test_the_image_leaves_the_mamujoco_extra_out_and_says_so(engine: Engine) -> None:
    """The service image stays under 1.2 GB without MuJoCo; its simulator names the extra."""
    result = engine(
        "run", "--rm", "--no-healthcheck", "--label", LABEL, "--entrypoint", "cbo-agent", IMAGE,
        "sim", "mamujoco-swimmer", "--experiment", "x", check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "pip install 'cbo-agent[mamujoco]'" in line, line
    size = int(engine("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    assert size < 1.2e9, f"the image is {size / 1e9:.2f} GB, over its 1.2 GB target"


def test_the_image_runs_as_its_user_with_its_healthcheck_and_no_build_configuration(
    engine: Engine,
) -> None:
    probe = """
import json, os, pathlib, subprocess, sys
leftovers = [str(p) for p in pathlib.Path("/run/cbo-build").rglob("*")
             if p.is_file() and p.stat().st_size > 0]
pip = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                     text=True).stdout
print(json.dumps({"uid": os.getuid(), "pip_env": sorted(k for k in os.environ
                  if k.startswith("PIP_") and k not in ("PIP_NO_CACHE_DIR",
                  "PIP_DISABLE_PIP_VERSION_CHECK")),
                  "pip_config": [s for s in pip.split() if not s.startswith(":env:")],
                  "leftovers": leftovers,
                  "etc": [p for p in ("/etc/pip.conf", "/etc/xdg/pip") if os.path.exists(p)]}))
"""
    result = engine(
        "run", "--rm", "--no-healthcheck", "--label", LABEL, "--entrypoint", "python", IMAGE,
        "-c", probe,
    )  # fmt: skip
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["uid"] == int(dockerfile_arg("UID"))
    # the build mounted this machine's pip configuration under /run/cbo-build: none of it stays
    assert seen == seen | {"pip_env": [], "pip_config": [], "leftovers": [], "etc": []}
    check = json.loads(engine("image", "inspect", "--format", "{{json .Config.Healthcheck}}",
                              IMAGE).stdout)  # fmt: skip
    assert "/healthz" in " ".join(check["Test"]), "HEALTHCHECK lost (podman: build --format docker)"


def test_the_demo_in_a_container_serves_metrics_and_healthz(engine: Engine) -> None:
    port = free_port()
    demo = container_name("demo")
    engine(
        "run", "--detach", "--no-healthcheck", "--label", LABEL, "--name", demo,
        "--publish", f"{HOST}:{port}:9464", "--entrypoint", "cbo-agent", IMAGE,
        "demo", "--no-live", "--rounds", "12", "--metrics-host", "0.0.0.0", "--out", "/tmp/demo",
    )  # fmt: skip
    base = f"http://{HOST}:{port}"
    wait_for("/healthz", lambda: http_get(f"{base}/healthz")[0] == 200, engine, demo)

    def rounds_closed() -> bool:
        status, body = http_get(f"{base}/metrics")
        return status == 200 and sum(metric_values(body.decode(), "cbo_rounds_total")) >= 1

    wait_for("a closed round on /metrics", rounds_closed, engine, demo)
    exit_code = engine("wait", demo, timeout=STARTUP_S * 2).stdout.strip().splitlines()[-1]
    assert exit_code == "0", engine.logs(demo)
    assert "regret plot:" in engine("logs", demo).stdout
    engine("rm", "--volumes", demo)


# ---------------------------------------------------------------------------- the stack's core


@dataclass
class Stack:
    """deploy/docker-compose.yml's mosquitto-init, mosquitto, agent and sim, as containers."""

    engine: Engine
    env: dict[str, str]  # what deploy/.env would hold: passwords, published ports
    network: str = container_name("net")
    hosts: list[str] = field(default_factory=list)  # --add-host service:ip, as compose's DNS

    def args(self, service: str) -> tuple[list[str], list[str]]:
        """(`run` options, arguments after the image) for a compose service."""
        spec = yaml.safe_load(COMPOSE.read_text())["services"][service]
        options = ["--label", LABEL, "--name", container_name(service), "--network", self.network]
        options += [f"--add-host={host}" for host in self.hosts]
        for key, value in (spec.get("environment") or {}).items():
            options += ["--env", f"{key}={interpolate(str(value), self.env)}"]
        for entry in spec.get("volumes", []):
            source, target, *mode = entry.split(":")
            if source.startswith("."):
                source = str((DEPLOY / source).resolve())
            else:
                source = container_name(source)  # a named volume of this run
            options += ["--volume", ":".join([source, target, *mode])]
        for entry in spec.get("ports", []):
            options += ["--publish", interpolate(entry, self.env)]
        if spec.get("healthcheck", {}).get("disable"):
            options.append("--no-healthcheck")
        entrypoint = spec.get("entrypoint") or []
        if entrypoint:
            options += ["--entrypoint", entrypoint[0]]
        arguments = [*entrypoint[1:], *(interpolate(a, self.env) for a in spec.get("command", []))]
        return options, arguments

    def start(self, service: str, image: str, *, detach: bool = True) -> str:
        options, arguments = self.args(service)
        run = ["run", "--detach"] if detach else ["run"]
        self.engine(*run, *options, image, *arguments)
        return container_name(service)

    def address(self, container: str) -> str:
        template = f'{{{{(index .NetworkSettings.Networks "{self.network}").IPAddress}}}}'
        return self.engine("inspect", "--format", template, container).stdout.strip()


@dataclass
class RunningStack:
    agent: str
    metrics: str  # the agent's /metrics base URL on this machine
    metrics_port: int


@pytest.fixture(scope="module")
def stack(engine: Engine) -> Iterator[RunningStack]:
    passwords = {user: secrets.token_urlsafe(12) for user in ("AGENT", "DEVICE", "MONITOR")}
    env = {f"MQTT_{user}_PASSWORD": password for user, password in passwords.items()} | {
        "CBO_BIND": HOST,
        "MQTT_PORT": str(free_port()),
        "CBO_METRICS_PORT": str(free_port()),
    }
    stack = Stack(engine, env)
    engine("network", "create", stack.network)
    # compose: mosquitto-init runs to completion before mosquitto starts
    stack.start("mosquitto-init", MOSQUITTO_IMAGE, detach=False)
    broker = stack.start("mosquitto", MOSQUITTO_IMAGE)
    stack.hosts.append(f"mosquitto:{stack.address(broker)}")
    agent = stack.start("agent", IMAGE)
    sim = stack.start("sim", IMAGE)
    try:
        metrics = f"http://{HOST}:{env['CBO_METRICS_PORT']}"

        def rounds_closed() -> bool:
            status, body = http_get(f"{metrics}/metrics")
            return status == 200 and sum(metric_values(body.decode(), "cbo_rounds_total")) >= ROUNDS

        wait_for(f"{ROUNDS} rounds closed by the agent", rounds_closed, engine, agent)
        yield RunningStack(agent, metrics, int(env["CBO_METRICS_PORT"]))
    except BaseException:
        for container in (broker, agent, sim):
            print(engine.logs(container))
        raise


def test_the_agent_container_runs_rounds_with_the_stack_broker_and_simulator(
    stack: RunningStack,
) -> None:
    status, body = http_get(f"{stack.metrics}/metrics")
    text = body.decode()
    assert status == 200 and sum(metric_values(text, "cbo_rounds_total")) >= ROUNDS
    accepted = re.findall(
        r'^cbo_messages_total{[^}]*kind="reading"[^}]*outcome="accepted"[^}]*} (\S+)$', text, re.M
    )
    assert sum(map(float, accepted)) > 0  # readings came from the sim, through the ACL
    assert http_get(f"{stack.metrics}/readyz")[0] == 200


def test_prometheus_on_this_machine_scrapes_the_agent_container(
    stack: RunningStack, tmp_path: Path
) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus is not installed (Debian: .ci/run installs the package)")
    api_port = free_port()
    api = f"http://{HOST}:{api_port}"
    config = prometheus_config(tmp_path / "prometheus.yml", stack.metrics_port)
    with processes() as start:
        server = start(
            "prometheus",
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address={HOST}:{api_port}"],
            tmp_path / "prometheus.log",
            {"PATH": os.environ["PATH"]},
        )  # fmt: skip

        def scraped() -> bool:
            up = promql(api, f'up{{job="{AGENT_JOB}"}}')["result"]
            rounds = promql(api, f'sum(cbo_rounds_total{{job="{AGENT_JOB}"}})')["result"]
            return bool(up and up[0]["value"][1] == "1" and rounds)

        wait_until("Prometheus scraping the agent container", scraped, STARTUP_S, server)
        (rounds,) = promql(api, f'sum(cbo_rounds_total{{job="{AGENT_JOB}"}})')["result"]
        assert float(rounds["value"][1]) >= ROUNDS


def test_the_image_healthcheck_passes_in_the_agent_container(
    engine: Engine, stack: RunningStack
) -> None:
    if engine.name == "podman":
        result = engine("healthcheck", "run", stack.agent, check=False)
        assert result.returncode == 0, result.stdout + result.stderr + engine.logs(stack.agent)
        return

    def healthy() -> bool:  # docker runs the check itself, every 15 s after the start
        state = engine("inspect", "--format", "{{.State.Health.Status}}", stack.agent)
        assert state.stdout.strip() != "unhealthy", engine.logs(stack.agent)
        return state.stdout.strip() == "healthy"

    wait_for("a healthy container", healthy, engine, stack.agent)


def test_the_agent_container_exports_parquet(engine: Engine, stack: RunningStack) -> None:
    experiment = yaml.safe_load((ROOT / "examples" / "dropwave.yaml").read_text())["name"]
    written = engine(
        "exec", stack.agent, "cbo-agent", "export", experiment, "--format", "parquet",
        "--out", "/tmp/export",
    ).stdout.split()  # fmt: skip
    assert written and all(path.endswith(".parquet") for path in written)
    read = "import json, sys, pyarrow.parquet as pq; " + (
        "print(json.dumps({p: pq.read_table(p).num_rows for p in sys.argv[1:]}))"
    )
    rows = json.loads(engine("exec", stack.agent, "python", "-c", read, *written).stdout)
    assert max(rows.values()) >= ROUNDS, rows
