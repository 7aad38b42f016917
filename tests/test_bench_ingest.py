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
