"""`cbo-agent bench stream` (model-only and `--service`, through a real Mosquitto) and `bench
drift` run end to end, small, and refuse bad arguments."""

from __future__ import annotations

import contextlib
import json
import sqlite3

import numpy as np
import pytest

from agent.cli import main
from bench import drift
from bench.stream import checkpoints, state_path, stream_readings
from connectors.mosquitto import find_mosquitto


def test_checkpoints_climb_a_ladder_and_include_the_capacity():
    assert checkpoints(100_000, 2000) == [1000, 2000, 4000, 5000, 10_000, 20_000, 50_000, 100_000]
    assert checkpoints(600, None) == [600]


def test_stream_records_checkpoints_and_settles_at_the_budget(tmp_path):
    path = tmp_path / "stream.json"
    code = main(["bench", "stream", "--rounds", "1500", "--capacity", "200", "--budget", "100",
                 "--nodes", "2", "--dim", "2", "--no-refits", "--json", str(path)])  # fmt: skip
    assert code == 0
    result = json.loads(path.read_text())
    rows = {c["n"]: c for c in result["checkpoints"]}
    assert sorted(rows) == [200, 400, 1000, 1500]
    assert rows[200]["rows"] == 200 and not rows[200]["switched"]
    assert rows[1000]["rows"] == rows[1500]["rows"] == 100 and rows[1500]["switched"]
    assert rows[1500]["update_p99_ms"] >= rows[1500]["update_p50_ms"] > 0
    assert rows[1500]["update_cpu_p99_ms"] >= rows[1500]["update_cpu_p50_ms"] > 0
    assert result["flat_after_budget"]["rss_mb"] >= 1.0
    assert result["flat_after_budget"]["update_cpu_p99_ms"] >= 1.0


def test_a_stream_cut_at_a_checkpoint_resumes_to_the_same_model(tmp_path):
    """A run stopped after a checkpoint and resumed in pieces (the model from its state file,
    the readings regenerated) ends with the kept rows and rows counts of a run that never
    stopped; a finished run or a missing one is refused in one line."""
    whole, cut = tmp_path / "whole.json", tmp_path / "cut.json"
    args = ["bench", "stream", "--rounds", "600", "--capacity", "200", "--budget", "100",
            "--nodes", "2", "--dim", "2", "--no-refits"]  # fmt: skip
    assert main([*args, "--json", str(whole)]) == 0
    assert main([*args, "--json", str(cut), "--stop-after", "200"]) == 0
    assert [c["n"] for c in json.loads(cut.read_text())["checkpoints"]] == [200]
    assert main(["bench", "stream", "--json", str(cut), "--resume", "--stop-after", "400"]) == 0
    assert main(["bench", "stream", "--json", str(cut), "--resume"]) == 0
    done, want = json.loads(cut.read_text()), json.loads(whole.read_text())
    assert done["resumed_at"] == [200, 400]
    assert [(c["n"], c["rows"]) for c in done["checkpoints"]] == [
        (c["n"], c["rows"]) for c in want["checkpoints"]
    ]
    with (
        np.load(state_path(cut), allow_pickle=False) as a,
        np.load(state_path(whole), allow_pickle=False) as b,
    ):
        assert int(a["n"]) == int(b["n"]) == 600
        np.testing.assert_allclose(a["kept_z"], b["kept_z"], rtol=0, atol=0)
        np.testing.assert_allclose(a["kept_y"], b["kept_y"], rtol=0, atol=0)
        np.testing.assert_allclose(a["kept_seen"], b["kept_seen"], rtol=0, atol=0)
    assert main(["bench", "stream", "--json", str(cut), "--resume"]) == 2  # finished
    assert main(["bench", "stream", "--json", str(tmp_path / "none.json"), "--resume"]) == 2


