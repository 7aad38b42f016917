"""A user's mistake on the command line: one line naming it, exit code 2, never a traceback —
and `run` finds it before it creates the store or binds the metrics port.

Most cases call `main` in this process (the same code path, a fraction of the time); a few run
the real command in a subprocess, all at once, to show what a user sees.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent.cli import main
from agent.experiment import Experiment
from connectors.store import Store
from core.spec import load_spec
from tests.brokers import free_port

ROOT = Path(__file__).resolve().parent.parent
DROPWAVE = ROOT / "examples" / "dropwave.yaml"


def _one_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    (line,) = captured.err.splitlines()
    assert line.startswith(f"cbo-agent {command}: ")
    return line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "nosuch"], "policy.name: unknown policy 'nosuch' (known: "),
        (["--policy", "mcb"], "unknown policy 'mcb' (did you mean 'mcbo'?)"),
        (["--set", "schedule.max_round=3"], "schedule.max_round: unknown key (did you mean"),
        (["--set", "policy.settings.bta=2"], "mcbo: policy.settings.bta: unknown key (did you"),
        (["--policy", "random", "--set", "policy.settings.beta=2"], "random: policy.settings.beta"),
        (["--set", "nodes.7.noise_std=0.1"], "--set nodes.7.noise_std: nodes is a list of 2"),
        (["--set", "schedule.max_rounds=-3"], "schedule.max_rounds: must be at least 1, got -3"),
        (["--broker", "http://127.0.0.1:1883"], "broker.url: 'http://127.0.0.1:1883': http://"),
        (["--broker", "mqtt://127.0.0.1:99999"], "port '99999' is not a number from 1 to 65535"),
        (["--broker", "127.0.0.1:"], "port '' is not a number from 1 to 65535"),
        (["--store", "/nonexistent-dir/agent.sqlite"], "the directory /nonexistent-dir does not"),
        (["--store", "{tmp}"], "is a directory; name a file in it"),
        (["--store", "sqlite:///nonexistent-dir/a.sqlite"], "the directory /nonexistent-dir does"),
        (["--store", "mysql://root:pw@db/x"], "store.path: unknown store scheme 'mysql'"),
        (
            ["--store", "postgresql://cbo:pw@127.0.0.1:9/x"],
            "cannot open store postgresql://cbo:***@",
        ),
        (["--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
        (["--connect-timeout", "-1"], "argument --connect-timeout: must be a positive number"),
        (["--log-level", "verbose"], "argument --log-level: invalid choice: 'verbose'"),
        (["--set", "nokey"], "argument --set: expected KEY=VALUE"),
    ],
)
def test_run_names_each_mistake_in_one_line_before_starting(tmp_path, capsys, argv, message):
    store = tmp_path / "agent.sqlite"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    store_given = "--store" in argv
    command = ["run", str(DROPWAVE), *([] if store_given else ["--store", str(store)]), *argv]
    assert exit_code(command) == 2
    line = _one_line(capsys, "run")
    assert message in line, line
    assert not store.exists()  # refused before the store was created


def exit_code(argv: list[str]) -> int:
    """What the process would exit with: `main`'s return, or argparse's SystemExit."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def test_run_refuses_a_metrics_port_in_use(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["run", str(DROPWAVE), "--store", str(tmp_path / "s.sqlite"),
                     "--metrics-port", str(port)])  # fmt: skip
    assert code == 2
    line = _one_line(capsys, "run")
    assert f"metrics port {port} on 127.0.0.1 is in use" in line and "--metrics-port" in line
    assert not (tmp_path / "s.sqlite").exists()


def test_run_refuses_a_spec_that_changed_an_experiment_of_its_store(tmp_path, capsys):
    store = tmp_path / "agent.sqlite"
    with Store(store) as opened:
        Experiment(load_spec(DROPWAVE), opened)
    code = main(["run", str(DROPWAVE), "--store", str(store), "--set", "model.kernel=rbf"])
    assert code == 2
    line = _one_line(capsys, "run")
    assert "experiment 'dropwave' is in the store" in line and "other model" in line


@pytest.mark.integration
def test_run_checks_a_postgres_store_as_it_checks_a_file(postgres_target, capsys):
    with Store(postgres_target) as opened:
        Experiment(load_spec(DROPWAVE), opened)
    code = main(["run", str(DROPWAVE), "--store", postgres_target, "--set", "model.kernel=rbf"])
    assert code == 2
    line = _one_line(capsys, "run")
    assert f"experiment 'dropwave' is in the store {postgres_target} with other model" in line


def test_run_refuses_two_specs_of_one_experiment(tmp_path, capsys):
    code = main(["run", str(DROPWAVE), str(DROPWAVE), "--store", str(tmp_path / "s.sqlite")])
    assert code == 2
    assert "two specs name the experiment 'dropwave'" in _one_line(capsys, "run")


