"""The regret benchmark at a tiny size: every promised file and field, metrics that recompute
from the per-run records, resumption, failure isolation, budgets, listing and argument errors."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from rich.console import Console

from agent.cli import main
from agent.paths import EXAMPLES_ENV_VAR, examples_dir
from bench import regret
from bench.harness import episode
from bench.harness.episode import plain
from core.spec import load_spec
from policies.base import Constraints
from policies.registry import policy_names
from sim.registry import environment_names, make_environment

ENVS = ["dropwave", "toygraph"]  # one soft and one hard environment, both quick
SEEDS, ROUNDS = 2, 3
RUN_FIELDS = {
    "schema",
    "version",
    "env",
    "policy",
    "seed",
    "rounds",
    "settings",
    "spec",
    "device",
    "status",
    "stop_reason",
    "error",
    "traceback",
    "optimum",
    "optimum_intervention",
    "budget",
    "spent",
    "initial_design",
    "initial_design_source",
    "initial_design_seconds",
    "history",
    "metrics",
    "wall_seconds",
    "finished_at",
}
ROUND_FIELDS = {
    "round",
    "intervention",
    "target_set",
    "cost",
    "spent",
    "reward",
    "expected_reward",
    "regret",
    "acquisition_value",
    "decision_seconds",
    "decision_cpu_seconds",
    "update_seconds",
    "field_fit_seconds",  # fits of the field models beside the decision (0 without any)
    "diagnostics",
}
ROW_FIELDS = {
    "env",
    "policy",
    "seeds",
    "rounds",
    "mean_average_reward",
    "se_average_reward",
    "mean_best_reward",
    "mean_cumulative_regret",
    "se_cumulative_regret",
    "seconds_per_round",
    "optimum",
}


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def run_files(out: Path) -> list[Path]:
    return sorted((out / "runs").rglob("seed*.json"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """2 environments × every policy named `random` × 2 seeds × 3 rounds, in this process."""
    out = tmp_path_factory.mktemp("regret")
    console = quiet()
    result = regret.run(ENVS, ["random"], SEEDS, ROUNDS, out, workers=1, console=console)
    return out, result, console.file.getvalue()


def test_tiny_run_writes_every_promised_file(tiny):
    out, result, printed = tiny
    assert (result.ran, result.loaded, result.failed) == (4, 0, 0)
    expected = [out / "runs" / e / "random" / f"seed{s}.json" for e in ENVS for s in range(SEEDS)]
    assert run_files(out) == sorted(expected)
    for env in ENVS:
        assert (out / f"{env}.png").stat().st_size > 10_000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == "cbo-agent/bench-regret-summary"
    assert {"python", "torch", "cpu"} <= set(summary["machine"])
    assert summary["config"]["seeds"] == SEEDS and summary["config"]["rounds"] == ROUNDS
    assert [(r["env"], r["policy"]) for r in summary["rows"]] == [(e, "random") for e in ENVS]
    for row in summary["rows"]:
        assert set(row) >= ROW_FIELDS
        assert "budget" not in row  # the specs have no total budget
        assert (row["seeds"], row["rounds"], row["seeds_failed"]) == (SEEDS, ROUNDS, 0)
        assert row["device"] == "cpu" and row["device_name"]
    assert set(summary["orderings"]) == set(ENVS)
    markdown = (out / "summary.md").read_text()
    assert "| env | policy | seeds |" in markdown and "## Orderings" in markdown
    assert "cumulative regret" in printed and "toygraph" in printed


def test_run_json_records_every_round(tiny):
    out, _, _ = tiny
    for path in run_files(out):
        run = json.loads(path.read_text())
        assert set(run) == RUN_FIELDS
        assert run["status"] == "ok" and run["error"] is None and run["device"] == "cpu"
        env = make_environment(run["env"], run["seed"])
        # no constraints in these specs: the paper's design, charged like every round
        assert run["initial_design_source"] == "paper"
        paper = env.initial_design(run["seed"])
        assert [r["intervention"] for r in run["initial_design"]] == plain(paper)
        assert [r["round"] for r in run["history"]] == list(range(1, ROUNDS + 1))
        for record in run["history"]:
            assert set(record) == ROUND_FIELDS
            oracle = env.expected_reward(record["intervention"])
            assert record["expected_reward"] == pytest.approx(oracle)
            assert record["regret"] == pytest.approx(env.optimum.value - oracle)
            assert record["decision_seconds"] > 0 and record["update_seconds"] > 0
        rounds = [*run["initial_design"], *run["history"]]
        assert run["spent"] == pytest.approx(sum(r["cost"] for r in rounds))
        assert not [r for r in rounds if "violations" in r]


def test_summary_metrics_recompute_from_the_run_records(tiny):
    out, _, _ = tiny
    rows = {r["env"]: r for r in json.loads((out / "summary.json").read_text())["rows"]}
    for env in ENVS:
        finals = []
        for seed in range(SEEDS):
            run = json.loads((out / "runs" / env / "random" / f"seed{seed}.json").read_text())
            values = [r["expected_reward"] for r in run["history"]]
            mine = {
                "average_reward": sum(values) / len(values),
                "best_reward": max(values),
                "cumulative_regret": sum(run["optimum"] - v for v in values),
                "seconds_per_round": sum(
                    r["decision_seconds"] + r["update_seconds"] for r in run["history"]
                )
                / len(values),
            }
            for name, value in mine.items():
                assert run["metrics"][name] == pytest.approx(value)
            finals.append(mine)
        row = rows[env]
        for name in ("average_reward", "best_reward", "cumulative_regret"):
            series = np.array([f[name] for f in finals])
            assert row[f"mean_{name}"] == pytest.approx(series.mean())
            se = series.std(ddof=1) / math.sqrt(len(series))
            assert row[f"se_{name}"] == pytest.approx(se)
        spr = np.mean([f["seconds_per_round"] for f in finals])
        assert row["seconds_per_round"] == pytest.approx(spr)
        assert row["optimum"] == pytest.approx(make_environment(env, 0).optimum.value)


def test_resuming_skips_finished_runs(tiny, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(tiny[0], out)
    before = {p: p.stat().st_mtime_ns for p in run_files(out)}

    again = regret.run(ENVS, ["random"], SEEDS, ROUNDS, out, workers=1, console=quiet())
    assert (again.ran, again.loaded) == (0, 4)
    assert {p: p.stat().st_mtime_ns for p in run_files(out)} == before
    assert again.rows == json.loads((tiny[0] / "summary.json").read_text())["rows"]

    removed = out / "runs" / "toygraph" / "random" / "seed1.json"
    removed.unlink()
    partly = regret.run(ENVS, ["random"], SEEDS, ROUNDS, out, workers=1, console=quiet())
    assert (partly.ran, partly.loaded) == (1, 3) and removed.exists()
    assert all(p.stat().st_mtime_ns == t for p, t in before.items() if p != removed)

    older = out / "runs" / "dropwave" / "random" / "seed0.json"
    older.write_text(json.dumps({**json.loads(older.read_text()), "version": 1}))
    stale = regret.run(ENVS, ["random"], SEEDS, ROUNDS, out, workers=1, console=quiet())
    assert (stale.ran, stale.loaded) == (1, 3)  # a run of an older version is redone
    assert json.loads(older.read_text())["version"] == episode.RUN_VERSION

    with pytest.raises(regret.BadArguments, match="--force"):
        regret.run(ENVS, ["random"], SEEDS, ROUNDS + 1, out, workers=1, console=quiet())
    forced = regret.run(["dropwave"], ["random"], 1, ROUNDS, out, force=True, console=quiet())
    assert (forced.ran, forced.loaded) == (1, 0)


def test_a_failing_run_is_reported_and_the_others_finish(tmp_path, monkeypatch):
    real = episode.make_environment

    def broken_for_seed_1(name, seed=0):
        if seed == 1:
            raise RuntimeError("simulated crash")
        return real(name, seed)

    monkeypatch.setattr(episode, "make_environment", broken_for_seed_1)
    result = regret.run(["dropwave"], ["random"], 2, 2, tmp_path, workers=1, console=quiet())
    assert (result.ran, result.failed) == (2, 1)
    failed = json.loads((tmp_path / "runs/dropwave/random/seed1.json").read_text())
    assert failed["status"] == "failed" and "simulated crash" in failed["error"]
    assert "RuntimeError" in failed["traceback"] and failed["metrics"] is None
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [f["seed"] for f in summary["failures"]] == [1]
    row = summary["rows"][0]
    assert (row["seeds"], row["seeds_failed"], row["se_cumulative_regret"]) == (1, 1, None)
    assert "simulated crash" in (tmp_path / "summary.md").read_text()

    monkeypatch.setattr(episode, "make_environment", real)
    retried = regret.run(["dropwave"], ["random"], 2, 2, tmp_path, workers=1, console=quiet())
    assert (retried.ran, retried.loaded, retried.failed) == (1, 1, 0)


@pytest.fixture
def examples(tmp_path, monkeypatch):
    """An empty examples directory in CBO_EXAMPLES_DIR; `write(name, edit)` adds a spec."""
    folder = tmp_path / "examples"
    folder.mkdir()
    source = examples_dir()
    monkeypatch.setenv(EXAMPLES_ENV_VAR, str(folder))

    def write(name, edit=lambda data: None, source_name=None):
        data = yaml.safe_load((source / f"{source_name or name}.yaml").read_text())
        edit(data)
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(data))

    return write


def test_a_budget_stops_the_run_and_the_row_reports_it(examples, tmp_path):
    """The paper design (14 rounds, 4 observational) breaks these target sets, so the explorer
    draws 14 rounds at cost 1 each: 14 of the 16.5 spent before the policy's first round."""

    def budgeted(data):
        data["target_sets"] = [["do_X0"], ["do_X1"]]  # every round costs 1
        data["constraints"] = {"budget_total": 16.5}

    examples("toygraph", budgeted)
    regret.run(["toygraph"], ["random"], 1, 5, tmp_path / "out", workers=1, console=quiet())
    run = json.loads((tmp_path / "out/runs/toygraph/random/seed0.json").read_text())
    assert run["initial_design_source"] == "random explorer"
    assert [r["cost"] for r in run["initial_design"]] == [1.0] * 14
    assert run["status"] == "stopped" and run["stop_reason"].startswith("round 3:")
    assert len(run["history"]) == 2 and run["metrics"]["rounds_completed"] == 2
    assert [r["spent"] for r in run["history"]] == [15.0, 16.0]
    row = json.loads((tmp_path / "out/summary.json").read_text())["rows"][0]
    assert (row["budget"], row["max_budget_spent"]) == (16.5, 16.0)
    assert (row["seeds"], row["seeds_stopped_early"], row["violations"]) == (1, 1, 0)


