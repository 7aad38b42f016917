"""The store benchmark writes what the agent writes per round, on each backend, and reports
rows that say so; a PostgreSQL server it cannot reach is one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

from agent.cli import main
from bench import store as store_bench
from connectors.store import Store
from core.spec import load_spec
from tests.brokers import free_port

SPEC = Path(__file__).resolve().parents[1] / "examples" / "alpine2.yaml"


def test_a_benchmark_round_is_the_agents_round(store_target: str) -> None:
    spec = load_spec(SPEC)
    with Store(store_target) as store:
        writes = store_bench.write_rounds(store, spec, 7)
        rounds = store.rounds(spec.name)
        assert [(r.round, r.status, r.attempt) for r in rounds] == [
            (r, "closed", 1) for r in range(7)
        ]
        assert all(r.intervention.keys() == {a.name for a in spec.actions} for r in rounds)
        readings = store.readings(spec.name)
        assert len(readings) == 7 * len(spec.node_names)
        assert {r.node for r in readings} == set(spec.node_names)
        totals = store.ledger(spec.name)
        assert totals.settled == sum(r.cost for r in rounds) and totals.reserved == 0
    assert writes == 7 + len(spec.node_names)  # 2 propose, 2 publish, 2 ack, readings, close


def test_the_cli_writes_rows_per_run_and_per_backend(
    tmp_path: Path, capsys, postgres_target: str
) -> None:
    out = tmp_path / "store.json"
    args = ["bench", "store", "--spec", str(SPEC), "--rounds", "5", "--repeats", "2"]
    assert main([*args, "--workdir", str(tmp_path), "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert [(r["backend"], r["repeat"]) for r in saved["runs"]] == [
        ("sqlite", 0), ("postgresql", 0), ("postgresql", 1), ("sqlite", 1),
    ]  # fmt: skip
    assert [row["backend"] for row in saved["summary"]] == ["sqlite", "postgresql"]
    for row in saved["summary"]:
        assert row["repeats"] == 2 and row["rounds_per_s"] > 0
        assert row["bytes_per_1000_rounds"] >= 0  # five rounds may fit in pages already there
        assert row["rounds_per_s_min"] <= row["rounds_per_s"] <= row["rounds_per_s_max"]
    assert "rounds/s" in capsys.readouterr().out


def test_an_unreachable_postgres_is_one_line(capsys) -> None:
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    assert main(["bench", "store", "--rounds", "1", "--postgres", closed]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("cbo-agent bench store: no PostgreSQL at --postgres")
        and err.count("\n") == 1
    )
