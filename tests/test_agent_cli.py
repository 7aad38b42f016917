"""The command line: export, the service's refusal of bad input, and how a finished service ends."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.cli import main
from agent.experiment import Experiment
from bench.harness.procs import child_environment, cli, write_spec
from connectors.store import Store
from tests.test_agent_join import ack, chain_spec, reading

ROOT = Path(__file__).resolve().parents[1]


def test_export_writes_the_history_as_csv(tmp_path, capsys):
    path = tmp_path / "agent.sqlite"
    with Store(path) as store:
        exp = Experiment(chain_spec(), store, seed=1)
        for number in range(3):
            live = exp.propose()
            exp.mark_published(live.number)
            exp.on_ack(ack(exp, number))
            exp.on_readings(
                [
                    reading(exp, number, node, 0.1 * i, 10 * number + i)
                    for i, node in enumerate("ABC")
                ]
            )
    out = tmp_path / "history"
    assert main(["export", "join", "--store", str(path), "--out", str(out)]) == 0
    written = capsys.readouterr().out.split()
    readings = next(p for p in written if p.endswith("readings.csv"))
    with open(readings) as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 9 and {"round", "node", "value", "seq"} <= set(rows[0])


def test_export_of_an_unknown_experiment_says_which_exist(tmp_path, capsys):
    path = tmp_path / "agent.sqlite"
    with Store(path) as store:
        Experiment(chain_spec(), store)
    assert main(["export", "nope", "--store", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no experiment 'nope'" in err and "(known: join)" in err


def test_run_refuses_a_bad_spec_naming_the_field(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "x",
                "intervention": "soft",
                "nodes": [],
                "actions": [],
                "reward": {"node": "y"},
            }
        )
    )
    assert main(["run", str(spec), "--store", str(tmp_path / "s.db")]) == 2
    err = capsys.readouterr().err
    assert f"cbo-agent run: {spec}: nodes: needs at least 1 item, got 0" in err


def test_run_refuses_bad_configuration(tmp_path, capsys):
    config = tmp_path / "agent.yaml"
    config.write_text("metrics: {port: -1}\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("{}")
    assert main(["run", str(spec), "--config", str(config)]) == 2
    assert "metrics.port" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("/specs/experiment.yaml", "no such spec file; in a container, mount your specs at /specs"),
        ("{tmp}/missing.yaml", "missing.yaml: no such spec file"),
        ("{tmp}", "a directory, not a spec file"),
    ],
)
def test_run_names_a_missing_spec_file_in_one_line(tmp_path, capsys, where, message):
    """The image's default argument /specs/experiment.yaml exists only if mounted."""
    path = where.format(tmp=tmp_path)
    assert main(["run", path, "--store", str(tmp_path / "s.db")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"cbo-agent run: {path}: ") and message in line
    assert not (tmp_path / "s.db").exists()


# ---- commands of other rooms come from entry points; a broken install says so in one line ---


def test_an_unknown_command_is_named_in_one_line(capsys):
    assert main(["--log-level", "debug", "nosuch", "--flag"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("cbo-agent: no command 'nosuch' (this install has: run, sim, demo,")


def _install_whose_metadata_says(tmp_path: Path, entry_points: str | None) -> dict[str, str]:
    """The environment of a `cbo-agent` whose package metadata lists `entry_points` (None: no
    entry points at all), as a broken or outdated install leaves it: a copy of the metadata
    first on sys.path hides the installed one."""
    info = tmp_path / "site" / "cbo_agent-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cbo-agent\nVersion: 0.1.0\n")
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)
    return child_environment() | {"PYTHONPATH": os.pathsep.join([str(info.parent), str(ROOT)])}


def _cbo_agent(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*cli(), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_without_its_entry_point_bench_says_so_in_one_line(tmp_path):
    env = _install_whose_metadata_says(tmp_path, None)
    done = _cbo_agent(tmp_path, env, "bench", "gp-update", "--sizes", "10")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("cbo-agent: no command 'bench' (this install has: run, sim, ")
    assert "entry points of group cbo_agent.commands: reinstall cbo-agent" in line


def test_an_entry_point_that_fails_to_load_is_named_and_the_other_commands_work(tmp_path):
    env = _install_whose_metadata_says(
        tmp_path, "[cbo_agent.commands]\nbench = bench_gone.cli:register\n"
    )
    done = _cbo_agent(tmp_path, env, "bench", "gp-update", "--sizes", "10")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "cbo-agent bench: not available: its entry point bench = bench_gone.cli:register "
        "(group cbo_agent.commands) fails: ModuleNotFoundError: No module named 'bench_gone'"
    )
    helped = _cbo_agent(tmp_path, env, "--help")
    assert helped.returncode == 0 and "not available in this install: bench" in helped.stdout
    spec = str(ROOT / "examples" / "toygraph.yaml")
    assert _cbo_agent(tmp_path, env, "validate", spec).returncode == 0


# ---- the end of an experiment: exit 0 (default) or keep serving until SIGTERM ----------------


def _events(log: Path) -> list[dict]:
    events = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def _wait_for_event(log: Path, name: str, process: subprocess.Popen, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [e for e in _events(log) if e.get("event") == name]
        if found:
            return found[0]
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {name} in {timeout_s} s:\n{log.read_text()[-3000:]}")


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.status, reply.read().decode()


@pytest.mark.integration
def test_a_finished_agent_keeps_serving_when_asked_and_exits_0_by_default(mosquitto, tmp_path):
    """With --keep-serving the agent stays up after its last round (compose and Kubernetes
    restart whatever exits), serves its final metrics and health, says it has finished, and
    stops cleanly on SIGTERM; without it, the same finished experiment makes `run` exit 0."""
    spec = tmp_path / "keep.yaml"
    write_spec(spec, env="toygraph", rounds=3, budget_total=None, name="keep")
    environ = child_environment()
    agent = [*cli(), "run", str(spec), "--broker", mosquitto.url,
             "--store", str(tmp_path / "agent.sqlite"), "--metrics-port", "0"]  # fmt: skip
    device_argv = [*cli(), "sim", "toygraph", "--experiment", "keep", "--broker", mosquitto.url]
    log_path = tmp_path / "agent.log"
    with open(tmp_path / "device.log", "w") as device_log, open(log_path, "w") as log:
        device = subprocess.Popen(device_argv, stderr=device_log, stdout=device_log, env=environ)
        served = subprocess.Popen([*agent, "--keep-serving"], stderr=log, env=environ)
    try:
        url = _wait_for_event(log_path, "agent.started", served, 60)["metrics"]
        event = _wait_for_event(log_path, "agent.finished", served, 120)
        assert event["keep_serving"] is True and event["experiments"] == ["keep"]
        time.sleep(2.0)  # past the moment the default would have exited
        assert served.poll() is None, "the agent exited although told to keep serving"
        assert _get(f"{url}/healthz")[0] == 200
        assert _get(f"{url}/readyz")[0] == 200  # broker session kept
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(_get(f"{url}/metrics")[1])
            for s in family.samples
        }
        keep = (("experiment", "keep"),)
        assert samples[("cbo_experiment_finished", keep)] == 1
        assert samples[("cbo_rounds_total", keep)] == 3  # the final values stay visible
        assert ("cbo_cumulative_regret", keep) in samples
        served.send_signal(signal.SIGTERM)
        assert served.wait(30) == 0
    finally:
        for process in (served, device):
            if process.poll() is None:
                process.terminate()
                process.wait(30)
    names = [e["event"] for e in _events(log_path)]
    assert names[-2:] == ["agent.stopped", "process.stopping"]  # the store closed, then out

    # the default, for scripts and benchmarks: the finished experiment (replayed from the
    # store, as a restart would) makes `run` exit 0 by itself
    with open(tmp_path / "default.log", "w") as log:
        assert subprocess.run(agent, stderr=log, env=environ, timeout=120).returncode == 0
    finished = [e for e in _events(tmp_path / "default.log") if e["event"] == "agent.finished"]
    assert len(finished) == 1 and finished[0]["keep_serving"] is False
