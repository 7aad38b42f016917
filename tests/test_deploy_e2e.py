"""End to end: a real Prometheus scraping `cbo-agent run` and `cbo-agent sim`, every query checked.

The tests' own Mosquitto runs with the compose stack's ACL and a password file made by the
stack's own script; the agent and the simulator run as the CLI subprocesses the containers run,
configured through the same environment variables; Prometheus runs with the shipped config
(scrape interval 1 s, targets on loopback) and the shipped alert rules. Then:

- every PromQL query of the Grafana dashboard returns finite data;
- every alert rule's expression without its threshold comparisons returns data, and each rule
  whose condition is cheap to bring about returns data under it (queried directly, so `for:`
  durations do not matter): CboBudgetNearlySpent with the spec's tiny budget, CboNoReadings
  evaluated 10 minutes ahead (10 minutes in which no reading arrived), CboAgentDown once the
  agent is stopped; Prometheus's own evaluation of every rule reports no error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
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
DOWN_S = 15.0  # agent stopped -> a failed scrape (every 1 s) -> up == 0
# The spec's budget: action a0 costs 1, a1 costs A1_COST. Two rounds with a0 leave
# BUDGET_TOTAL - 2 (< 10 %: CboBudgetNearlySpent's condition), which pays for a1-only rounds
# for far longer than the test runs, so the agent keeps running with its budget nearly spent.
BUDGET_TOTAL = 2.15
A1_COST = 1e-4
# CboNoReadings compares with 10 minutes ago: evaluated this far ahead, nothing arrived since.
NO_READINGS_AHEAD_S = 600.0 + 10.0
# Dashboard series only some kinds of experiment export; this test's experiment (dropwave, the
# random policy) is not of that kind. Their queries must still evaluate, and the agent must
# expose their metric family (HELP/TYPE) so that a typo in a name cannot pass as "no data".
KIND_SPECIFIC = {
    # tests/test_recommendation_service.py checks its value
    "cbo_recommended_value": "set by multi-fidelity policies only",
}
_THRESHOLD = re.compile(
    r"\s*(?:==|!=|>=|<=|>|<)\s*(?:bool\s+)?[-+]?(?:Inf|NaN|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\b",
    re.IGNORECASE,
)


def cbo_agent_command() -> list[str]:
    """The installed `cbo-agent` script, else the same CLI through this interpreter."""
    beside_python = Path(sys.executable).with_name("cbo-agent")
    if beside_python.exists():
        return [str(beside_python)]
    installed = shutil.which("cbo-agent")
    return [installed] if installed else [sys.executable, "-m", "agent.cli"]


def require_cli(command: list[str]) -> None:
    """`cbo-agent run --help` and `cbo-agent sim --help` work: a broken CLI fails the test."""
    for name in ("run", "sim"):
        result = subprocess.run(
            [*command, name, "--help"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, (
            f"`{' '.join([*command, name])} --help` exited {result.returncode}:\n"
            f"{result.stderr.strip() or result.stdout.strip() or 'no output'}"
        )


def without_thresholds(expr: str) -> str:
    """A rule's expression without its top-level comparisons against a number.

    What remains is the quantity the rule watches (`ratio < 0.1` -> `ratio`; in
    `a > 0.9 and on (e) b >= 50` both guards keep their series): it must return data whenever
    the agent exports what the rule is about. Comparisons inside parentheses are kept.
    """
    kept: list[str] = []
    depth, quote, i = 0, "", 0
    while i < len(expr):
        char = expr[i]
        if quote:
            if char == "\\":
                kept.append(expr[i : i + 2])
                i += 2
                continue
            if char == quote:
                quote = ""
        elif char in "\"'`":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and (match := _THRESHOLD.match(expr, i)) and match.group().strip():
            i = match.end()
            continue
        kept.append(char)
        i += 1
    return "".join(kept)


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


def promql(base: str, expr: str, at: float | None = None) -> dict[str, Any]:
    """An instant query (at `at`, seconds since the epoch; default: now)."""
    params = {"query": expr} | ({} if at is None else {"time": f"{at:.3f}"})
    status, body = http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode(params))
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
    """examples/dropwave.yaml with the random policy, short timeouts and a budget that is
    nearly spent after two rounds with action a0 and then lasts (see BUDGET_TOTAL)."""
    spec = yaml.safe_load((ROOT / "examples" / "dropwave.yaml").read_text())
    spec["policy"] = {"name": "random", "settings": {}}
    spec["schedule"] = {"ack_timeout_s": 2.0, "round_timeout_s": 2.0}
    spec["constraints"] = {"budget_total": BUDGET_TOTAL}
    costs = {action["name"]: action["cost"] for action in spec["actions"]}
    assert costs == {"a0": 1.0, "a1": 1.0}, f"examples/dropwave.yaml changed its actions: {costs}"
    spec["actions"][1]["cost"] = A1_COST
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


DEVICE = f"sim-{EXPERIMENT}"  # the spec's default device: the simulator's id and login


def make_passwords(directory: Path) -> tuple[Path, dict[str, str]]:
    passwords = {
        user: secrets.token_urlsafe(12) for user in ("agent", DEVICE, "monitor", "operator")
    }
    passwd = directory / "passwd"
    env = {
        "PATH": os.environ["PATH"],
        "MQTT_AGENT_PASSWORD": passwords["agent"],
        "MQTT_MONITOR_PASSWORD": passwords["monitor"],
        "MQTT_OPERATOR_PASSWORD": passwords["operator"],
        "MQTT_DEVICE_USER": DEVICE,
        "MQTT_DEVICE_PASSWORD": passwords[DEVICE],
    }
    subprocess.run(["sh", str(MAKE_PASSWD), str(passwd)], env=env, check=True, timeout=30)
    return passwd, passwords


def publish_bad_reading(port: int, username: str, password: str) -> None:
    """A reading the agent must reject (so the rejection panels have data)."""
    from paho.mqtt import publish

    publish.single(
        f"cbo/{EXPERIMENT}/{username}/reading",
        b'{"schema": "cbo.reading", "version": 1}',
        qos=1,
        hostname=HOST,
        port=port,
        auth={"username": username, "password": password},
    )


@pytest.mark.integration
def test_prometheus_evaluates_every_dashboard_query_and_alert_rule(mosquitto_factory, tmp_path):
    cli = cbo_agent_command()
    require_cli(cli)
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
    device_url = f"mqtt://{DEVICE}:{passwords[DEVICE]}@{HOST}:{broker.port}"

    with processes() as start:
        sim = start(
            "sim",
            [*cli, "--log-format", "json", "sim", "dropwave", "--experiment", EXPERIMENT,
             "--broker", device_url, "--delay", "0.02", "--jitter", "0.05",
             "--duplicate-rate", "0.2", "--seed", "1"],
            tmp_path / "sim.log",
            base_env,
        )  # fmt: skip
        agent = start(
            "agent",
            [*cli, "run", str(spec), "--broker", broker.url,
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
        publish_bad_reading(broker.port, DEVICE, passwords[DEVICE])

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
        elsewhere = {w: q for w, q in queries.items() if metric_names(q) & set(KIND_SPECIFIC)}
        assert all(metric_names(q) <= set(KIND_SPECIFIC) for q in elsewhere.values()), elsewhere
        here = {w: q for w, q in queries.items() if w not in elsewhere}
        wait_for_data(api, "every dashboard query", here, agent, sim, server)
        exposition = http_get(f"{metrics}/metrics")[1].decode()
        for where, expr in elsewhere.items():
            promql(api, expr)  # evaluates without an error, empty here
            for name in metric_names(expr):
                assert f"# TYPE {name} " in exposition, f"{where}: {name} is not exported"

        # Every alert rule: the quantity it watches (its expression without threshold
        # comparisons) returns data; CboNoReadings looks 10 minutes back, so it is evaluated
        # 10 minutes ahead, where nothing arrived since now.
        rules = dict(alert_expressions())
        ahead = time.time() + NO_READINGS_AHEAD_S
        at = {name: ahead if name == "CboNoReadings" else None for name in rules}
        watched = {name: without_thresholds(expr) for name, expr in rules.items()}
        assert all(watched[name] != rules[name] for name in rules), "a rule without threshold"
        wait_for_data(
            api, "every alert rule's watched quantity", watched, agent, sim, server, at=at
        )

        # ... and the conditions brought about here make their rules' expressions return data:
        # the budget is nearly spent (the spec's), no reading came for 10 minutes (ahead).
        driven = {name: rules[name] for name in ("CboBudgetNearlySpent", "CboNoReadings")}
        wait_for_data(api, "the driven alert rules", driven, agent, sim, server, at=at)
        (nearly_spent,) = promql(api, rules["CboBudgetNearlySpent"])["result"]
        assert nearly_spent["metric"]["experiment"] == EXPERIMENT
        assert 0 < float(nearly_spent["value"][1]) < 0.1
        # ... while the agent is up, CboAgentDown is quiet. (The regret rules may fire: the
        # random policy does not learn, and its regret does grow linearly.)
        assert not promql(api, rules["CboAgentDown"])["result"]

        # Prometheus's own rule evaluation reports no error for any rule.
        def rules_evaluated() -> list[dict[str, Any]]:
            groups = json.loads(http_get(f"{api}/api/v1/rules")[1])["data"]["groups"]
            evaluated = [rule for group in groups for rule in group["rules"]]
            done = all(not r["lastEvaluation"].startswith("0001-") for r in evaluated)
            return evaluated if done else []

        evaluated = wait_until("a rule evaluation", rules_evaluated, 15, server)
        assert {r["name"] for r in evaluated} == set(rules)
        assert all(r["health"] == "ok" for r in evaluated), [
            (r["name"], r.get("lastError")) for r in evaluated if r["health"] != "ok"
        ]
        assert "CboAgentDown" not in {r["name"] for r in evaluated if r["state"] == "firing"}

        targets = json.loads(http_get(f"{api}/api/v1/targets")[1])["data"]["activeTargets"]
        assert [t["health"] for t in targets if t["labels"]["job"] == AGENT_JOB] == ["up"]
        rejected = promql(api, 'sum(cbo_messages_total{outcome="rejected", kind="reading"})')
        assert finite_values(rejected) == [1.0]
        assert agent.alive and sim.alive

        # The agent stops: its scrape fails, and CboAgentDown's expression returns data.
        agent.stop()
        down = {"CboAgentDown": rules["CboAgentDown"]}
        wait_for_data(api, "CboAgentDown's expression, the agent stopped", down, sim, server)
        (series,) = promql(api, rules["CboAgentDown"])["result"]
        assert series["metric"]["job"] == AGENT_JOB and float(series["value"][1]) == 0.0


def wait_for_data(
    api: str,
    what: str,
    queries: dict[str, str],
    *alive: Process,
    at: dict[str, float | None] | None = None,
) -> None:
    """Wait (DATA_S at most) until every query returns finite data; name those that do not."""
    missing: list[str] = []

    def all_have_data() -> bool:
        missing[:] = [
            f"{where}: {expr}"
            for where, expr in queries.items()
            if not finite_values(promql(api, expr, (at or {}).get(where)))
        ]
        return not missing

    try:
        wait_until(f"data for {what}", all_have_data, DATA_S, *alive)
    except AssertionError as error:
        if not str(error).startswith("timed out"):
            raise  # a query Prometheus refused, or a process that died
        raise AssertionError(f"{error}; still empty:\n" + "\n".join(missing)) from None


def test_without_thresholds_keeps_what_a_rule_watches() -> None:
    assert without_thresholds("a / (b + c)\n  < 0.1") == "a / (b + c)"
    assert without_thresholds('up{job="x"} == 0 or absent(up{job="x"})') == (
        'up{job="x"} or absent(up{job="x"})'
    )
    assert without_thresholds("(x > 0) and on (e) y >= 50 unless z <= bool -1e3") == (
        "(x > 0) and on (e) y unless z"
    )
    assert without_thresholds('m{l=~"a>1"} > +Inf') == 'm{l=~"a>1"}'
