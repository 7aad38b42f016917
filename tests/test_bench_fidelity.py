"""`bench regret` on paper 001's domains: the round cap derived from the budget (so the budget,
not the cap, ends a run) and Table 1's performance ratio as the paper defines it, a ratio of
expectations."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from agent.paths import example_spec
from bench import regret
from bench.fidelity_report import fidelity_row, table1_ratio_of
from bench.harness import fidelity
from bench.harness.episode import RunConfig
from core.spec import load_spec
from sim.registry import make_environment


@pytest.fixture
def small_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 test environments, 1 checkpoint and Table 1 at m only, instead of 100, 10 and m …
    10m: the same code, less work."""
    monkeypatch.setattr(fidelity, "TEST_ENVIRONMENTS", 4)
    monkeypatch.setattr(fidelity, "CHECKPOINTS", 1)
    monkeypatch.setattr(fidelity, "TABLE1_MULTIPLES", (1,))


def gw10_spec(tmp_path: Path, budget: float) -> Path:
    """examples/gw10.yaml with another total budget."""
    raw = yaml.safe_load(example_spec("gw10").read_text())
    raw["constraints"]["budget_total"] = budget
    path = tmp_path / "gw10.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_budget_rounds_is_the_budget_over_the_cheapest_trial() -> None:
    spec = load_spec(example_spec("gw10"))  # 𝒯 = {200, 600, 1000}, 𝒬 = {5, 20}, B = 1,080,000
    assert fidelity.budget_rounds(spec) == 1_080_000 // (200 * 5)
    no_budget = spec.model_copy(
        update={"constraints": spec.constraints.model_copy(update={"budget_total": None})}
    )
    assert fidelity.budget_rounds(no_budget) is None


def test_plan_gives_budgeted_domains_the_budget_cap() -> None:
    """Without --rounds a budgeted fidelity domain is capped by its budget, others at 100;
    an explicit --rounds is honoured everywhere."""
    configs = regret.plan(["gw10", "dropwave"], ["random"], 1, None)
    caps = {c.env: c.rounds for c in configs}
    assert caps == {"gw10": 1080, "dropwave": regret.DEFAULT_ROUNDS}
    assert {c.rounds for c in regret.plan(["gw10"], ["random"], 1, 7)} == {7}


@pytest.mark.slow  # 15-25 s: two runs, each fitting the (θ, τ) GP for its recommendation
@pytest.mark.usefixtures("small_tests")
def test_a_run_ends_when_its_budget_is_spent(tmp_path: Path) -> None:
    """Random buys τ_max·q_max = 20,000 a round: with the budget's cap it spends all of
    40,000; with a cap of 1 round it stops with 20,000 unspent and says so."""
    spec = gw10_spec(tmp_path, 40_000.0)
    cap = fidelity.budget_rounds(load_spec(spec))
    full = fidelity.play_fidelity(RunConfig("gw10", "random", 0, cap, {}, str(spec)))
    assert full["status"] == "ok", full.get("traceback")
    assert full["spent"] == pytest.approx(40_000.0)
    assert not full["stop_reason"].startswith("round cap")
    capped = fidelity.play_fidelity(RunConfig("gw10", "random", 0, 1, {}, str(spec)))
    assert capped["spent"] == pytest.approx(20_000.0)
    assert capped["stop_reason"] == "round cap 1 reached with 20000 of the budget 40000 unspent"
    row = fidelity_row("gw10", "random", [full, capped])
    assert row["seeds_stopped_early"] == 1


@pytest.mark.usefixtures("small_tests")
def test_table1_means_compare_the_same_test_environments() -> None:
    """Without subgoals both arms are the same learner in the same environments: ratio 1."""
    env = make_environment("gw10", 0)
    with_goals, scratch = fidelity.table1_means(env, None, [0, 2])
    assert len(with_goals) == len(scratch) == len(fidelity.TABLE1_MULTIPLES)
    assert with_goals == scratch
    assert all(s > 0 for s in scratch)


def test_table1_ratio_is_a_ratio_of_expectations() -> None:
    """Two seeds at T = m, 2m: steps with subgoals (10, 30) and (40, 20), from scratch
    (100, 50) and (80, 80). The paper's E[V_with]/E[V_scratch] is 20/75 and 30/80; the mean
    of the per-seed ratios (0.35 and 0.375) is not it."""
    metrics = [
        {"table1_with": [10.0, 40.0], "table1_scratch": [100.0, 80.0]},
        {"table1_with": [30.0, 20.0], "table1_scratch": [50.0, 80.0]},
    ]
    assert table1_ratio_of(metrics) == pytest.approx([20 / 75, 30 / 80])
    assert not math.isclose(table1_ratio_of(metrics)[0], np.mean([10 / 100, 30 / 50]))
    # TR: a return ratio whose scratch arm never reached the goal has no value
    assert table1_ratio_of([{"table1_with": [3.0], "table1_scratch": [0.0]}]) == [None]
    assert table1_ratio_of([]) is None
