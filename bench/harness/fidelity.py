"""One run of a multi-fidelity experiment (paper 001): a policy spends a budget on trials
(θ, τ, q) of a subgoal domain; the recommendation is tested as the budget is spent.

`play_fidelity(config)` follows the agent's loop in process: propose under
`Constraints.from_spec(spec, spent)`, run the trial (q replications of τ interactions), learn
its mean with the variance the device would report, charge q·τ. It stops when nothing is
affordable (the budget is spent) or after `config.rounds` rounds. `budget_rounds(spec)`, the
most rounds the budget can pay for at the cheapest trial, is the cap `bench regret` gives a
budgeted domain unless told otherwise, so the budget, not the cap, ends the run; a run the
cap ends with budget unspent says so in `stop_reason`. Initial designs are the policies' own
and are charged like every trial.

Measured, with the same test environments for every policy of a seed:
- the cost axis (the paper's Figure 7): when cumulative cost crosses each tenth of the budget,
  the recommendation argmax_θ μ(θ, τ_max) of the (θ, τ) GP fitted to the trials so far (for
  every policy, so they differ only in the trials they chose) is trained for τ_max
  interactions in `TEST_ENVIRONMENTS` fresh environments and scored greedily;
- the final score: that test at the end (`final_score`, and `final_steps` for step domains);
- Table 1's performance ratio at T = m, 2m, …, 10m, E[V with θ_rec] / E[V from scratch]
  (paper 001, Sec. 5.8): after T interactions in the same fresh test environments, the mean
  greedy steps with the final recommendation's subgoals (`table1_with`) and without
  (`table1_scratch`; TR: mean discounted returns, 0 where the goal is not reached), and their
  quotient for this run (`table1_ratio`). Over seeds the expectation is pooled:
  `bench.fidelity_report.table1_ratio_of` divides the means, not averages the quotients;
- QL, the paper's subgoal-free baseline: Q-learning for τ_max in the same test environments
  (`ql_score`), independent of the policy;
- the decision time of each round (propose) and of the model update.
"""

from __future__ import annotations

import math
import time
import traceback
from typing import Any

import numpy as np
import torch

from bench.harness.episode import RunConfig, plain, skeleton
from core.network import NetworkModel
from core.spec import ExperimentSpec, load_spec
from policies._fidelity import FidelityPolicy, FittedModel, recommend, trials
from policies.base import Constraints, NothingAffordable
from policies.registry import make_policy
from sim._subgoal_env import SubgoalDomain
from sim.registry import make_environment

__all__ = [
    "CHECKPOINTS",
    "TEST_ENVIRONMENTS",
    "budget_rounds",
    "play_fidelity",
    "table1_means",
]

TEST_ENVIRONMENTS = 100  # fresh test environments per evaluation (the paper averages 200)
CHECKPOINTS = 10  # recommendation tests along the budget
TABLE1_MULTIPLES = tuple(range(1, 11))


def budget_rounds(spec: ExperimentSpec) -> int | None:
    """The most rounds the spec's total budget can pay for: budget // the cheapest trial's
    cost (τ_min, q_min). None without a fidelity set or a total budget.

    Every round costs at least that much, so a run capped here ends when its budget is spent
    (a policy that only ever buys the cheapest trial uses exactly this many rounds).
    """
    fidelity, budget = spec.fidelity, spec.constraints.budget_total
    if fidelity is None or budget is None:
        return None
    cheapest = fidelity.cost(min(fidelity.levels), fidelity.q_min)
    return max(1, math.floor(budget / cheapest + 1e-9))