def test_drift_compares_models_on_the_same_seeds(tmp_path):
    path = tmp_path / "drift.json"
    code = main(["bench", "drift", "--env", "dropwave-drift", "--models", "stationary", "time",
                 "--seeds", "2", "--rounds", "14", "--json", str(path)])  # fmt: skip
    assert code == 0
    runs = json.loads(path.read_text())["runs"]
    # seed by seed: a campaign cut off keeps whole seeds, paired
    assert [(r["model"], r["seed"]) for r in runs] == [
        ("stationary", 0), ("time", 0), ("stationary", 1), ("time", 1)
    ]  # fmt: skip
    assert all(0 < r["regret"] < 14 * 0.75 for r in runs)  # f* = 0.742 per round at most
    # the first 10 rounds are the same random design for both models, and differ by seed
    assert runs[0]["regret"] != runs[2]["regret"]

    # two workers (spawned processes, one torch thread each) give every run the same regret
    parallel = tmp_path / "parallel.json"
    code = main(["bench", "drift", "--env", "dropwave-drift", "--models", "stationary", "time",
                 "--seeds", "2", "--rounds", "14", "--workers", "2",
                 "--json", str(parallel)])  # fmt: skip
    assert code == 0
    again = json.loads(parallel.read_text())["runs"]
    assert [(r["model"], r["seed"], r["regret"]) for r in again] == [
        (r["model"], r["seed"], r["regret"]) for r in runs
    ]


def test_drift_learns_the_flat_models_noise(monkeypatch):
    """The flat GP sees Var(Y | a), which on dropwave-drift holds X0's noise passed through the
    ripple (Y's std given the actions is 0.25-0.34, the reward node's own 0.1). Told the node's
    0.01, the fit of the harness's readings put a lengthscale at its floor (0.0015 by round
    100, seed 0) and the GP decided as on white noise; learned, the noise comes out well above
    the node's (it is 0.01 exactly if the harness states it) and the lengthscales stay on the
    scale of the function's shape."""
    made = []

    def spy(*args, **kwargs):
        gp = make_model(*args, **kwargs)
        made.append(gp)
        return gp

    make_model = drift._model
    monkeypatch.setattr(drift, "_model", spy)
    options = {"capacity": 100, "budget": 60, "window": 100, "time_scale": 300.0,
               "refit_every": 20, "initial": 10}  # fmt: skip
    drift.run_one("dropwave-drift", "stationary", 0, 60, options)
    (gp,) = made
    noise = float(gp.noise[0] * gp.y_scale[0] ** 2)  # output units
    assert noise > 4 * 0.1**2
    assert float(gp.lengthscale.min()) > 0.01


def test_drift_keeps_sir_within_its_dose_budget(tmp_path):
    """The seasonal SIR task's actions are vaccination rates under a dose budget: every round's
    action (the random first ones, the UCB choices) is feasible, so no round beats the
    optimum under the budget and the dynamic regret is not negative (it was: -5.2 over 12
    rounds, candidates from the box)."""
    path = tmp_path / "sir.json"
    code = main(["bench", "drift", "--env", "sir-seasonal", "--models", "stationary", "change",
                 "--seeds", "1", "--rounds", "6", "--initial", "3",
                 "--json", str(path)])  # fmt: skip
    assert code == 0
    runs = json.loads(path.read_text())["runs"]
    assert [r["infeasible"] for r in runs] == [0, 0]
    assert all(r["regret"] > -1e-6 for r in runs)


