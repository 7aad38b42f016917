"""The gp-update benchmark runs end to end at a tiny size and writes what it promises."""

from __future__ import annotations

import json

from agent.cli import main
from bench import gp_update


def test_gp_update_benchmark_writes_json_and_plot(tmp_path):
    json_path, plot_path = tmp_path / "gp.json", tmp_path / "gp.png"
    rows = gp_update.run([30, 60], dim=3, batch=2, json_path=json_path, plot_path=plot_path, reps=3)
    assert [(r.n, r.batch) for r in rows] == [(30, 1), (60, 1), (30, 2), (60, 2)]
    saved = json.loads(json_path.read_text())
    fields = {
        "n",
        "batch",
        "append_s",
        "botorch_condition_s",
        "refactor_s",
        "triangular_solve_s",
        "bytes_per_node",
        "mean_rel_diff",
        "variance_rel_diff",
        "device",
        "device_name",
    }
    assert all(set(row) == fields for row in saved["rows"])
    assert {(row["device"], row["device_name"]) for row in saved["rows"]} == {
        (saved["devices"][0]["device"], saved["devices"][0]["device_name"])
    }
    assert saved["devices"][0]["device"] == "cpu" and saved["devices"][0]["device_name"]
    # checked against BoTorch's exact posterior: the mean and the variance
    assert all(row["variance_rel_diff"] < 1e-6 for row in saved["rows"])
    assert all(row["append_s"] > 0 and row["bytes_per_node"] > 0 for row in saved["rows"])
    assert plot_path.stat().st_size > 10_000


def test_cli_runs_the_benchmark(tmp_path, capsys):
    assert (
        main(
            [
                "bench",
                "gp-update",
                "--sizes",
                "20",
                "--dim",
                "2",
                "--batch",
                "2",
                "--reps",
                "2",
                "--json",
                str(tmp_path / "out.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.index("c/a") < out.index("b/a")  # the refactor ratio leads
    assert (tmp_path / "out.png").exists()