def test_an_initial_design_the_budget_cannot_pay_for_stops_the_run(examples, tmp_path):
    def budgeted(data):
        data["target_sets"] = [["do_X0"], ["do_X1"]]
        data["constraints"] = {"budget_total": 2.5}

    examples("toygraph", budgeted)
    regret.run(["toygraph"], ["random"], 1, 5, tmp_path / "out", workers=1, console=quiet())
    run = json.loads((tmp_path / "out/runs/toygraph/random/seed0.json").read_text())
    assert run["status"] == "stopped"
    assert run["stop_reason"].startswith("initial design round 3:")
    assert (len(run["initial_design"]), run["history"], run["spent"]) == (2, [], 2.0)
    row = json.loads((tmp_path / "out/summary.json").read_text())["rows"][0]
    assert (row["budget"], row["max_budget_spent"], row["violations"]) == (2.5, 2.0, 0)
    assert (row["seeds"], row["seeds_stopped_early"]) == (0, 1)


def test_alpine2_budget_charges_and_checks_its_initial_design(tmp_path):
    """The paper design of Alpine2 sets all six nodes at cost 6 for 14 rounds (84), against at
    most 2 interventions, a cap of 2 per round and 120 in all: the explorer replaces it, every
    round is charged, and nothing breaks the spec, across policies that share the design."""
    env = make_environment("alpine2-budget", 0)
    paper = env.initial_design(0)
    assert max(sum(v != 0 for v in a.values()) for a in paper) == 6

    out = tmp_path / "out"
    regret.run(["alpine2-budget"], ["random", "gpucb"], 1, 3, out, workers=1, console=quiet())
    designs, policy_spent = [], {}
    for policy in ("random", "gpucb"):
        run = json.loads((out / f"runs/alpine2-budget/{policy}/seed0.json").read_text())
        design = run["initial_design"]
        assert run["status"] == "ok" and len(design) == len(paper)
        rounds = [*design, *run["history"]]
        for record in rounds:
            assert sum(v != 0 for v in record["intervention"].values()) <= 2
            assert record["cost"] <= 2.0 and "violations" not in record
        spent = np.cumsum([r["cost"] for r in rounds])
        assert run["spent"] == pytest.approx(spent[-1]) and spent[-1] <= 120
        assert [r["spent"] for r in rounds] == pytest.approx(spent)
        assert run["initial_design_source"] == "random explorer"
        designs.append([r["intervention"] for r in design])
        policy_spent[policy] = (spent[-1], sum(r["cost"] for r in run["history"]))
    assert designs[0] == designs[1]  # the design depends on the seed, not on the policy
    summary = json.loads((out / "summary.json").read_text())
    for row in summary["rows"]:
        assert row["violations"] == 0 and row["budget"] == 120.0
        total, in_policy_rounds = policy_spent[row["policy"]]
        assert row["max_budget_spent"] == pytest.approx(total)
        assert total > in_policy_rounds  # the design is charged too