def test_run_overrides_reach_the_spec_validated_like_the_spec(tmp_path):
    """--policy, --rounds, --seed and --set change every spec given, as if written in it."""
    from agent.cli import build_parser, spec_overrides
    from agent.preflight import load_run_specs

    args = build_parser().parse_args(
        ["run", str(DROPWAVE), "--policy", "random", "--rounds", "12", "--seed", "7",
         "--set", "constraints.budget_total=50", "--set", "policy.settings.max_draws=9"]
    )  # fmt: skip
    (spec,), problems = load_run_specs(args.specs, spec_overrides(args))
    assert problems == []
    assert (spec.policy.name, spec.policy.settings) == ("random", {"max_draws": 9})
    assert (spec.schedule.max_rounds, spec.initial_design.seed) == (12, 7)
    assert spec.constraints.budget_total == 50
    assert spec.design_rounds == 4  # the default design: at most a third of the rounds


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nosuch"], "unknown environment 'nosuch' (known: toygraph"),
        (["dropwav"], "unknown environment 'dropwav' (did you mean 'dropwave'?)"),
        (["dropwave", "--broker", "http://h"], "--broker 'http://h': http:// is not a broker"),
        (["dropwave", "--broker", "h:99999"], "port '99999' is not a number from 1 to 65535"),
        (["dropwave", "--delay", "-1"], "delay_s: must be at least 0"),
        (
            ["toygraph", "--send-states"],
            "--send-states: environment 'toygraph' does not record the states its episodes",
        ),
        (
            ["additive-er-20", "--send-states"],
            "--send-states: environment 'additive-er-20' does not record the states",
        ),
    ],
)
def test_sim_names_each_mistake_in_one_line(capsys, argv, message):
    assert main(["sim", *argv[:1], "--experiment", "x", *argv[1:]]) == 2
    line = _one_line(capsys, "sim")
    assert message in line, line


def test_what_a_user_sees_is_one_line_and_exit_code_2(tmp_path):
    """The real commands, in subprocesses run side by side (bounded)."""
    dead = f"mqtt://127.0.0.1:{free_port()}"
    cases = {
        "run-policy": ["run", str(DROPWAVE), "--policy", "nosuch"],
        "run-broker": ["run", str(DROPWAVE), "--broker", "http://127.0.0.1:1883"],
        "sim-env": ["sim", "nosuch", "--experiment", "x"],
        "demo-broker": ["demo", "--no-live", "--broker", dead, "--out", str(tmp_path / "demo")],
        "unknown-command": ["runn"],
    }

    def call(argv: list[str]) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "agent.cli", *argv]
        store = ["--store", str(tmp_path / "s.sqlite")] if argv[0] == "run" else []
        return subprocess.run(
            [*command, *store], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )

    with ThreadPoolExecutor(len(cases)) as pool:
        results = dict(zip(cases, pool.map(call, cases.values()), strict=True))
    for name, result in results.items():
        assert result.returncode == 2, (name, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, name
    assert "cannot connect (" in results["demo-broker"].stderr
    assert "no command 'runn' (did you mean 'run'?)" in results["unknown-command"].stderr
    assert not (tmp_path / "s.sqlite").exists() and not (tmp_path / "demo").exists()


@pytest.mark.parametrize(
    ("module", "env", "package", "extra"),
    [
        ("gymnasium_robotics", "mamujoco-swimmer", "gymnasium-robotics and mujoco", "mamujoco"),
        ("gymnasium_robotics", "mamujoco-ant", "gymnasium-robotics and mujoco", "mamujoco"),
        ("mpe2", "mpe-tag-hom", "mpe2", "mpe"),
        ("mpe2", "mpe-tag-het", "mpe2", "mpe"),
        ("pde", "brusselator", "py-pde", "pde"),
    ],
)
@pytest.mark.parametrize("command", ["bench", "sim"])
def test_an_environment_whose_extra_is_missing_names_the_extra(
    capsys, monkeypatch, module, env, package, extra, command
):
    """The image leaves the simulators' extras out: making such an environment is one line."""
    from sim.registry import make_environment

    monkeypatch.setitem(sys.modules, module, None)  # its import raises ImportError
    make_environment.cache_clear()
    argv = {
        "bench": ["bench", "regret", "--env", env, "--policy", "random", "--seeds", "1"],
        "sim": ["sim", env, "--experiment", "x", "--broker", "127.0.0.1:1"],
    }[command]
    assert main(argv) == 2
    line = _one_line(capsys, command)
    assert f"{env!r} needs {package} (not installed)" in line, line
    assert f"pip install 'cbo-agent[{extra}]'" in line, line


def test_the_environment_list_marks_an_environment_whose_extra_is_missing(capsys, monkeypatch):
    from sim.registry import make_environment

    monkeypatch.setitem(sys.modules, "gymnasium_robotics", None)
    monkeypatch.setitem(sys.modules, "mpe2", None)
    make_environment.cache_clear()
    assert main(["bench", "regret", "--list"]) == 0
    rows = {
        line.split()[1]: line
        for line in capsys.readouterr().out.splitlines()
        if "tag" in line or "mamujoco" in line
    }
    assert "needs the mamujoco extra" in rows["mamujoco-swimmer"], rows
    assert "needs the mamujoco extra" in rows["mamujoco-ant"], rows
    assert all("needs the mpe extra" in rows[n] for n in rows if "tag" in n), rows
    assert "needs the mpe extra" in rows["mpe-tag"] and "needs the mpe extra" in rows["mpe-tag-het"]
