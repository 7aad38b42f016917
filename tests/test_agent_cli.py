"""The command line: export, and the service's refusal of bad specs and configuration."""

from __future__ import annotations

import csv

import yaml

from agent.cli import main
from agent.experiment import Experiment
from connectors.store import Store
from tests.test_agent_join import ack, chain_spec, reading


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
    assert f"{spec}: nodes: List should have at least 1 item" in err


def test_run_refuses_bad_configuration(tmp_path, capsys):
    config = tmp_path / "agent.yaml"
    config.write_text("metrics: {port: -1}\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("{}")
    assert main(["run", str(spec), "--config", str(config)]) == 2
    assert "metrics.port" in capsys.readouterr().err
