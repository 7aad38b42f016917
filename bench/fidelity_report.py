"""Summary rows and the cost-axis plot of multi-fidelity runs (`bench.harness.fidelity`).

A row per (env, policy): seeds, rounds (requested cap), budget, mean_spent,
mean_final_score / se_final_score (the final recommendation's test score: −log steps, TR the
discounted return; higher is better), mean_final_steps, table1_ratio (per multiple m … 10m,
paper 001's Table 1 ratio E[V with θ_rec] / E[V from scratch] with both expectations over the
seeds' test environments: `table1_ratio_of`), decision_seconds and update_seconds (mean per
round), seeds_failed, seeds_stopped_early (runs the round cap ended with budget unspent).
A row "ql" per env holds the subgoal-free Q-learning baseline measured in every run's test
environments. The plot is the paper's Figure 7: the
recommendation's test score against cumulative cost, mean ± 1 SE over seeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FIDELITY_COLUMNS", "fidelity_row", "plot_cost", "ql_row", "table1_ratio_of"]

FIDELITY_COLUMNS = [
    ("budget", "budget"),
    ("mean_spent", "spent"),
    ("mean_final_score", "final score"),
    ("se_final_score", "SE"),
    ("mean_final_steps", "steps"),
    ("table1_ratio_10m", "ratio 10m"),
    ("decision_seconds", "decision s"),
]


def _mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = float(np.mean(values))
    se = float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None
    return mean, se


def fidelity_row(env: str, policy: str, group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    done = [p for p in group if p["status"] != "failed" and p.get("metrics")]
    metrics = [p["metrics"] for p in done]
    row: dict[str, Any] = {"env": env, "policy": policy, "seeds": len(done)}
    row["rounds"] = group[0]["rounds"]
    row["budget"] = group[0].get("budget")
    row["mean_spent"] = float(np.mean([p["spent"] for p in done])) if done else None
    row["mean_final_score"], row["se_final_score"] = _mean_se([m["final_score"] for m in metrics])
    row["mean_final_steps"], _ = _mean_se([m["final_steps"] for m in metrics])
    row["table1_ratio"] = table1_ratio_of(metrics)
    row["table1_ratio_10m"] = row["table1_ratio"][-1] if row["table1_ratio"] else None
    for name in ("decision_seconds", "update_seconds"):
        values = [m[name] for m in metrics if m.get(name) is not None]
        row[name] = float(np.mean(values)) if values else None
    row["seeds_failed"] = sum(p["status"] == "failed" for p in group)
    row["seeds_stopped_early"] = sum(
        (p.get("stop_reason") or "").startswith("round cap") for p in done
    )
    row["violations"] = 0
    return row


def table1_ratio_of(metrics: Sequence[Mapping[str, Any]]) -> list[float | None] | None:
    """Paper 001's performance ratio(T) = E[V^{π_{ξ,θ_rec}^T}(s0)] / E[V^{π_ξ^T}(s0)] (Sec.
    5.8) per T = m … 10m: a ratio of expectations, each over the test environments ξ of every
    seed (and so over the runs' θ_rec), not a mean of per-seed ratios. Every seed tests the
    same number of environments, so each expectation is the mean of the seeds' means
    (`table1_with`, `table1_scratch`). None without runs; an entry is None where the
    denominator is not positive (TR when scratch never reaches the goal)."""
    if not metrics or any("table1_with" not in m for m in metrics):
        return None
    with_goals = np.mean([m["table1_with"] for m in metrics], axis=0)
    scratch = np.mean([m["table1_scratch"] for m in metrics], axis=0)
    return [float(w / s) if s > 0 else None for w, s in zip(with_goals, scratch, strict=True)]


def ql_row(env: str, runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Q-learning without subgoals for τ_max, once per seed (every policy's run measured it
    in the same test environments; the first per seed counts)."""
    per_seed: dict[int, Mapping[str, Any]] = {}
    for p in runs:
        if p["status"] != "failed" and p.get("metrics"):
            per_seed.setdefault(p["seed"], p["metrics"])
    scores = [m["ql_score"] for m in per_seed.values()]
    mean, se = _mean_se(scores)
    steps, _ = _mean_se([m["ql_steps"] for m in per_seed.values()])
    return {
        "env": env,
        "policy": "ql",
        "seeds": len(scores),
        "mean_final_score": mean,
        "se_final_score": se,
        "mean_final_steps": steps,
        "seeds_failed": 0,
        "seeds_stopped_early": 0,
        "violations": 0,
    }


def _score_at(curve: Sequence[Mapping[str, Any]], spent: float) -> float | None:
    """The latest recommendation's score once `spent` has been spent (None before any)."""
    known = [c for c in curve if c["score"] is not None and c["spent"] <= spent + 1e-9]
    return known[-1]["score"] if known else None


def plot_cost(env: str, runs: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """Test score of the recommendation against cumulative cost per policy; False if no data."""
    by_policy: dict[str, list[Mapping[str, Any]]] = {}
    for payload in runs:
        if payload["status"] != "failed" and payload.get("curve"):
            by_policy.setdefault(payload["policy"], []).append(payload)
    if not by_policy:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budget = max(p.get("budget") or p["spent"] for g in by_policy.values() for p in g)
    grid = np.linspace(budget / 20, budget, 40)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for policy, group in by_policy.items():
        means, lows, highs, xs = [], [], [], []
        for spent in grid:
            values = [v for p in group if (v := _score_at(p["curve"], spent)) is not None]
            if values:
                mean, se = _mean_se(values)
                xs.append(spent)
                means.append(mean)
                lows.append(mean - (se or 0.0))
                highs.append(mean + (se or 0.0))
        ax.plot(xs, means, label=policy)
        ax.fill_between(xs, lows, highs, alpha=0.2)
    ql = ql_row(env, runs)["mean_final_score"]
    if ql is not None:
        ax.axhline(ql, color="grey", ls=":", label="ql (no subgoals)")
    seeds = max(len(g) for g in by_policy.values())
    ax.set_title(f"{env}: recommendation's test score vs cost (mean ± 1 SE, {seeds} seeds)")
    ax.set_xlabel("cumulative cost (interactions, initial design included)")
    ax.set_ylabel("test score (−log steps; TR: discounted return)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