def test_each_weather_seed_plays_among_its_own_sensors(tmp_path):
    """The seed places the sensors: seeds other than the spec's (0) must use theirs — every
    such run failed on its first round when the spec's list was kept."""
    out = tmp_path / "out"
    regret.run(["weather"], ["random"], 2, 2, out, workers=1, console=quiet())
    for seed in (0, 1):
        run = json.loads((out / f"runs/weather/random/seed{seed}.json").read_text())
        assert run["status"] == "ok", run.get("error")
        sensors = make_environment("weather", seed).candidates.tolist()
        for record in [*run["initial_design"], *run["history"]]:
            assert [record["intervention"]["lat"], record["intervention"]["lon"]] in sensors


def test_violations_name_each_broken_constraint(examples):
    examples("toygraph", lambda d: d.update(constraints={"budget_total": 2.5}))
    spec = load_spec(examples_dir() / "toygraph.yaml")
    limits = Constraints(budget_remaining=0.5)
    problems = episode.violations(spec, limits, {"do_X0": 1.0}, 1.0, 3.0)
    assert problems == ["cost 1 > round cap 0.5", "spent 3 > total budget 2.5"]
    assert episode.violations(spec, Constraints(), {"do_X0": 1.0}, 1.0, 1.0) == []
    both = {"do_X0": 1.0, "do_X1": 2.0}
    problems = episode.violations(spec, Constraints(), both, 2.0, 2.0)
    assert problems == ["target set ['do_X0', 'do_X1'] not allowed"]


