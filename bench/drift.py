"""`cbo-agent bench drift`: which model keeps regret low on a stream, stationary or drifting.

One GP of the reward over the actions (the flat model; the graph plays no part in what is
compared), GP-UCB on it, the same seeds, rounds and candidates for every model:

    stationary  the exact `IncrementalGP` of every reading
    bounded     the same, exact up to `--capacity`, then `--budget` rows (`core.gp.bounded`)
    window      the exact GP of the last `--window` readings (oldest forgotten)
    time        `core.gp.temporal.TemporalGP`: the round is an input of the kernel
    period      the same with a periodic factor of `--period` rounds (`TemporalGP(period=)`):
                last period's same phase informs the present
    change      the stationary model with the change detector (`core.gp.change`, its default
                settings): on an alarm it forgets its readings from before the change

Round t acts on `env.at(t)` for a drifting environment (`sim.dropwave_drift`,
`sim.sir_seasonal`, `sim.sir_school_terms`), on `env` itself otherwise, and its regret is that
round's, so the sum is the dynamic cumulative regret Σ_t f_t(a*_t) − f_t(a_t), exact from the
oracles. The GP's observation noise is learned (the reward node's own noise is only a lower
bound on Var(Y | a)). UCB: μ + √β·σ with β = 2·log(|candidates|·t²·π²/(6·0.1)) / 5 (the GP-UCB
schedule of Srinivas et al. scaled down, as practical GP-UCB does), maximized over 512 uniform
random candidates and 64 perturbations (std 0.02 of the box) of the best observed input, redrawn
each round.

An environment whose actions are constrained beyond their box (`sim.sir`'s dose budget: it
has `feasible` and `random_feasible`) gets candidates from its feasible set only: the uniform
ones and the random first rounds from `random_feasible`, the perturbations kept where
`feasible`; its optimum is the best feasible action, so a round's regret is never negative.
Each run counts the rounds whose action broke the constraint (`infeasible`, 0 by this).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from bench.pool import run_all
from bench.report import machine_info, print_table, progress_bar, wide_console, write_json
from core.gp import GPConfig
from core.gp.bounded import make_gp
from core.gp.change import ChangeConfig
from core.gp.temporal import TemporalGP
from sim.registry import make_environment

__all__ = ["MODELS", "Run", "run", "run_one"]

MODELS = ("stationary", "bounded", "window", "time", "period", "change")


@dataclass
class Run:
    """One model on one seed."""

    env: str
    model: str
    seed: int
    rounds: int
    regret: float  # cumulative (dynamic) regret
    seconds: float
    infeasible: int = 0  # rounds whose action broke the environment's constraint


def _model(name: str, actions: int, noise: float | None, options: dict[str, int]):
    bounds = torch.tensor([[0.0, 1.0]] * actions, dtype=torch.float64)
    settings = {"noise_variance": noise, "refit_every": options["refit_every"], "misfit_z": None}
    if name == "stationary":
        return make_gp(bounds, GPConfig(**settings))
    if name == "bounded":
        config = GPConfig(capacity=options["capacity"], budget=options["budget"], **settings)
        return make_gp(bounds, config)
    if name == "window":
        return make_gp(bounds, GPConfig(window=options["window"], **settings))
    if name == "time":
        return TemporalGP(bounds, GPConfig(**settings), time_scale=options["time_scale"])
    if name == "period":
        return TemporalGP(
            bounds,
            GPConfig(**settings),
            time_scale=options["time_scale"],
            period=options["period"],
        )
    if name == "change":
        return make_gp(bounds, GPConfig(change=ChangeConfig(), **settings))
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def run_one(env_name: str, model: str, seed: int, rounds: int, options: dict[str, int]) -> Run:
    """GP-UCB with `model` for `rounds` rounds on `env_name` (see the module)."""
    env = make_environment(env_name, seed)
    names = env.action_names
    low = torch.tensor([a.bounds[0] for a in env.actions], dtype=torch.float64)
    span = torch.tensor([a.bounds[1] - a.bounds[0] for a in env.actions], dtype=torch.float64)
    # The flat GP's noise is learned, not the reward node's own: this model sees Var(Y | a),
    # which holds the noise of every node upstream too (dropwave-drift: the reward node's std
    # is 0.1, but X0's noise passed through the ripple makes Y's std given the actions
    # 0.25-0.34; told 0.1, the fit explained the rest by lengthscales at their floor, 0.001,
    # and every model decided as on white noise; see docs/benchmarks.md, issue 22).
    gp = _model(model, len(names), None, options)
    gen = torch.Generator().manual_seed(seed)
    sim = torch.Generator().manual_seed(10_000 + seed)
    temporal = isinstance(gp, TemporalGP)
    # a constraint beyond the box (a budget): candidates from the feasible set only
    constrained = hasattr(env, "feasible") and hasattr(env, "random_feasible")
    feasible_rng = np.random.default_rng(seed)

    def uniform(num: int) -> torch.Tensor:
        if not constrained:
            return torch.rand(num, len(names), dtype=torch.float64, generator=gen)
        x = torch.from_numpy(env.random_feasible(num, feasible_rng)).to(torch.float64)
        return ((x - low) / span).clamp(0.0, 1.0)

    best_u: torch.Tensor | None = None
    regret, infeasible, started = 0.0, 0, time.perf_counter()
    for t in range(rounds):
        system = env.at(t) if hasattr(env, "at") else env
        if t < options["initial"]:
            u = uniform(1)[0]
        else:
            cand = uniform(512)
            if best_u is not None:
                local = best_u + 0.02 * torch.randn(
                    64, len(names), dtype=torch.float64, generator=gen
                )
                local = local.clamp(0.0, 1.0)
                if constrained:
                    local = local[env.feasible(low + span * local)]
                cand = torch.cat((cand, local))
            post = gp.posterior(cand[None], t) if temporal else gp.posterior(cand[None])
            beta = 2.0 * math.log(cand.shape[0] * (t + 1) ** 2 * math.pi**2 / 0.6) / 5.0
            score = post.mean[0] + math.sqrt(beta) * post.variance[0].clamp_min(0).sqrt()
            u = cand[int(torch.argmax(score))]
        if constrained and not bool(env.feasible(low + span * u)):
            infeasible += 1
        action = {name: float(v) for name, v in zip(names, low + span * u, strict=True)}
        y = system.step(action, sim)[env.reward_node]
        regret += system.optimum.value - system.expected_reward(action)
        if temporal:
            gp.learn_one(u[None], [y], t)
        else:
            gp.learn_one(u[None], [y])
        if t + 1 >= options["initial"] and (t + 1) % 5 == 0:  # the incumbent, at the present
            held = (gp.gp if temporal else gp).member_data(0)[0][:, : len(names)]
            post = gp.posterior(held[None], t + 1) if temporal else gp.posterior(held[None])
            k = int(torch.argmax(post.mean[0]))
            best_u = held[k].clone()
    seconds = time.perf_counter() - started
    return Run(env_name, model, seed, rounds, regret, seconds, infeasible)


def _run_job(job: tuple[str, str, int, int, dict[str, int]]) -> Run:
    return run_one(*job)


def _save(
    path: Path, env_name: str, rounds: int, seeds: int, options: dict[str, int], runs: list[Run]
) -> None:
    write_json(
        path,
        {
            "machine": machine_info(),
            "load_average": os.getloadavg(),
            "env": env_name,
            "rounds": rounds,
            "seeds": seeds,
            "options": options,
            "runs": [asdict(r) for r in runs],
        },
    )


def run(
    env_name: str,
    models: list[str],
    seeds: int,
    rounds: int,
    json_path: Path | None,
    options: dict[str, int],
    console: Console | None = None,
    workers: int = 1,
) -> list[Run]:
    """Every model on every seed; print mean ± std of the cumulative regret, save JSON.

    With `workers` > 1 the runs go to a pool of one-thread processes (`bench.pool`), seed by
    seed (every model of seed 0 first): a campaign cut off keeps whole seeds, paired."""
    console = console or wide_console()
    jobs = [(env_name, model, seed, rounds, options) for seed in range(seeds) for model in models]
    runs: list[Run] = []
    with progress_bar(console) as progress:
        task = progress.add_task(f"drift {env_name}", total=len(jobs))
        for job, outcome in run_all(_run_job, jobs, workers):
            if isinstance(outcome, BaseException):
                raise RuntimeError(f"{job[1]} seed {job[2]}: {outcome}") from outcome
            runs.append(outcome)
            runs.sort(key=lambda r: (r.seed, models.index(r.model)))
            if json_path is not None:  # after every run: a cut-off campaign keeps its runs
                _save(json_path, env_name, rounds, seeds, options, runs)
            progress.advance(task)
    rows = []
    for model in models:
        values = [r.regret for r in runs if r.model == model]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        seconds = statistics.mean(r.seconds for r in runs if r.model == model)
        rows.append((model, statistics.mean(values), spread, seconds))
    print_table(
        f"{env_name}: cumulative regret over {rounds} rounds, {seeds} seeds",
        ["model", "mean", "std", "s/run"],
        rows,
        console,
    )
    if json_path is not None:
        console.print(f"results: {json_path}")
    return runs
