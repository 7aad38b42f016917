"""Which environments `cbo-agent bench ingest` measures decision latency on (no broker here)."""

from __future__ import annotations

import pytest
import yaml

from agent.paths import EXAMPLES_ENV_VAR, examples_dir
from bench import ingest
from sim.registry import environment_names


def test_all_and_the_default_mean_every_environment_with_a_spec():
    shipped = [n for n in environment_names() if (examples_dir() / f"{n}.yaml").is_file()]
    assert {"sir", "weather", "decomposed-synthetic", "alpine2-budget", "toygraph"} <= set(shipped)
    assert ingest.latency_env_names() == shipped
    assert ingest.latency_env_names(["all"]) == shipped
    assert ingest.latency_env_names(["sir", "all"]) == ["sir", *(n for n in shipped if n != "sir")]
    assert ingest.latency_env_names(["weather", "sir", "weather"]) == ["weather", "sir"]
    assert ingest.latency_env_names([]) == []


def test_all_skips_environments_without_a_spec(tmp_path, monkeypatch):
    (tmp_path / "sir.yaml").write_text(yaml.safe_dump({"placeholder": True}))
    monkeypatch.setenv(EXAMPLES_ENV_VAR, str(tmp_path))
    assert ingest.latency_env_names(["all"]) == ["sir"]
    with pytest.raises(ValueError, match=r"no spec in examples/ for \['weather'\]"):
        ingest.latency_env_names(["weather"])


def test_an_unknown_name_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match=r"unknown environment\(s\) \['nowhere'\]; known: .*all"):
        ingest.latency_env_names(["sir", "nowhere"])
    with pytest.raises(ValueError, match="unknown environment"):
        ingest.run(latency_envs=["nowhere"])  # raises before the broker starts


def test_the_shipped_broker_configuration_is_read_for_its_behaviour(tmp_path):
    from bench.harness.shipped_broker import SHIPPED_CONF, shipped_broker

    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        "allow_anonymous false\npassword_file /x\npersistence true\n"
        "autosave_on_changes true  # every change\nmax_inflight_messages 1000\n"
        "max_queued_messages 100000\nlistener 1883\n"
    )
    broker = shipped_broker(conf)
    assert broker.settings == {
        "autosave_on_changes": "true",
        "max_inflight_messages": "1000",
        "max_queued_messages": "100000",
    }
    assert broker.persistence and broker.max_queued_messages == 100000
    options = broker.options(tmp_path)
    assert options.persistence_dir == tmp_path / "mosquitto-data"
    assert "max_inflight_messages 1000" in options.extra_lines
    assert not any("listener" in line or "password" in line for line in options.extra_lines)
    defaults = tmp_path / "defaults.conf"
    defaults.write_text("listener 1883\n")
    assert shipped_broker(defaults).max_queued_messages == 1000  # Mosquitto's default
    assert shipped_broker(defaults).max_inflight_messages == 20
    assert SHIPPED_CONF.is_file()  # the benchmarks read the repository's own file


@pytest.mark.parametrize(("line", "interval"), [("autosave_interval 100\n", 100), ("", 1800)])
def test_the_benchmark_broker_saves_as_often_as_the_shipped_file_says(tmp_path, line, interval):
    """autosave_interval reaches the broker's configuration (the harness's own 1 does not
    replace it); Mosquitto's default 1800 where the file does not set it."""
    from bench.harness.shipped_broker import shipped_broker
    from connectors.mosquitto import MosquittoBroker

    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"persistence true\nautosave_on_changes true\n{line}listener 1883\n")
    shipped = shipped_broker(conf)
    assert shipped.autosave_interval == interval
    assert f"autosave_interval {interval}" in shipped.describe()
    try:
        broker = MosquittoBroker(tmp_path / "m", shipped.options(tmp_path))
    except FileNotFoundError:
        pytest.skip("mosquitto is not installed")
    written = [raw for raw in broker._render_config().splitlines() if raw.startswith("autosave")]
    assert sorted(written) == [f"autosave_interval {interval}", "autosave_on_changes true"]


