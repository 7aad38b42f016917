"""`cbo-agent bench regret`: sample efficiency of every policy on the simulated environments.

For each (environment, policy, seed): a fresh environment `make_environment(env, seed)`, its spec
`examples/<env>.yaml`, a `NetworkModel(spec)` and the policy with the spec's own settings when it
is the spec's policy (else none), overridden by `--setting`. An initial design is played and
learned first: the environment's paper design, or — when that breaks the spec's constraints
(alpine2-budget's sets all six nodes) — as many rounds drawn by the random explorer within them,
as the agent service does. Then R policy rounds: propose under
`Constraints.from_spec(spec, spent)`, step the environment, learn, record. The same seed gives
every policy the same environment instance, initial design and noise stream. R is `--rounds`,
100 by default; paper 001's domains (a fidelity set and a total budget) default to as many
rounds as the budget pays for at the cheapest trial (`bench.harness.fidelity.budget_rounds`),
so their runs end when the budget is spent.

Metrics, over the R policy rounds t = 1..R (the initial design is excluded), with
f* = env.optimum.value and r_t = E[y | a_t] = env.expected_reward(a_t), the oracle's noiseless
value of the played intervention (not the noisy reading):
    average reward      A_t = (1/t) Σ_{s≤t} r_s                 (running mean)
    best reward         B_t = max_{s≤t} r_s                      (running max)
    cumulative regret   C_t = Σ_{s≤t} (f* − r_s)
    seconds per round   mean over rounds of the wall time of propose + learn
A run's metrics are the curves' values at its last round (R, or earlier if it stopped because
nothing was affordable). Per (env, policy): mean over seeds and standard error
SE = sample std (ddof 1) / √seeds; failed runs are left out and counted. Curves in the plots are
mean ± 1 SE over the runs that reached round t.

Budget: `spent` sums env.cost over every played round, initial design included, the quantity
`Constraints.from_spec` receives. A policy (or the explorer, during the design) raising
NothingAffordable ends its run early with status "stopped". Every played round, design rounds
included, is checked against cardinality, per-round cap, total budget and (hard interventions)
the allowed target sets; breaches are listed per round ("violations") and counted per row.

Outputs in DIR:
    runs/<env>/<policy>/seed<k>.json   one run (schema cbo-agent/bench-regret-run): the config
        (env, policy, seed, rounds, settings, spec, device), status ok|stopped|failed, stop_reason,
        error, traceback, optimum, optimum_intervention, budget, spent, initial_design
        [{intervention, cost, reward, expected_reward, spent, violations?}],
        initial_design_source (paper | random explorer), initial_design_seconds, history
        [{round, intervention, target_set, cost, spent, reward, expected_reward, regret,
        acquisition_value, decision_seconds, update_seconds, diagnostics, violations?,
        visited_states?}] (visited_states: how many states the round's episode handed to a
        policy that takes them, `hagpucb` with `controller` and `visited_states`, as the
        service's devices send them with `--send-states`; the initial design's too; an
        environment that does not record them is refused for such a policy),
        metrics {rounds_completed, average_reward, best_reward, cumulative_regret,
        seconds_per_round, decision_seconds, update_seconds}, wall_seconds, finished_at; and
        structure {precision, recall, f1, edges_found, edges_true} where the environment knows
        its dependency graph (additive-er-*) and the policy reported one (hagpucb).
    summary.json   {schema, version, machine, config, rows, orderings, failures}; a row per
        (env, policy): env, policy, seeds (runs that count: not failed, at least one round),
        rounds (requested), mean_average_reward, se_average_reward, mean_best_reward,
        se_best_reward, mean_cumulative_regret, se_cumulative_regret, seconds_per_round,
        decision_seconds, update_seconds, optimum (mean over seeds: a seeded environment draws
        a new instance per seed), seeds_failed, seeds_stopped_early, violations, structure_f1
        (mean over the runs with a `structure`, where any has one), and budget,
        max_budget_spent when the spec has a total budget, device and device_name (where the
        GPs lived: `--device`, and its hardware). Missing values (no run, one seed's SE) are
        null.
    summary.md     the rows as a table, per-environment orderings, failures and these definitions.
    <env>.png      average reward and cumulative regret against t for every policy.

Runs execute in a process pool (one torch thread per worker). A run whose JSON already exists
with the same config and did not fail is loaded, not re-run (`force` redoes it), so an
interrupted benchmark continues where it stopped; a run with another config there is an error.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from agent.paths import ExamplesNotFound, example_spec, examples_dir
from bench.fidelity_report import FIDELITY_COLUMNS, fidelity_row, plot_cost, ql_row
from bench.harness.episode import RUN_VERSION, RunConfig, curves, plain, play, skeleton
from bench.harness.fidelity import budget_rounds
from bench.pool import run_all
from bench.report import (
    device_info,
    machine_info,
    markdown_table,
    print_table,
    progress_bar,
    wide_console,
    write_json,
)
from core.spec import ExperimentSpec, SpecError, load_spec
from policies.registry import make_policy, policy_names
from sim.errors import EnvironmentUnavailable
from sim.registry import environment_names, make_environment

SUMMARY_SCHEMA = "cbo-agent/bench-regret-summary"
SUMMARY_VERSION = 1
DEFAULT_ROUNDS = 100  # policy rounds per run when `--rounds` is not given

# (policy or None for every chosen policy, key, value), from `--setting [POLICY:]KEY=VALUE`.
Setting = tuple[str | None, str, Any]


class BadArguments(ValueError):
    """The benchmark cannot start: an unknown name, a missing or invalid spec, a bad setting."""


@dataclass
class RegretResult:
    """What `run` did: the summary rows and how many runs were played, loaded and failed."""

    rows: list[dict[str, Any]]
    ran: int
    loaded: int
    failed: int


# --------------------------------------------------------------------------- planning
def plan(
    envs: Sequence[str] | None,
    policies: Sequence[str] | None,
    seeds: int,
    rounds: int | None,
    settings: Sequence[Setting] = (),
    device: str = "cpu",
) -> list[RunConfig]:
    """Every (env, policy, seed) run, validated before anything starts.

    `envs` None: every environment with a spec; `policies` None: every policy. `rounds` None:
    `DEFAULT_ROUNDS`, but a multi-fidelity spec with a total budget (paper 001's domains) gets
    `budget_rounds`, as many rounds as its budget pays for at the cheapest trial, so that the
    budget ends every run (a fixed cap ended BESD's cheap-trial runs with half the budget
    unspent).

    Raises:
        BadArguments: naming the unknown environment or policy, the missing or invalid spec,
            or the setting a policy rejects.
    """
    if seeds < 1 or (rounds is not None and rounds < 1):
        raise BadArguments(f"seeds and rounds must be at least 1 (got {seeds}, {rounds})")
    envs = list(envs) if envs else _envs_with_specs()
    policies = list(policies) if policies else policy_names()
    _check_names("environment", envs, environment_names())
    _check_names("policy", policies, policy_names())
    scopes = sorted({scope for scope, _, _ in settings if scope is not None} - set(policies))
    if scopes:
        raise BadArguments(f"--setting names policies not being run: {', '.join(scopes)}")
    configs = []
    for env in envs:
        spec_path = _checked_spec(env)
        cap = rounds if rounds is not None else default_rounds(load_spec(spec_path))
        for policy in policies:
            chosen = _settings_for(policy, env, spec_path, settings)
            configs += [
                RunConfig(env, policy, seed, cap, chosen, str(spec_path), device)
                for seed in range(seeds)
            ]
    return configs


def default_rounds(spec: ExperimentSpec) -> int:
    """The round cap when none is given: what the budget pays for in a budgeted
    multi-fidelity spec, else `DEFAULT_ROUNDS`."""
    return budget_rounds(spec) or DEFAULT_ROUNDS


def _check_names(kind: str, names: Sequence[str], known: Sequence[str]) -> None:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadArguments(
            f"unknown {kind} {', '.join(map(repr, unknown))}; known: {', '.join(known) or 'none'}"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BadArguments(f"{kind} given twice: {', '.join(repeated)}")


def _envs_with_specs() -> list[str]:
    try:
        folder = examples_dir()
    except ExamplesNotFound as error:
        raise BadArguments(str(error)) from None
    return [name for name in environment_names() if (folder / f"{name}.yaml").is_file()]


def _checked_spec(env: str) -> Path:
    """The env's spec path, after checking it loads and matches the simulator's structure."""
    try:
        path = example_spec(env)
        spec = load_spec(path)
    except (ExamplesNotFound, SpecError) as error:
        raise BadArguments(f"environment {env!r}: {error}") from None
    sim = make_environment(env, 0)
    mismatched = [
        what
        for what, ours, theirs in [
            ("nodes", spec.node_names, sim.node_names),
            ("actions", spec.action_names, sim.action_names),
            ("reward node", [spec.reward.node], [sim.reward_node]),
        ]
        if set(ours) != set(theirs)
    ]
    if mismatched:
        raise BadArguments(f"{path} does not match simulator {env!r}: {', '.join(mismatched)}")
    return path


def _settings_for(
    policy: str, env: str, spec_path: Path, settings: Sequence[Setting]
) -> dict[str, Any]:
    """The spec's settings if `policy` is the spec's own, then every matching override."""
    spec = load_spec(spec_path)
    chosen = dict(spec.policy.settings) if spec.policy.name == policy else {}
    chosen.update({key: value for scope, key, value in settings if scope in (None, policy)})
    try:
        made = make_policy(policy, spec, chosen)
    except ValueError as error:
        unscoped = any(scope is None for scope, _, _ in settings)
        hint = " (a --setting without POLICY: applies to every policy)" if unscoped else ""
        raise BadArguments(f"{spec_path.stem}: {error}{hint}") from None
    recorder = make_environment(env, 0)
    if made.states_shape() is not None and not getattr(recorder, "records_states", False):
        # the service would wait in phase 0 to the end: its devices send no states
        raise BadArguments(
            f"{env}: {policy} waits for visited_states, and {env} does not record the states "
            "its episodes visit"
        )
    return chosen


# --------------------------------------------------------------------------- running
def run(
    envs: Sequence[str] | None,
    policies: Sequence[str] | None,
    seeds: int,
    rounds: int | None,
    out: Path,
    settings: Sequence[Setting] = (),
    workers: int | None = None,
    force: bool = False,
    console: Console | None = None,
    device: str = "cpu",
) -> RegretResult:
    """Plan, play (or load) every run, then write and print the summary.

    Raises:
        BadArguments: before any run starts (see `plan`), or when DIR holds a run of another
            config.
    """
    console = console or wide_console()
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise BadArguments(f"workers must be at least 1 (got {workers})")
    configs = plan(envs, policies, seeds, rounds, settings, device)
    out = Path(out)
    results = {} if force else _load_finished(configs, out)
    todo = [c for c in configs if _key(c) not in results]
    if results:
        console.print(f"resuming: {len(results)} of {len(configs)} runs already in {out}")
    with progress_bar(console) as progress:
        task = progress.add_task("regret", total=len(configs), completed=len(results))
        for payload in _execute(todo, workers):
            _save(run_path(out, *_key(payload)), payload)
            results[_key(payload)] = payload
            progress.advance(task)
            _report_run(payload, console)
    ordered = [results[_key(c)] for c in configs]
    rows = summarize(ordered)
    _write_summary(out, configs, ordered, rows, workers, console)
    failed = sum(p["status"] == "failed" for p in ordered)
    return RegretResult(rows, ran=len(todo), loaded=len(configs) - len(todo), failed=failed)


def run_path(out: Path, env: str, policy: str, seed: int) -> Path:
    return Path(out) / "runs" / env / policy / f"seed{seed}.json"


def _key(run: RunConfig | Mapping[str, Any]) -> tuple[str, str, int]:
    """(env, policy, seed) of a config or a payload."""
    if isinstance(run, RunConfig):
        return run.env, run.policy, run.seed
    return run["env"], run["policy"], run["seed"]


def _load_finished(configs: Sequence[RunConfig], out: Path) -> dict[tuple, dict[str, Any]]:
    """Saved runs that can be reused: same config and version, not failed. Unreadable files and
    runs of an older version (RUN_VERSION) are re-run."""
    found = {}
    for config in configs:
        path = run_path(out, *_key(config))
        try:
            payload = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        # runs saved before `device` existed ran on the CPU
        saved = {k: payload.get(k, "cpu" if k == "device" else None) for k in config.identity()}
        if saved != plain(config.identity()):
            raise BadArguments(
                f"{path} was run with {saved}, not {plain(config.identity())}; "
                "use --force to redo it or another --out"
            )
        if payload.get("status") != "failed" and payload.get("version") == RUN_VERSION:
            found[_key(config)] = payload  # an older version is re-run, not reused
    return found


def _execute(todo: Sequence[RunConfig], workers: int) -> Iterator[dict[str, Any]]:
    """Run payloads as they finish: in this process for one worker, else in a spawn pool."""
    for config, outcome in run_all(play, todo, workers):
        yield _crashed(config, outcome) if isinstance(outcome, BaseException) else outcome


def _crashed(config: RunConfig, error: BaseException) -> dict[str, Any]:
    return plain(skeleton(config, f"worker crashed: {type(error).__name__}: {error}"))


def _save(path: Path, payload: Mapping[str, Any]) -> None:
    """Write atomically, so an interrupted benchmark never leaves a half-written run."""
    partial = path.with_name(path.name + ".partial")
    write_json(partial, payload)
    os.replace(partial, path)


def _report_run(payload: Mapping[str, Any], console: Console) -> None:
    name = f"{payload['env']} {payload['policy']} seed {payload['seed']}"
    seconds = payload.get("wall_seconds") or 0.0
    if payload["status"] == "failed":
        console.print(f"{name}: FAILED ({payload['error']})", markup=False)
        return
    metrics = payload["metrics"] or {}
    regret = metrics.get("cumulative_regret")
    text = f"{name}: {payload['status']}, {metrics.get('rounds_completed', 0)} rounds"
    text += "" if regret is None else f", cumulative regret {regret:.4g}"
    if payload["status"] == "stopped":
        text += f" ({payload['stop_reason']})"
    if not console.is_terminal:
        console.print(f"{text} [{seconds:.1f} s]", markup=False)
    elif payload["status"] == "stopped":
        console.print(text, markup=False)


# --------------------------------------------------------------------------- summary
def summarize(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (env, policy), in the order first met; see the module docstring."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for payload in runs:
        groups.setdefault((payload["env"], payload["policy"]), []).append(payload)
    rows = []
    for (env, policy), group in groups.items():
        if group[0].get("fidelity"):  # paper 001's domains: the cost axis
            rows.append(fidelity_row(env, policy, group))
        else:
            rows.append(_row(env, policy, group))
    fidelity_envs = dict.fromkeys(p["env"] for p in runs if p.get("fidelity"))
    rows += [ql_row(env, [p for p in runs if p["env"] == env]) for env in fidelity_envs]
    return rows


def _row(env: str, policy: str, group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    done = [p for p in group if p["status"] != "failed" and p.get("metrics")]
    finals = {
        name: [p["metrics"][name] for p in done]
        for name in ("average_reward", "best_reward", "cumulative_regret")
    }
    row: dict[str, Any] = {"env": env, "policy": policy, "seeds": len(done)}
    row["rounds"] = group[0]["rounds"]
    for name in ("average_reward", "best_reward", "cumulative_regret"):
        row[f"mean_{name}"], row[f"se_{name}"] = mean_se(finals[name])
    for name in ("seconds_per_round", "decision_seconds", "update_seconds"):
        row[name] = _mean([p["metrics"][name] for p in done])
    row["optimum"] = _mean([p["optimum"] for p in group if p.get("optimum") is not None])
    row["seeds_failed"] = sum(p["status"] == "failed" for p in group)
    row["seeds_stopped_early"] = sum(p["status"] == "stopped" for p in group)
    row["violations"] = sum(
        len(r.get("violations", []))
        for p in group
        for r in [*p.get("initial_design", []), *p["history"]]
    )
    structures = [p["structure"] for p in done if p.get("structure")]
    if structures:
        row["structure_f1"] = _mean([s["f1"] for s in structures])
    budgets = {p["budget"] for p in group if p.get("budget") is not None}
    if budgets:
        row["budget"] = max(budgets)
        row["max_budget_spent"] = max(p.get("spent", 0.0) for p in group)
    return row


def mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and standard error (sample std, ddof 1, over √n); None where undefined."""
    if not values:
        return None, None
    if len(values) == 1:
        return float(values[0]), None
    return statistics.fmean(values), statistics.stdev(values) / len(values) ** 0.5


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def orderings(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Per environment, policies from best to worst by each headline metric (no data last)."""
    result: dict[str, dict[str, list[str]]] = {}
    for env in dict.fromkeys(r["env"] for r in rows):
        mine = [r for r in rows if r["env"] == env]
        if all("mean_final_score" in r for r in mine):  # multi-fidelity: the final test score
            result[env] = {"final_score": _ranked(mine, "mean_final_score", lower_is_better=False)}
            continue
        result[env] = {
            "cumulative_regret": _ranked(mine, "mean_cumulative_regret", lower_is_better=True),
            "average_reward": _ranked(mine, "mean_average_reward", lower_is_better=False),
        }
    return result


def _ranked(rows: Sequence[Mapping[str, Any]], key: str, lower_is_better: bool) -> list[str]:
    sign = 1.0 if lower_is_better else -1.0
    have = sorted((r for r in rows if r[key] is not None), key=lambda r: sign * r[key])
    return [r["policy"] for r in have] + [r["policy"] for r in rows if r[key] is None]


COLUMNS = [
    ("env", "env"),
    ("policy", "policy"),
    ("seeds", "seeds"),
    ("rounds", "rounds"),
    ("mean_average_reward", "avg reward"),
    ("se_average_reward", "± SE"),
    ("mean_best_reward", "best reward"),
    ("mean_cumulative_regret", "cum. regret"),
    ("se_cumulative_regret", "± SE"),
    ("seconds_per_round", "s/round"),
    ("optimum", "optimum"),
]
BUDGET_COLUMNS = [("budget", "budget"), ("max_budget_spent", "max spent")]
OUTCOME_COLUMNS = [("seeds_stopped_early", "stopped"), ("seeds_failed", "failed")]


def _table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    if rows and all("mean_final_score" in r for r in rows):
        columns = COLUMNS[:2] + FIDELITY_COLUMNS + OUTCOME_COLUMNS[1:]
        cells = [[_cell(r.get(key)) for key, _ in columns] for r in rows]
        return [title for _, title in columns], cells
    columns = COLUMNS + (BUDGET_COLUMNS if any("budget" in r for r in rows) else [])
    if any("structure_f1" in r for r in rows):
        columns += [("structure_f1", "structure F1")]
    columns += OUTCOME_COLUMNS
    cells = [[_cell(r.get(key)) for key, _ in columns] for r in rows]
    return [title for _, title in columns], cells


def _cell(value: Any) -> Any:
    return float("nan") if value is None else value


def _write_summary(
    out: Path,
    configs: Sequence[RunConfig],
    runs: Sequence[Mapping[str, Any]],
    rows: list[dict[str, Any]],
    workers: int,
    console: Console,
) -> None:
    failures = [
        {
            **{k: p[k] for k in ("env", "policy", "seed", "error")},
            "run": str(run_path(out, *_key(p))),
        }
        for p in runs
        if p["status"] == "failed"
    ]
    config = {
        "envs": list(dict.fromkeys(c.env for c in configs)),
        "policies": list(dict.fromkeys(c.policy for c in configs)),
        "seeds": len({c.seed for c in configs}),
        "rounds": _rounds_of(configs),
        "settings": {c.policy: c.settings for c in configs if c.settings},
        "workers": workers,
        "threads_per_worker": 1,
        **device_info(configs[0].device),
    }
    for row in rows:
        row.update(device_info(configs[0].device))
    ranks = orderings(rows)
    summary = {
        "schema": SUMMARY_SCHEMA,
        "version": SUMMARY_VERSION,
        "machine": machine_info(configs[0].device),
        "config": config,
        "rows": rows,
        "orderings": ranks,
        "failures": failures,
    }
    write_json(out / "summary.json", plain(summary))
    columns, cells = _table(rows)
    (out / "summary.md").write_text(_markdown(config, columns, cells, rows, ranks, failures))
    print_table(_title(config), columns, cells, console)
    for env in config["envs"]:
        path = out / f"{env}.png"
        env_runs = [p for p in runs if p["env"] == env]
        plot = plot_cost if any(p.get("fidelity") for p in env_runs) else plot_env
        if plot(env, env_runs, path):
            console.print(f"plot: {path}")
    for failure in failures:
        console.print(f"FAILED {failure['run']}: {failure['error']}", markup=False)
    console.print(f"summary: {out / 'summary.json'}, {out / 'summary.md'}")


def _rounds_of(configs: Sequence[RunConfig]) -> int | dict[str, int]:
    """The round cap, or the cap per environment where they differ (budgeted domains)."""
    caps = {c.env: c.rounds for c in configs}
    return configs[0].rounds if len(set(caps.values())) == 1 else caps


def _title(config: Mapping[str, Any]) -> str:
    return (
        f"Regret benchmark: {config['seeds']} seeds × {config['rounds']} rounds "
        f"(metrics at the last round, mean over seeds; {config['device']}: "
        f"{config['device_name']})"
    )


def _markdown(
    config: Mapping[str, Any],
    columns: Sequence[str],
    cells: Sequence[Sequence[Any]],
    rows: Sequence[Mapping[str, Any]],
    ranks: Mapping[str, Mapping[str, list[str]]],
    failures: Sequence[Mapping[str, Any]],
) -> str:
    lines = [f"# {_title(config)}", "", markdown_table(columns, cells), "## Orderings", ""]
    by_key = {(r["env"], r["policy"]): r for r in rows}
    for env, ranked in ranks.items():
        if "final_score" in ranked:
            score = _ordering(env, ranked["final_score"], by_key, "final_score", " > ")
            lines.append(f"- **{env}** final test score (higher is better): {score}")
            continue
        regret = _ordering(env, ranked["cumulative_regret"], by_key, "cumulative_regret", " < ")
        reward = _ordering(env, ranked["average_reward"], by_key, "average_reward", " > ")
        lines += [
            f"- **{env}** cumulative regret (lower is better): {regret}",
            f"- **{env}** average reward (higher is better): {reward}",
        ]
    if failures:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {f['env']} {f['policy']} seed {f['seed']}: {f['error']}" for f in failures]
    lines += ["", "## Metrics", "", METRICS_MARKDOWN]
    return "\n".join(lines)


def _ordering(env: str, ranked: Sequence[str], by_key: Mapping, metric: str, sep: str) -> str:
    parts = []
    for policy in ranked:
        row = by_key[env, policy]
        mean, se = row[f"mean_{metric}"], row[f"se_{metric}"]
        value = (
            "no data" if mean is None else f"{mean:.4g}" + ("" if se is None else f" ± {se:.2g}")
        )
        parts.append(f"{policy} ({value})")
    return sep.join(parts)


METRICS_MARKDOWN = """\
Over the R policy rounds t = 1..R (the environment's paper initial design is played and learned
first and is not counted), with f* the environment's optimum and r_t = E[y | a_t] the oracle's
noiseless expected reward of the intervention played in round t:

- **average reward** A_t = (1/t) Σ_{s≤t} r_s, the running mean;
- **best reward** B_t = max_{s≤t} r_s, the running max;
- **cumulative regret** C_t = Σ_{s≤t} (f* − r_s);
- **s/round** the mean wall time of one propose plus one learn (one torch thread per worker).

The table gives each run's value at its last round (R, or earlier when the policy found nothing
affordable; see "stopped"), averaged over seeds, with SE = sample std / √seeds. Failed runs are
left out and counted. Plots show mean ± 1 SE over the runs that reached round t. Budget: spent
sums the cost of every round, the initial design included; where the paper's design breaks the
spec's constraints (alpine2-budget) the design is drawn by the random explorer within them.
"violations" counts rounds, design included, that broke cardinality, a cap or the budget.
"""


# --------------------------------------------------------------------------- plots
def plot_env(env: str, runs: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """Average reward and cumulative regret against t for every policy; False if no data."""
    by_policy: dict[str, list[Mapping[str, Any]]] = {}
    for payload in runs:
        if payload["status"] != "failed" and payload["history"]:
            by_policy.setdefault(payload["policy"], []).append(payload)
    if not by_policy:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward_ax, regret_ax) = plt.subplots(1, 2, figsize=(13, 4.8))
    for policy, group in by_policy.items():
        _band(reward_ax, group, "average_reward", policy)
        _band(regret_ax, group, "cumulative_regret", policy)
    optima = [p["optimum"] for group in by_policy.values() for p in group]
    label = "optimum f*" if len(set(optima)) == 1 else "optimum f* (mean over seeds)"
    reward_ax.axhline(float(np.mean(optima)), color="black", ls="--", lw=1, label=label)
    seeds = max(len(group) for group in by_policy.values())
    reward_ax.set_title(f"{env}: average reward (mean ± 1 SE, {seeds} seeds)")
    reward_ax.set_ylabel(r"average reward $A_t$ (mean of E[y | $a_s$], $s \leq t$)")
    regret_ax.set_title(f"{env}: cumulative regret (mean ± 1 SE, {seeds} seeds)")
    regret_ax.set_ylabel(r"cumulative regret $C_t$ (sum of $f^*$ − E[y | $a_s$])")
    for ax in (reward_ax, regret_ax):
        ax.set_xlabel("policy round t (after the initial design)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _band(ax, group: Sequence[Mapping[str, Any]], metric: str, label: str) -> None:
    series = [curves(p["history"])[metric] for p in group]
    length = max(len(s) for s in series)
    mean, se = np.full(length, np.nan), np.zeros(length)
    for t in range(length):
        mean[t], spread = mean_se([float(s[t]) for s in series if len(s) > t])
        se[t] = spread or 0.0
    t = np.arange(1, length + 1)
    (line,) = ax.plot(t, mean, label=label)
    ax.fill_between(t, mean - se, mean + se, color=line.get_color(), alpha=0.2)


# --------------------------------------------------------------------------- listing
_PAPER = re.compile(r"paper (\d{3})")


def list_choices(console: Console | None = None) -> None:
    """Print the environments (paper, spec file or its absence) and the policies."""
    console = console or wide_console()
    try:
        folder: Path | None = examples_dir()
        where = str(folder)
    except ExamplesNotFound as error:
        folder, where = None, str(error)
    table = Table(title=f"Environments (specs: {where})", title_justify="left")
    for column in ("env", "paper", "spec"):
        table.add_column(column)
    for name in environment_names():
        try:
            description, note = make_environment(name, 0).description, ""
        except EnvironmentUnavailable as missing:  # its optional extra (e.g. not in the image)
            description, note = "", f" (needs the {missing.extra} extra)"
        match = _PAPER.search(description)
        spec = folder / f"{name}.yaml" if folder else None
        shown = (spec.name if spec and spec.is_file() else "missing") + note
        table.add_row(name, match.group(1) if match else "—", shown)
    console.print(table)
    console.print("Policies: " + (", ".join(policy_names()) or "none"))
