"""The demo path end to end: embedded broker, simulator device, agent, plot."""

from __future__ import annotations

import asyncio

import pytest
from rich.console import Console

from agent.cli import main
from agent.demo import DemoOptions, run_demo
from connectors.store import Store


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
    assert (tmp_path / "regret.png").exists()
