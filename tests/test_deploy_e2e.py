"""End to end: a real Prometheus scraping `cbo-agent run` and `cbo-agent sim`, every query checked.

The tests' own Mosquitto runs with the compose stack's ACL and a password file made by the
stack's own script; the agent and the simulator run as the CLI subprocesses the containers run,
configured through the same environment variables; Prometheus runs with the shipped config
(scrape interval 1 s, targets on loopback) and the shipped alert rules. Then every PromQL query
of the Grafana dashboard must return data, and every alert rule must evaluate without error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.spec import load_spec
from tests.brokers import HOST, MosquittoOptions, free_port
from tests.test_deploy import (
    AGENT_JOB,
    ALERTS,
    MAKE_PASSWD,
    MOSQUITTO_DIR,
    PROMETHEUS_CONFIG,
    ROOT,
    alert_expressions,
    concrete_promql,
    dashboard_expressions,
    healthcheck_command,
    metric_names,
)

EXPERIMENT = "dropwave"
STARTUP_S = 30.0  # the agent and the simulator import torch; two cores do both at once
DATA_S = 30.0  # from ready to every dashboard query returning data
STOP_S = 10.0
# Exported only where no simulator oracle exists, and not yet fed by the runtime: its queries
# must evaluate, and must return data as soon as the agent exports the series.
ONLY_WITHOUT_ORACLE = {"cbo_regret_upper_estimate"}


def cbo_agent_executable() -> str:
    beside_python = Path(sys.executable).with_name("cbo-agent")
    return str(beside_python) if beside_python.exists() else shutil.which("cbo-agent") or ""


def require_cli(executable: str) -> None:
    if not executable:
        pytest.skip("the cbo-agent command is not installed (make test installs it)")
    for command in ("run", "sim"):
        result = subprocess.run(
            [executable, command, "--help"], capture_output=True, text=True, timeout=30
        )
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"`cbo-agent {command}` is not available yet: {reason}")


class Process:
    """A subprocess in its own session, logging to a file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, command: list[str], log_path: Path, env: dict[str, str]):
        self.name = name
        self.log_path = log_path
        with log_path.open("wb") as log_file:
            self.popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if not self.alive:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=STOP_S)

    def log_tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- {self.name} (exit {self.popen.poll()}) ---\n" + "\n".join(
            text.splitlines()[-lines:]
        )


@contextlib.contextmanager
def processes() -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(name: str, command: list[str], log_path: Path, env: dict[str, str]) -> Process:
        process = Process(name, command, log_path, env)
        started.append(process)
        return process

    try:
        yield start
    except BaseException:
        for process in started:
            print(process.log_tail(), file=sys.stderr)
        raise
    finally:
        for process in reversed(started):
            process.stop()


