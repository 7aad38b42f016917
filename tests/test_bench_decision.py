"""`cbo-agent bench decision`: proposal times per example, as a table and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import decision


def test_rows_hold_every_proposal_and_their_quantiles(tmp_path: Path) -> None:
    out = tmp_path / "decision.json"
    rows = decision.run(["dropwave"], "random", 5, 0, [], out)
    (row,) = rows
    assert row.env == "dropwave" and row.policy == "random" and row.status == "ok"
    assert row.rounds == len(row.seconds) == 5
    assert min(row.seconds) <= row.p50_s <= row.p95_s <= row.max_s == max(row.seconds)
    assert len(row.cpu_seconds) == 5 and row.cpu_p50_s <= row.cpu_max_s == max(row.cpu_seconds)
    assert row.cumulative_regret >= 0.0  # the oracle's optimum minus what each round earned
    payload = json.loads(out.read_text())
    assert payload["schema"] == decision.SCHEMA and payload["rows"][0]["seconds"] == row.seconds


def test_the_spec_policy_and_its_settings_are_the_default(tmp_path: Path) -> None:
    (row,) = decision.run(["weather"], None, 2, 0, [("mcbo", "no_such_setting", 1)], None)
    assert row.policy == "dgpucb" and row.rounds == 2 and row.status == "ok"
    (row,) = decision.run(["weather"], None, 1, 0, [("dgpucb", "no_such_setting", 1)], None)
    assert row.status.startswith("failed") and "no_such_setting" in row.status


def test_quantiles_of_few_values() -> None:
    assert decision.quantile([], 0.5) != decision.quantile([], 0.5)  # NaN
    assert decision.quantile([3.0], 0.95) == 3.0
    assert decision.quantile([1.0, 2.0, 3.0], 0.5) == 2.0


def test_an_unknown_environment_is_one_line_and_exit_code_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "bench", "decision", "--env", "nosuch"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "nosuch" in done.stderr