def test_drift_runs_the_periodic_model_on_the_school_calendar(tmp_path, monkeypatch):
    """`--models period`: a TemporalGP with the period's two columns after the round; on
    sir-school-terms within the dose budget, the dynamic regret summed over a holiday and term
    weeks (round 0 is the Christmas holiday, round 2 term)."""
    made = []
    original = drift._model

    def spy(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(drift, "_model", spy)
    path = tmp_path / "school.json"
    code = main(["bench", "drift", "--env", "sir-school-terms", "--models", "period",
                 "--seeds", "1", "--rounds", "6", "--initial", "3", "--period", "26",
                 "--json", str(path)])  # fmt: skip
    assert code == 0
    (run,) = json.loads(path.read_text())["runs"]
    assert run["model"] == "period" and run["infeasible"] == 0 and run["regret"] > 0
    (gp,) = made
    assert gp.period == 26.0 and gp.gp.dim == 5 + 3  # five actions, the round, cos, sin
    rows, _ = gp.gp.member_data(0)
    assert rows.shape == (6, 8)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stream", "--capacity", "10", "--budget", "20"], "--budget needs a --capacity"),
        (["drift", "--models", "nope"], "unknown model 'nope'"),
        (["drift", "--env", "nowhere"], "unknown environment 'nowhere'"),
    ],
)
def test_bad_arguments_fail_with_one_line(args, message, capsys):
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed")
def test_stream_through_the_service_on_a_real_broker(tmp_path):
    """`--service`: the readings go through Mosquitto and the running agent, whose bounded
    node GPs switch at the capacity and settle at the budget; the checkpoints are the
    model-only run's, marked `mode: service`, with the service's windows beside them."""
    path, store = tmp_path / "service.json", tmp_path / "agent.sqlite"
    code = main(["bench", "stream", "--service", "--rounds", "60", "--capacity", "20",
                 "--budget", "10", "--nodes", "2", "--dim", "2", "--time-limit", "240",
                 "--store", str(store), "--json", str(path)])  # fmt: skip
    assert code == 0
    # the agent stored the stream's own readings, and as applied the stream's inputs
    x, y = stream_readings(60, 2, 2, 0)
    with contextlib.closing(sqlite3.connect(store)) as db:
        readings = db.execute("SELECT round, node, value FROM readings").fetchall()
        applied = dict(db.execute("SELECT round, applied FROM rounds").fetchall())
    assert len(readings) == 120
    for t, node, value in readings:
        assert value == y[t, int(node.removeprefix("X"))].item()
    assert sorted(applied) == list(range(60))
    for t, values in applied.items():
        want = {f"a{i}_{j}": x[t, i, j].item() for i in range(2) for j in range(2)}
        assert json.loads(values) == want
    result = json.loads(path.read_text())
    assert result["mode"] == "service" and result["rounds"] == result["reached"] == 60
    rows = {c["n"]: c for c in result["checkpoints"]}
    assert sorted(rows) == [20, 40, 60]  # the run reached its end within the time limit
    assert all(c["mode"] == "service" and c["update_cpu_p99_ms"] is None for c in rows.values())
    assert rows[20]["rows"] == 20 and not rows[20]["switched"]
    assert rows[40]["rows"] == rows[60]["rows"] == 10 and rows[60]["switched"]
    assert rows[60]["update_p99_ms"] >= rows[60]["update_p50_ms"] > 0
    assert rows[60]["rss_mb"] > 0
    windows = result["windows"]
    assert [w["n"] for w in windows] == [20, 40, 60]
    assert all(w["readings_per_s"] > 0 and w["gp_update_mean_ms"] > 0 for w in windows)
    assert result["flat_after_budget"]["rss_mb"] >= 1.0  # one settled window: 40 -> 60


def test_the_agents_per_round_records_stop_growing_past_the_capacity_on_a_real_broker(tmp_path):
    """Issue 22 through the service: past the capacity a round leaves the agent's memory when
    it closes (the store keeps it) and the model holds its newest max(capacity, 64) rounds, so
    the records in memory are as many at 300 rounds as at 100; `--every` adds the checkpoints."""
    path = tmp_path / "service.json"
    code = main(["bench", "stream", "--service", "--rounds", "300", "--capacity", "20",
                 "--budget", "10", "--nodes", "2", "--dim", "2", "--every", "50",
                 "--time-limit", "400", "--json", str(path)])  # fmt: skip
    assert code == 0
    result = json.loads(path.read_text())
    assert result["reached"] == 300 and result["every"] == 50
    windows = {w["n"]: w for w in result["windows"]}
    assert sorted(windows) == [20, 40, 50, 100, 150, 200, 250, 300]
    for n in (100, 150, 200, 250, 300):
        # at most the round in flight and the one closing; the history's window; its rewards
        assert windows[n]["rounds_held"] <= 2, windows[n]
        assert 64 <= windows[n]["history_held"] <= 66, windows[n]
        assert windows[n]["rewards_held"] == 64, windows[n]


def test_stream_service_options_are_refused_where_they_do_not_apply(tmp_path, capsys):
    path = str(tmp_path / "s.json")
    assert main(["bench", "stream", "--service", "--resume", "--json", path]) == 2
    assert "--resume is for the model-only run" in capsys.readouterr().err
    assert main(["bench", "stream", "--rounds", "10", "--time-limit", "5"]) == 2
    assert main(["bench", "stream", "--rounds", "10", "--pipeline", "2"]) == 2
    assert main(["bench", "stream", "--service", "--pipeline", "65", "--json", path]) == 2
    assert main(["bench", "stream", "--service", "--time-limit", "0", "--json", path]) == 2
    assert main(["bench", "stream", "--rounds", "10", "--store", path]) == 2
    (tmp_path / "taken.sqlite").write_text("")
    assert main(["bench", "stream", "--service", "--store", str(tmp_path / "taken.sqlite")]) == 2