def wait_until(what: str, check: Callable[[], Any], timeout_s: float, *alive: Process) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout_s` or if one dies."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        for process in alive:
            assert process.alive, f"{process.name} exited while waiting for {what}"
        try:
            result = check()
            if result:
                return result
        except (OSError, ValueError) as error:  # not up yet
            last_error = error
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} ({last_error})")


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def promql(base: str, expr: str) -> dict[str, Any]:
    status, body = http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    reply = json.loads(body)
    assert status == 200 and reply["status"] == "success", f"{expr}\n-> {status} {reply}"
    return reply["data"]


def finite_values(data: dict[str, Any]) -> list[float]:
    if data["resultType"] == "scalar":
        samples = [data["result"][1]]
    else:
        samples = [series["value"][1] for series in data["result"]]
    return [float(v) for v in samples if math.isfinite(float(v))]


def fast_spec(path: Path) -> Path:
    """examples/dropwave.yaml with the random policy, short timeouts and a finite budget."""
    spec = yaml.safe_load((ROOT / "examples" / "dropwave.yaml").read_text())
    spec["policy"] = {"name": "random", "settings": {}}
    spec["schedule"] = {"ack_timeout_s": 2.0, "round_timeout_s": 2.0}
    spec["constraints"] = {"budget_total": 1.0e6}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert load_spec(path).name == EXPERIMENT
    return path


def prometheus_config(path: Path, metrics_port: int) -> Path:
    """The shipped config, scraping the agent on loopback every second."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(ALERTS)]
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == AGENT_JOB]
    for group in job["static_configs"]:
        group["targets"] = [f"{HOST}:{metrics_port}"]
    config["scrape_configs"] = [job]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def make_passwords(directory: Path) -> tuple[Path, dict[str, str]]:
    passwords = {user: secrets.token_urlsafe(12) for user in ("agent", "device", "monitor")}
    passwd = directory / "passwd"
    env = {"PATH": os.environ["PATH"]} | {
        f"MQTT_{user.upper()}_PASSWORD": password for user, password in passwords.items()
    }
    subprocess.run(["sh", str(MAKE_PASSWD), str(passwd)], env=env, check=True, timeout=30)
    return passwd, passwords


def publish_bad_reading(port: int, username: str, password: str) -> None:
    """A reading the agent must reject (so the rejection panels have data)."""
    from paho.mqtt import publish

    publish.single(
        f"cbo/{EXPERIMENT}/reading",
        b'{"schema": "cbo.reading", "version": 1}',
        qos=1,
        hostname=HOST,
        port=port,
        auth={"username": username, "password": password},
    )


@pytest.mark.integration
def test_prometheus_evaluates_every_dashboard_query_and_alert_rule(mosquitto_factory, tmp_path):
    executable = cbo_agent_executable()
    require_cli(executable)
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus is not installed (Debian: .ci/run installs the package)")
    if shutil.which("mosquitto_passwd") is None:
        pytest.skip("mosquitto_passwd is not installed (Debian: mosquitto)")

    passwd, passwords = make_passwords(tmp_path)
    broker = mosquitto_factory(
        MosquittoOptions(
            allow_anonymous=False, password_file=passwd, acl_file=MOSQUITTO_DIR / "acl"
        )
    )
    spec = fast_spec(tmp_path / "dropwave.yaml")
    metrics_port, prometheus_port = free_port(), free_port()
    metrics = f"http://{HOST}:{metrics_port}"
    api = f"http://{HOST}:{prometheus_port}"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("CBO_")} | {
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    # configured as in the containers: credentials and the metrics host from CBO_* variables
    agent_env = base_env | {
        "CBO_BROKER_USERNAME": "agent",
        "CBO_BROKER_PASSWORD": passwords["agent"],
        "CBO_METRICS_HOST": HOST,
        "CBO_LOG_FORMAT": "json",
    }
    device_url = f"mqtt://device:{passwords['device']}@{HOST}:{broker.port}"

    with processes() as start:
        sim = start(
            "sim",
            [executable, "--log-format", "json", "sim", "dropwave", "--experiment", EXPERIMENT,
             "--broker", device_url, "--delay", "0.02", "--jitter", "0.05",
             "--duplicate-rate", "0.2", "--seed", "1"],
            tmp_path / "sim.log",
            base_env,
        )  # fmt: skip
        agent = start(
            "agent",
            [executable, "run", str(spec), "--broker", broker.url,
             "--metrics-port", str(metrics_port), "--store", str(tmp_path / "agent.sqlite"),
             "--agent-id", "e2e-agent"],
            tmp_path / "agent.log",
            agent_env,
        )  # fmt: skip
        server = start(
            "prometheus",
            [prometheus, f"--config.file={prometheus_config(tmp_path / 'p.yml', metrics_port)}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address={HOST}:{prometheus_port}"],
            tmp_path / "prometheus.log",
            base_env,
        )  # fmt: skip

        wait_until("Prometheus ready", lambda: http_get(f"{api}/-/ready")[0] == 200, 30, server)
        wait_until(
            "the agent ready (broker connected, experiment loaded)",
            lambda: http_get(f"{metrics}/readyz")[0] == 200,
            STARTUP_S,
            agent,
            sim,
        )
        publish_bad_reading(broker.port, "device", passwords["device"])

        # The image's HEALTHCHECK command, run as written against the live agent.
        check = healthcheck_command()
        health = subprocess.run(
            [sys.executable, *check[1:]],
            env=base_env | {"CBO_METRICS_PORT": str(metrics_port)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert health.returncode == 0, health.stderr

        # Every dashboard query returns finite data once rounds, readings and a rejection flowed.
        queries = {where: concrete_promql(expr) for where, expr in dashboard_expressions()}
        exported = http_get(f"{metrics}/metrics")[1].decode()
        optional = {
            where
            for where, expr in queries.items()
            if metric_names(expr) & ONLY_WITHOUT_ORACLE
            and not any(f"\n{name}{{" in exported for name in ONLY_WITHOUT_ORACLE)
        }

        def empty_queries() -> list[str]:
            return [
                f"{where}: {expr}"
                for where, expr in queries.items()
                if where not in optional and not finite_values(promql(api, expr))
            ]

        missing: list[str] = []

        def all_have_data() -> bool:
            missing[:] = empty_queries()
            return not missing

        try:
            wait_until("data for every dashboard query", all_have_data, DATA_S, agent, sim, server)
        except AssertionError as error:
            if not str(error).startswith("timed out"):
                raise  # a query Prometheus refused, or a process that died
            raise AssertionError(f"{error}; still empty:\n" + "\n".join(missing)) from None
        for where in optional:
            promql(api, queries[where])  # evaluates, even while the series is not exported

        # Every alert expression evaluates (most are legitimately empty on a healthy agent) ...
        for _, expr in alert_expressions():
            promql(api, expr)

        # ... and Prometheus's own rule evaluation reports no error for any rule.
        def rules_evaluated() -> list[dict[str, Any]]:
            groups = json.loads(http_get(f"{api}/api/v1/rules")[1])["data"]["groups"]
            rules = [rule for group in groups for rule in group["rules"]]
            done = all(not r["lastEvaluation"].startswith("0001-") for r in rules)
            return rules if done else []

        rules = wait_until("a rule evaluation", rules_evaluated, 15, server)
        assert {r["name"] for r in rules} == {name for name, _ in alert_expressions()}
        assert all(r["health"] == "ok" for r in rules), [
            (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"
        ]
        # The agent is up, so the rule for it being down is quiet.
        firing = {r["name"] for r in rules if r["state"] == "firing"}
        assert "CboAgentDown" not in firing

        targets = json.loads(http_get(f"{api}/api/v1/targets")[1])["data"]["activeTargets"]
        assert [t["health"] for t in targets if t["labels"]["job"] == AGENT_JOB] == ["up"]
        rejected = promql(api, 'sum(cbo_messages_total{outcome="rejected", kind="reading"})')
        assert finite_values(rejected) == [1.0]
        assert agent.alive and sim.alive