def test_settings_come_from_the_spec_and_the_command_line(examples):
    own = {"name": "random", "settings": {"max_draws": 50}}
    examples("dropwave", lambda data: data.update(policy=own))
    [config] = regret.plan(["dropwave"], ["random"], 1, 1)
    assert config.settings == {"max_draws": 50}
    [config] = regret.plan(["dropwave"], ["random"], 1, 1, [(None, "max_draws", 9)])
    assert config.settings == {"max_draws": 9}
    [config] = regret.plan(["dropwave"], ["random"], 1, 1, [("random", "max_draws", 3)])
    assert config.settings == {"max_draws": 3}


def test_list_prints_environments_papers_specs_and_policies(examples, capsys):
    examples("dropwave")
    assert main(["bench", "regret", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in environment_names():
        [line] = [ln for ln in lines if f" {name} " in ln]
        assert ("dropwave.yaml" if name == "dropwave" else "missing") in line
    assert [ln for ln in lines if " dropwave " in ln and " 004 " in ln]
    assert all(policy in lines[-1] for policy in policy_names())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "nowhere"], "unknown environment 'nowhere'; known: toygraph"),
        (["--policy", "nobody"], "unknown policy 'nobody'; known:"),
        (["--env", "dropwave", "dropwave"], "environment given twice: dropwave"),
        (["--setting", "max_draws=abc"], "random: policy.settings.max_draws"),
        (["--setting", "mcbo:beta=2"], "--setting names policies not being run: mcbo"),
        (["--env", "toygraph"], "does not match simulator 'toygraph'"),
        (["--env", "psagraph"], "psagraph.yaml does not exist"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(examples, tmp_path, capsys, args, message):
    examples("dropwave")
    examples("toygraph", source_name="dropwave")  # a spec for another simulator
    base = ["bench", "regret", "--out", str(tmp_path), "--policy", "random", "--env", "dropwave"]
    assert main([*base, *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()


def test_a_missing_examples_directory_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(EXAMPLES_ENV_VAR, str(tmp_path / "absent"))
    assert main(["bench", "regret", "--env", "dropwave", "--out", str(tmp_path)]) == 2
    assert f"no examples directory at {tmp_path / 'absent'}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--setting", "beta"], "expected [POLICY:]KEY=VALUE"),
        (["--setting", "beta=[1,"], "value is not YAML"),
        (["--seeds", "0"], "must be at least 1"),
        (["--rounds", "ten"], "not an integer: 'ten'"),
    ],
)
def test_malformed_options_are_rejected_by_the_parser(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "regret", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_command_line_runs_end_to_end_with_two_workers(tiny, tmp_path):
    """The installed entry point, a process pool of two, plain progress lines off a terminal;
    the same seed gives the same interventions and readings as the in-process run."""
    script = Path(sys.executable).with_name("cbo-agent")
    command = [str(script), "bench", "regret", "--env", "dropwave", "--policy", "random"]
    command += ["--seeds", "2", "--rounds", "2", "--workers", "2", "--out", str(tmp_path)]
    command += ["--setting", "random:max_draws=1000"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "dropwave random seed 0: ok, 2 rounds" in done.stdout
    assert "Regret benchmark: 2 seeds × 2 rounds" in done.stdout
    assert (tmp_path / "dropwave.png").exists() and (tmp_path / "summary.md").exists()
    for seed in range(2):
        pooled = json.loads((tmp_path / f"runs/dropwave/random/seed{seed}.json").read_text())
        alone = json.loads((tiny[0] / f"runs/dropwave/random/seed{seed}.json").read_text())
        assert pooled["settings"] == {"max_draws": 1000}
        for ours, theirs in zip(pooled["history"], alone["history"][:2], strict=True):
            assert ours["intervention"] == theirs["intervention"]
            assert ours["reward"] == pytest.approx(theirs["reward"])


def test_hagpucb_gets_the_visited_states_in_process_as_through_the_service(tmp_path):
    """`visited_states` in the benchmark (issue 13): every episode's states, the initial
    design's included, reach hagpucb as a device with `--send-states` sends them (float32 on
    the wire); phase 0 waits for them, and phase 1 learns the structure that a policy handed
    the same episodes' states learns."""
    import torch

    from policies.registry import make_policy

    settings = {"controller": "mpe-tag", "visited_states": 75, "max_edges": 40}
    settings |= {"candidates": 16, "sweeps": 1}
    scoped = [("hagpucb", key, value) for key, value in settings.items()]
    [config] = regret.plan(["mpe-tag"], ["hagpucb"], 1, 3, scoped)
    run = episode.play(config)
    assert run["status"] == "ok", run["traceback"]
    design, history = run["initial_design"], run["history"]
    assert [r["visited_states"] for r in [*design, *history]] == [25] * 5
    assert history[0]["diagnostics"] == {"phase": 0, "visited_states": 50, "waiting_for": 75}
    learned = history[1]["diagnostics"]
    assert learned["phase"] == 2 and learned["states_from"] == "visited"
    assert 0 < len(learned["edges"]) <= 40

    # the same episodes replayed (their seeds drawn from the run's noise stream, one per step)
    # with the states recorded, sent through the wire's float32, to a fresh policy
    env = make_environment("mpe-tag", 0)
    assert not env.record_states  # the run left the cached environment as it found it
    noise = torch.Generator().manual_seed(episode.seed_streams(0)[0])
    policy = make_policy("hagpucb", load_spec(config.spec), config.settings)
    env.record_states = True
    try:
        for record in [*design, history[0]]:
            theta = env._theta(record["intervention"])
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=noise))
            assert env.episode(theta, seed) == record["reward"]  # the very episode
            policy.observe_states(0, env.last_states.astype(np.float32))
    finally:
        env.record_states, env.last_states = False, None
    policy._learn_surrogate_structure()
    assert sorted(map(tuple, learned["edges"])) == sorted(policy.structure.edges)
