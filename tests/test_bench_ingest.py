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