def play_fidelity(config: RunConfig) -> dict[str, Any]:
    """The run's JSON payload; a failure inside is status "failed" with its traceback."""
    payload = skeleton(config)
    payload["fidelity"] = True
    started = time.perf_counter()
    try:
        _play(config, payload)
    except Exception as error:  # reported in the payload, never raised from a worker
        payload["status"] = "failed"
        payload["error"] = f"{type(error).__name__}: {error}"
        payload["traceback"] = traceback.format_exc()
    payload["wall_seconds"] = time.perf_counter() - started
    payload["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return plain(payload)


def _play(config: RunConfig, payload: dict[str, Any]) -> None:
    env = make_environment(config.env, config.seed)
    assert isinstance(env, SubgoalDomain)
    spec = load_spec(config.spec).model_copy(
        update={
            "initial_design": load_spec(config.spec).initial_design.model_copy(
                update={"seed": config.seed}
            )
        }
    )
    budget = spec.constraints.budget_total
    policy = make_policy(config.policy, spec, config.settings)
    model = NetworkModel(spec)
    rng = torch.Generator().manual_seed(config.seed)
    trial_rng = np.random.default_rng([config.seed, 1])
    test_seed = [config.seed, 2]
    fitted = (
        policy.fitted
        if isinstance(policy, FidelityPolicy)
        else FittedModel(spec, refit_every=5, restarts=2, seed=config.seed)
    )
    grid = _grid(policy, spec, config.seed)
    payload.update(status="ok", budget=budget, spent=0.0, history=[], curve=[])
    payload["optimum"] = env.optimum.value
    next_checkpoint = 1
    spent = 0.0
    payload["stop_reason"] = None
    for number in range(config.rounds):
        constraints = Constraints.from_spec(spec, spent)
        t0, cpu_t0 = time.perf_counter(), time.process_time()
        try:
            proposal = policy.propose(model, constraints, rng)
        except NothingAffordable as reason:  # the budget is spent: the normal end
            payload["stop_reason"] = str(reason)
            break
        decided, cpu_decided = time.perf_counter() - t0, time.process_time() - cpu_t0
        result = env.trial(proposal.intervention, trial_rng)
        t1 = time.perf_counter()
        index = model.start_round(proposal.intervention)
        model.note_replications(index, spec.reward.node, result.variance, result.replications)
        model.observe(index, {spec.reward.node: result.mean})
        spent += proposal.cost
        payload["history"].append(
            {
                "round": number,
                "intervention": proposal.intervention,
                "cost": proposal.cost,
                "spent": spent,
                "reward": result.mean,
                "variance": result.variance,
                "decision_seconds": decided,
                "decision_cpu_seconds": cpu_decided,  # all the process's threads
                "update_seconds": time.perf_counter() - t1,
                "diagnostics": {
                    k: v for k, v in proposal.diagnostics.items() if isinstance(v, int | float)
                },
            }
        )
        while (
            budget
            and next_checkpoint <= CHECKPOINTS
            and spent >= budget * next_checkpoint / CHECKPOINTS
        ):
            payload["curve"].append(_checkpoint(env, spec, model, fitted, grid, spent, test_seed))
            next_checkpoint += 1
    payload["spent"] = spent
    if payload["stop_reason"] is None and _affordable(spec, spent):
        payload["stop_reason"] = (
            f"round cap {config.rounds} reached with {budget - spent:g} of the budget "
            f"{budget:g} unspent"
        )
    final = _checkpoint(env, spec, model, fitted, grid, spent, test_seed)
    if not payload["curve"] or payload["curve"][-1]["spent"] != spent:
        payload["curve"].append(final)
    theta = np.array([final["recommendation"][n] for n in env.theta_names()])
    ql = env.test(None, int(env.tau_max), TEST_ENVIRONMENTS, np.random.default_rng(test_seed))
    history = payload["history"]
    with_goals, scratch = table1_means(env, theta, test_seed)
    payload["metrics"] = {
        "rounds_completed": len(history),
        "final_score": final["score"],
        "final_steps": final["steps"],
        "ql_score": float(env.score_of(ql).mean()),
        "ql_steps": float(ql.steps.mean()),
        "table1_with": with_goals,
        "table1_scratch": scratch,
        "table1_ratio": [_quotient(w, s) for w, s in zip(with_goals, scratch, strict=True)],
        "decision_seconds": _mean([h["decision_seconds"] for h in history]),
        "update_seconds": _mean([h["update_seconds"] for h in history]),
    }


def _grid(policy: Any, spec: Any, seed: int) -> torch.Tensor:
    """Θ̄ of the recommendation: the policy's own, else a Latin hypercube like it."""
    if isinstance(policy, FidelityPolicy):
        return policy.grid
    from policies._fidelity import latin_hypercube, theta_bounds

    bounds = theta_bounds(spec)
    unit = torch.tensor(latin_hypercube(500, bounds.shape[0], np.random.default_rng(seed)))
    return bounds[:, 0] + unit * (bounds[:, 1] - bounds[:, 0])


def _checkpoint(
    env: SubgoalDomain,
    spec: Any,
    model: NetworkModel,
    fitted: FittedModel,
    grid: torch.Tensor,
    spent: float,
    test_seed: list[int],
) -> dict[str, Any]:
    """The recommendation now and its test score in the run's test environments."""
    seen = trials(spec, model)
    if seen.n == 0:
        return {"spent": spent, "score": None, "steps": None, "recommendation": {}}
    theta, _ = recommend(spec, fitted(model), grid, seen)
    values = np.array([theta[n] for n in env.theta_names()])
    episode = env.test(
        values, int(env.tau_max), TEST_ENVIRONMENTS, np.random.default_rng(test_seed)
    )
    return {
        "spent": spent,
        "score": float(env.score_of(episode).mean()),
        "steps": float(episode.steps.mean()),
        "recommendation": theta,
    }


def table1_means(
    env: SubgoalDomain, theta: np.ndarray, test_seed: list[int]
) -> tuple[list[float], list[float]]:
    """Table 1 of paper 001 at T = m … 10m: the mean over `TEST_ENVIRONMENTS` fresh test
    environments of the greedy policy's steps after T interactions with the subgoals θ, and
    the same from scratch (TR: mean discounted returns, 0 without the goal), in the same
    environments. Two lists of 10 floats: (with subgoals, from scratch)."""
    with_means, scratch_means = [], []
    for multiple in TABLE1_MULTIPLES:
        interactions = env.table1_interval * multiple
        seed = [*test_seed, multiple]
        with_goals = env.test(theta, interactions, TEST_ENVIRONMENTS, np.random.default_rng(seed))
        scratch = env.test(None, interactions, TEST_ENVIRONMENTS, np.random.default_rng(seed))
        with_means.append(_performance(env, with_goals))
        scratch_means.append(_performance(env, scratch))
    return with_means, scratch_means


def _performance(env: SubgoalDomain, episode: Any) -> float:
    """V of Table 1 over test environments: mean steps (a cost), TR the mean return."""
    if env.step_metric:
        return float(episode.steps.mean())
    return float(env.score_of(episode).mean())


def _quotient(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.inf


def _affordable(spec: ExperimentSpec, spent: float) -> bool:
    """Whether the cheapest trial still fits the remaining budget."""
    fidelity, budget = spec.fidelity, spec.constraints.budget_total
    if fidelity is None or budget is None:
        return False
    return spent + fidelity.cost(min(fidelity.levels), fidelity.q_min) <= budget + 1e-9


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None
