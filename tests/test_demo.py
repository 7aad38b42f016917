"""The demo path end to end: embedded broker, simulator device, agent, plot."""

from __future__ import annotations

import asyncio
import socket
from http.server import ThreadingHTTPServer

import pytest
import torch
from rich.console import Console

from agent.cli import main
from agent.demo import (
    SPEC_ENV_SEED,
    DemoError,
    DemoOptions,
    check_metrics_port,
    prepare_demo,
    run_demo,
)
from connectors.store import Store
from sim.registry import make_environment
from tests.brokers import free_port


@pytest.mark.integration
def test_demo_runs_a_few_rounds_on_the_embedded_broker(tmp_path):
    options = DemoOptions(rounds=8, live=False, out=tmp_path, metrics_port=0)
    result = asyncio.run(run_demo(options, Console(width=120, record=True)))
    assert result.rounds == 8
    assert result.initial_rounds == 2  # a third of the rounds, at most 2(A+1)
    assert result.plot is not None and result.plot.stat().st_size > 10_000
    assert result.cumulative_regret[-1] >= 0
    with Store(tmp_path / "demo.sqlite") as store:
        (name,) = store.experiment_names()
        assert {r.status for r in store.rounds(name)} == {"closed"}
        assert len(store.readings(name)) == 8 * 2  # dropwave: X0 and Y every round


@pytest.mark.integration
def test_demo_command_prints_rounds_and_the_plot(tmp_path, capsys):
    code = main(
        [
            "demo",
            "--no-live",
            "--rounds",
            "5",
            "--metrics-port",
            "0",
            "--out",
            str(tmp_path),
            "--env",
            "toygraph",
            "--policy",
            "random",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("round ") >= 5 and "regret plot:" in out
    assert "round 0 by random (design) action" in out  # the design's rounds are marked
    assert "no new rounds: max_rounds reached" in out and "round None" not in out
    assert (tmp_path / "regret.png").exists()


def test_demo_refuses_a_policy_its_environment_cannot_use_before_starting(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(["demo", "--no-live", "--policy", "dgpucb", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    (line,) = captured.err.splitlines()
    assert line.startswith("cbo-agent demo: error: --policy dgpucb on --env dropwave:")
    # the environments it names grow with the registry: check the hint's shape and a few members
    assert "not decomposed" in line and "needs a decomposed reward: --env " in line
    named = line.split("needs a decomposed reward: --env ", 1)[1].rstrip(")").split(", ")
    assert {"decomposed-synthetic", "sir", "weather"} <= set(named) and "dropwave" not in named
    assert "Traceback" not in captured.err and captured.out == ""
    assert not out.exists()  # nothing started: no store, no plot


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "nowhere"], "unknown environment 'nowhere' (known: toygraph"),
        (["--env", "dropwav"], "unknown environment 'dropwav' (did you mean 'dropwave'?)"),
        (["--policy", "nope"], "policy.name: unknown policy 'nope'"),
        (["--broker", "http://localhost"], "--broker 'http://localhost': http:// is not a broker"),
        (["--broker", "127.0.0.1:99999"], "port '99999' is not a number from 1 to 65535"),
        (["--broker", f"mqtt://127.0.0.1:{free_port()}"], "cannot connect ("),
    ],
)
def test_demo_refuses_bad_options_in_one_line(tmp_path, capsys, argv, message):
    assert main(["demo", "--no-live", "--out", str(tmp_path / "demo"), *argv]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("cbo-agent demo: error:") and message in line


def test_demo_refuses_a_metrics_port_in_use_instead_of_moving(tmp_path, capsys):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = tmp_path / "demo"
        code = main(["demo", "--no-live", "--metrics-port", str(port), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    (line,) = captured.err.splitlines()
    assert line.startswith(f"cbo-agent demo: error: --metrics-port {port}: cannot listen on")
    assert "Traceback" not in captured.err and not out.exists()


def _port_in_time_wait() -> int:
    """A loopback port with no listener left, only a connection in TIME_WAIT (its side closed
    first), as a demo that just ended leaves its metrics port."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server's
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: TIME_WAIT on `port`
            client.recv(1)
    return port


def test_a_metrics_port_in_time_wait_is_free_as_for_the_server():
    port = _port_in_time_wait()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # the old probe: no SO_REUSEADDR, "busy"
    check_metrics_port("127.0.0.1", port)  # the probe binds as the server does
    assert ThreadingHTTPServer.allow_reuse_address
    server = ThreadingHTTPServer(("127.0.0.1", port), None)  # and the server does bind
    server.server_close()
    check_metrics_port("127.0.0.1", 0)  # any free port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(DemoError, match=f"--metrics-port {holder.getsockname()[1]}:"):
            check_metrics_port("127.0.0.1", holder.getsockname()[1])


@pytest.mark.integration
def test_demo_seed_varies_the_run_not_the_environment_of_the_spec(tmp_path):
    """weather draws other sensors per seed; the demo's device must be the spec's instance, or
    it would reject every action (off its sensors)."""
    options = DemoOptions(
        env="weather", policy="random", rounds=3, seed=1, live=False, out=tmp_path, metrics_port=0
    )
    spec, env = prepare_demo(options)
    assert env is make_environment("weather", SPEC_ENV_SEED)
    assert torch.equal(torch.as_tensor(spec.candidates, dtype=env.candidates.dtype), env.candidates)
    assert spec.initial_design.seed == 1
    result = asyncio.run(run_demo(options, Console(width=120, record=True)))
    assert result.rounds == 3
    with Store(tmp_path / "demo.sqlite") as store:
        (name,) = store.experiment_names()
        assert {r.status for r in store.rounds(name)} == {"closed"}
        assert len(store.readings(name)) >= 3 * 3  # the three components of every round