def test_more_readings_than_the_shipped_queue_holds_is_refused(tmp_path, monkeypatch):
    import asyncio

    from bench.harness.shipped_broker import shipped_broker

    conf = tmp_path / "mosquitto.conf"
    conf.write_text("max_queued_messages 10\n")
    shipped = shipped_broker(conf)
    with pytest.raises(ingest.QueueTooSmall, match=r"queues at most 10 .* use --rounds 3 or fewer"):
        asyncio.run(ingest.measure_throughput("toygraph", 5, None, tmp_path, shipped))


def _piece(index: int, rate: float, **changes) -> ingest.IngestResult:
    """A throughput piece as `run(repeat_index=index)` gives it: one pair of runs."""
    fields = {
        "readings": 60,
        "rounds": 10,
        "nodes": 6,
        "broker": "mosquitto.conf: max_inflight_messages 20",
        "bare_runs": [2 * rate],
        "agent_runs": [rate],
        "bare_cpu_ms": [0.4],
        "agent_cpu_ms": [0.5],
        "repeat_indices": [index],
        "load_average": [1.0 + index],
    }
    return ingest.IngestResult(**{**fields, **changes})


def _write(path, result, latencies=()):
    import json
    from dataclasses import asdict

    payload = {
        "machine": {"cpu": "x"},
        "load_average": [1.0, 1.0, 1.0],
        "ingest": None if result is None else {**result.summary(), "device": "cpu"},
        "decision_latency": [asdict(r) for r in latencies],
    }
    path.write_text(json.dumps(payload))
    return path


def test_pieces_merge_into_the_table_a_full_run_gives(tmp_path):
    """Repeats run as separate pieces (each its own sitting) are put back in repeat order,
    whatever order the files come in; latencies-only pieces add their rows."""
    sir = ingest.LatencyResult("sir", "mcbo", 20, 0.2, 0.4, 0.1, 1.0)
    paths = [_write(tmp_path / f"p{i}.json", _piece(i, 100.0 * (i + 1))) for i in (2, 0, 1)]
    paths.append(_write(tmp_path / "lat.json", None, [sir]))
    result, latencies = ingest.merge(paths, tmp_path / "all.json")
    assert result is not None
    assert result.repeat_indices == [0, 1, 2]
    assert result.agent_runs == [100.0, 200.0, 300.0]
    assert result.bare_runs == [200.0, 400.0, 600.0]
    assert result.load_average == [1.0, 2.0, 3.0]
    assert result.ratio == 0.5 and result.agent_msgs_per_s == 200.0
    assert [r.env for r in latencies] == ["sir"]
    import json

    written = json.loads((tmp_path / "all.json").read_text())
    assert written["ingest"]["agent_runs"] == [100.0, 200.0, 300.0]
    assert written["decision_latency"][0]["env"] == "sir"


def test_pieces_of_different_tables_are_refused(tmp_path):
    one = _write(tmp_path / "a.json", _piece(0, 100.0))
    with pytest.raises(ingest.BadPieces, match="a repeat appears twice"):
        ingest.merge([one, _write(tmp_path / "b.json", _piece(0, 120.0))])
    with pytest.raises(ingest.BadPieces, match="pieces measured different things"):
        ingest.merge([one, _write(tmp_path / "c.json", _piece(1, 120.0, rounds=20))])
    (tmp_path / "d.json").write_text("[1, 2]")
    with pytest.raises(ingest.BadPieces, match="not a bench ingest JSON file"):
        ingest.merge([one, tmp_path / "d.json"])


def test_piece_mistakes_are_one_line_and_exit_code_2(tmp_path, capsys):
    from agent.cli import main

    one = _write(tmp_path / "a.json", _piece(0, 100.0))
    assert main(["bench", "ingest", "--merge", str(one), str(one)]) == 2
    assert main(["bench", "ingest", "--repeat-index", "2", "--latency-envs"]) == 2
    assert main(["bench", "ingest", "--repeat-index", "6", "--json", str(tmp_path / "x.json")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [
        "cbo-agent bench ingest: error: a repeat appears twice among the pieces: [0, 0]",
        "cbo-agent bench ingest: error: a piece (--repeat-index, --no-throughput) needs --json",
        "cbo-agent bench ingest: error: repeat index 6 is not among 1..5",
    ]
