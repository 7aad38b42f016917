"""Faults a command cannot go on from end as one structured `agent.fatal` event and a non-zero
exit, never a traceback: a store whose disk fills up mid-run, a metrics port in use, TLS files
that cannot be used — for `run`, `sim` and `demo`, as subprocesses."""

from __future__ import annotations

import json
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection
from agent.serve import run_service
from connectors.store import Store
from core.spec import load_spec
from tests.brokers import free_port

ROOT = Path(__file__).resolve().parent.parent
TOYGRAPH = ROOT / "examples" / "toygraph.yaml"
TIMEOUT_S = 180


def cli(*args: str, file_size_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    """`cbo-agent --log-format json ARGS` in a subprocess; with `file_size_limit`, no file it
    writes may grow beyond that many bytes (writes past it fail with EFBIG: a full disk)."""

    def limit() -> None:
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write, do not kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "--log-format", "json", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=limit,
    )


def the_fatal_event(result: subprocess.CompletedProcess[str]) -> dict:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    events = []
    for line in result.stderr.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"a line that is no structured event: {line!r}")
    (fatal,) = [e for e in events if e["event"] == "agent.fatal"]
    assert fatal["level"] == "error" and fatal["exit_code"] == result.returncode != 0
    return fatal


@pytest.mark.integration
def test_a_store_whose_disk_fills_up_mid_run_ends_in_one_fatal_event(mosquitto, tmp_path):
    store = tmp_path / "agent.sqlite"
    Store(store).close()  # created and migrated: the run starts, then its writes fill the "disk"
    limit = store.stat().st_size + 24 * 4096
    device = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--log-level", "warning", "sim", "toygraph",
         "--experiment", "toygraph", "--broker", mosquitto.url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        result = cli(
            "run", str(TOYGRAPH), "--broker", mosquitto.url, "--store", str(store),
            "--metrics-port", "0", "--rounds", "500", "--policy", "random",
            file_size_limit=limit,
        )  # fmt: skip
    finally:
        device.terminate()
        device.wait(timeout=30)
    fatal = the_fatal_event(result)
    assert result.returncode == 1
    assert fatal["reason"].startswith("store_") and fatal["error_type"] == "StoreError"
    assert "agent.started" in result.stderr and '"round.closed"' in result.stderr  # mid-run


def test_a_metrics_port_in_use_ends_run_in_one_fatal_event(tmp_path, capsys):
    """`run` refuses a port in use before it starts (one line, exit 2); one taken between that
    check and the start ends the service in `agent.fatal` (here: the service itself)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli(
            "run", str(TOYGRAPH), "--broker", f"127.0.0.1:{free_port()}",
            "--store", str(tmp_path / "cli.sqlite"), "--metrics-port", str(port),
        )  # fmt: skip
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert "is in use" in result.stderr
        config = AgentConfig(
            broker=BrokerSection(url=f"127.0.0.1:{free_port()}"),
            metrics=MetricsSection(port=port),
            store=StoreSection(path=str(tmp_path / "agent.sqlite")),
        )
        with capture_logs() as events:
            code = run_service([load_spec(TOYGRAPH)], config)
    (fatal,) = [e for e in events if e["event"] == "agent.fatal"]
    assert (code, fatal["reason"], fatal["exit_code"]) == (2, "metrics_port_unavailable", 2)
    assert fatal["address"] == f"127.0.0.1:{port}" and "in use" in fatal["error"]
    assert fatal["log_level"] == "error"


@pytest.mark.parametrize("command", ["run", "sim"])
def test_a_ca_file_that_cannot_be_read_ends_in_one_fatal_event(tmp_path, command):
    missing = tmp_path / "no-such-ca.pem"
    broker = f"mqtts://127.0.0.1:{free_port()}"
    if command == "run":
        args = ["run", str(TOYGRAPH), "--broker", broker, "--metrics-port", "0",
                "--store", str(tmp_path / "agent.sqlite")]  # fmt: skip
        env_ca = {"CBO_BROKER_CA_FILE": str(missing)}
    else:
        args = ["sim", "toygraph", "--experiment", "toygraph", "--broker", broker,
                "--ca-file", str(missing)]  # fmt: skip
        env_ca = {}
    import os

    result = subprocess.run(
        [sys.executable, "-m", "agent.cli", "--log-format", "json", *args],
        capture_output=True, text=True, timeout=TIMEOUT_S, env=os.environ | env_ca,
    )  # fmt: skip
    fatal = the_fatal_event(result)
    assert (result.returncode, fatal["reason"]) == (2, "tls_options")
    assert str(missing) in fatal["error"] and "No such file" in fatal["error"]


def test_sim_refuses_a_ca_file_without_tls_in_one_line(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    result = cli("sim", "toygraph", "--experiment", "x", "--broker", "mqtt://127.0.0.1:1",
                 "--ca-file", str(ca))  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "need tls=True" in result.stderr, result.stderr


@pytest.mark.integration
def test_a_demo_whose_disk_fills_up_mid_run_ends_in_one_fatal_event(tmp_path):
    """The demo (embedded broker, simulator, agent) with its files limited to 180 kB: the store
    is created and round 0 runs, then a commit fails — one agent.fatal, exit 1, no traceback."""
    result = cli(
        "demo", "--no-live", "--rounds", "40", "--policy", "random", "--metrics-port", "0",
        "--out", str(tmp_path / "demo"),
        file_size_limit=180_000,
    )  # fmt: skip
    fatal = the_fatal_event(result)
    assert (result.returncode, fatal["command"]) == (1, "demo")
    assert fatal["reason"].startswith("store_") and fatal["error_type"] == "StoreError"
    assert "round 0 by" in result.stdout  # mid-run


def test_a_demo_out_below_a_file_is_one_line_and_exit_2(tmp_path):
    taken = tmp_path / "file"
    taken.write_text("")
    result = cli("demo", "--no-live", "--metrics-port", "0", "--out", str(taken / "demo"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"--out {taken / 'demo'}: Not a directory" in result.stderr
