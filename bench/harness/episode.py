"""One run of the regret benchmark: an environment, a policy and a seed, played for R rounds.

`play(config)` returns the run's JSON payload (see `bench.regret` for its schema) and never
raises for a failure inside the run: the payload then has status "failed" and the traceback, and
keeps the rounds played so far. It runs in a worker process, so it takes and returns plain data.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from core.network import NetworkModel
from core.spec import ExperimentSpec, load_spec
from core.structure import structure_scores
from policies.base import Constraints, NothingAffordable, Policy
from policies.random_search import RandomPolicy
from policies.registry import make_policy
from sim.base import Environment
from sim.registry import make_environment

__all__ = [
    "RUN_SCHEMA",
    "RUN_VERSION",
    "RunConfig",
    "curves",
    "design_problems",
    "final_metrics",
    "plain",
    "play",
    "seed_streams",
    "skeleton",
    "spec_for",
    "violations",
]

RUN_SCHEMA = "cbo-agent/bench-regret-run"
RUN_VERSION = 2  # 2: the initial design is charged, checked, and kept within the spec


@dataclass(frozen=True)
class RunConfig:
    """What identifies a run; a saved run is reused only when its config is equal."""

    env: str
    policy: str
    seed: int
    rounds: int
    settings: dict[str, Any] = field(default_factory=dict)
    spec: str = ""  # path of the experiment spec, resolved by the parent process
    device: str = "cpu"  # where the GPs live (`core.devices.resolve_device`)

    def identity(self) -> dict[str, Any]:
        """The fields a resumed run must match (not the spec path: a checkout may move)."""
        return {k: v for k, v in asdict(self).items() if k != "spec"}


def seed_streams(seed: int) -> tuple[int, int, int, int]:
    """Independent seeds for the environment's noise, the policy's generator, torch's global
    generator (which BoTorch's optimizers draw restarts from) and the random explorer's initial
    design, spawned from one run seed (the first three as before the fourth was added).

    The noise stream depends on the seed only, so every policy meets the same noise draws.
    """
    noise, policy, global_, design = np.random.SeedSequence(seed).generate_state(4)
    return int(noise), int(policy), int(global_), int(design)


def plain(value: Any) -> Any:
    """JSON-safe copy: tensors and numpy values become lists and floats, NaN and inf become None."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    return repr(value)


def skeleton(config: RunConfig, error: str | None = None) -> dict[str, Any]:
    """A run's payload before anything happened: a failure until the run says otherwise."""
    return {
        "schema": RUN_SCHEMA,
        "version": RUN_VERSION,
        **asdict(config),
        "status": "failed",
        "stop_reason": None,
        "error": error,
        "traceback": None,
        "optimum": None,
        "optimum_intervention": None,
        "budget": None,
        "spent": 0.0,
        "initial_design": [],
        "initial_design_source": None,
        "initial_design_seconds": None,
        "history": [],
        "metrics": None,
        "wall_seconds": None,
        "finished_at": None,
    }


def play(config: RunConfig) -> dict[str, Any]:
    """Run one episode; the payload records every round, the outcome and its timing.

    A multi-fidelity environment (paper 001's domains) is played by `bench.harness.fidelity`.
    """
    if _multi_fidelity(config):
        from bench.harness.fidelity import play_fidelity

        return play_fidelity(config)
    started = time.perf_counter()
    payload = skeleton(config)
    try:
        _play(config, payload)
    except Exception as error:  # a failing run is reported, never fatal to the benchmark
        payload["error"] = f"{type(error).__name__}: {error}"
        payload["traceback"] = traceback.format_exc()
    payload["metrics"] = final_metrics(payload["history"]) if payload["history"] else None
    payload["wall_seconds"] = time.perf_counter() - started
    payload["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return plain(payload)


def _multi_fidelity(config: RunConfig) -> bool:
    """Whether the environment is one of paper 001's (one that cannot be made fails in `_play`,
    reported in the payload)."""
    try:
        return bool(getattr(make_environment(config.env, config.seed), "levels", None))
    except Exception:
        return False


def _play(config: RunConfig, payload: dict[str, Any]) -> None:
    noise_seed, policy_seed, global_seed, design_seed = seed_streams(config.seed)
    torch.manual_seed(global_seed)
    noise = torch.Generator().manual_seed(noise_seed)
    rng = torch.Generator().manual_seed(policy_seed)

    env = make_environment(config.env, config.seed)
    spec = spec_for(env, load_spec(config.spec))
    model = NetworkModel(spec, device=config.device)
    policy = make_policy(config.policy, spec, config.settings)
    if model.array_shapes and policy.draws_fields:
        # as the service (agent/experiment.py): the field models are built at their first
        # reading and fitted when due beside the decisions (`_fit_fields`), not inside them
        model.prepare_fields(*policy.field_model_settings())
    optimum = env.optimum
    payload.update(
        optimum=optimum.value,
        optimum_intervention=optimum.intervention,
        budget=spec.constraints.budget_total,
    )

    states = _StatesHandOver(env, policy)
    try:
        _rounds(config, env, spec, model, policy, noise, rng, design_seed, states, payload)
    finally:
        states.close()


def _rounds(
    config: RunConfig,
    env: Environment,
    spec: ExperimentSpec,
    model: NetworkModel,
    policy: Policy,
    noise: torch.Generator,
    rng: torch.Generator,
    design_seed: int,
    states: _StatesHandOver,
    payload: dict[str, Any],
) -> None:
    optimum = env.optimum
    design = torch.Generator().manual_seed(design_seed)
    spent = _initial_design(env, spec, model, config.seed, noise, design, payload, states)
    if spent is None:
        return
    for t in range(1, config.rounds + 1):
        constraints = Constraints.from_spec(spec, spent)
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            proposal = policy.propose(model, constraints, rng)
        except NothingAffordable as reason:
            payload.update(status="stopped", stop_reason=f"round {t}: {reason}")
            return
        decided, cpu_decided = time.perf_counter(), time.process_time()
        intervention = proposal.intervention
        readings = env.step(intervention, noise)
        learn_start = time.perf_counter()
        model.learn(intervention, readings)
        learned = time.perf_counter()
        field_fit_seconds = _fit_fields(model)
        # before the oracle's episodes replace them
        handed = states.hand_over(len(payload["initial_design"]) + t - 1)

        record = {"round": t, **_reading(env, intervention, readings)}
        if handed is not None:
            record["visited_states"] = handed
        spent += record["cost"]
        payload["spent"] = spent
        record.update(
            target_set=list(proposal.target_set),
            spent=spent,
            regret=optimum.value - record["expected_reward"],
            acquisition_value=proposal.acquisition_value,
            decision_seconds=decided - start,
            decision_cpu_seconds=cpu_decided - cpu_start,  # all the process's threads
            update_seconds=learned - learn_start,
            field_fit_seconds=field_fit_seconds,
            diagnostics=proposal.diagnostics,
        )
        problems = violations(spec, constraints, intervention, record["cost"], spent)
        if problems:
            record["violations"] = problems
        payload["history"].append(record)
    payload["status"] = "ok"
    structure = structure_outcome(env, payload["history"])
    if structure is not None:
        payload["structure"] = structure


class _StatesHandOver:
    """The states an episode visited, handed to a policy that takes them (`hagpucb` with a
    `controller` and `visited_states`), as the service does (docs/protocol.md, "Visited
    states"): the environment records them (the device's `send_states`), every round's trace,
    the initial design's included, goes to `policy.observe_states` after the round is learnt,
    through the wire encoding (`ArrayPayload`, float32) the device sends them in. A trace of
    another (agents, obs) than the policy's fails the run (the service refuses it as
    `wrong_shape` and phase 0 would go on to the end). `close` leaves the environment, which
    `make_environment` caches per process, recording nothing again."""

    def __init__(self, env: Environment, policy: Policy) -> None:
        self.env, self.policy = env, policy
        self.shape = policy.states_shape()
        if self.shape is not None:
            if not getattr(env, "records_states", False):
                raise ValueError(f"{env.name} does not record the states its episodes visit")
            env.record_states = True  # type: ignore[attr-defined]
            env.last_states = None  # type: ignore[attr-defined]

    def hand_over(self, round_: int) -> int | None:
        """Hand the last episode's states, round `round_`'s (numbered as the service's: the
        initial design from 0), to the policy; their count T, or None where the policy takes
        none."""
        if self.shape is None:
            return None
        from connectors.arrays import ArrayPayload

        visited = self.env.last_states  # type: ignore[attr-defined]
        self.env.last_states = None  # type: ignore[attr-defined]
        if visited is None:  # an episode that recorded nothing: the device would send none
            return 0
        states = ArrayPayload.from_numpy(visited).to_numpy()
        if tuple(states.shape[1:]) != self.shape:
            raise ValueError(
                f"{self.env.name} visited states of (agents, obs) {tuple(states.shape[1:])}; "
                f"{self.policy.name} takes {self.shape}"
            )
        self.policy.observe_states(round_, states)
        return int(states.shape[0])

    def close(self) -> None:
        if self.shape is not None:
            self.env.record_states = False  # type: ignore[attr-defined]
            self.env.last_states = None  # type: ignore[attr-defined]


def structure_outcome(
    env: Environment, history: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """Precision, recall and F1 of the last dependency graph a policy reported (diagnostics
    `edges`) against the environment's true one (`dependency_edges`); None when either is
    missing (an environment without a known structure, a policy that learns none)."""
    truth = getattr(env, "dependency_edges", None)
    found = next(
        (r["diagnostics"]["edges"] for r in reversed(history) if "edges" in r["diagnostics"]),
        None,
    )
    if truth is None or found is None:
        return None
    scores = structure_scores(truth, found)
    return {**scores, "edges_found": len(found), "edges_true": len(truth)}


def spec_for(env: Environment, spec: ExperimentSpec) -> ExperimentSpec:
    """The spec with the environment's own finite action set, where it has one.

    Each seed of an environment is a new task; where the admissible actions are part of the
    task (weather: the seed places the sensors), the spec's list, written for seed 0, gives way
    to the seed's.
    """
    if env.candidates is None or spec.candidates is None:
        return spec
    return spec.model_copy(update={"candidates": env.candidates.tolist()})


def _initial_design(
    env: Environment,
    spec: ExperimentSpec,
    model: NetworkModel,
    seed: int,
    noise: torch.Generator,
    design: torch.Generator,
    payload: dict[str, Any],
    states: _StatesHandOver,
) -> float | None:
    """Play and learn the initial design, charged and checked like any round (not in metrics).

    The paper's design when it keeps the spec's constraints (all paper environments' specs);
    otherwise as many rounds drawn by the random explorer within them, as the agent service
    does (agent/experiment.py) — alpine2-budget's paper design sets all six nodes at cost 6.
    `design` draws the explorer's rounds, so every policy of a seed meets the same design.
    Returns the budget spent, or None when the design stopped the run (nothing affordable).
    """
    start = time.perf_counter()
    paper = env.initial_design(seed)
    explorer = RandomPolicy(spec) if design_problems(env, spec, paper) else None
    payload["initial_design_source"] = "paper" if explorer is None else "random explorer"
    spent = 0.0
    for k, planned in enumerate(paper, start=1):
        constraints = Constraints.from_spec(spec, spent)
        intervention = planned
        if explorer is not None:
            try:
                intervention = explorer.propose(model, constraints, design).intervention
            except NothingAffordable as reason:
                payload.update(status="stopped", stop_reason=f"initial design round {k}: {reason}")
                return None
        readings = env.step(intervention, noise)
        model.learn(intervention, readings)
        handed = states.hand_over(k - 1)
        record = _reading(env, intervention, readings)
        if handed is not None:
            record["visited_states"] = handed
        spent += record["cost"]
        payload["spent"] = record["spent"] = spent
        problems = violations(spec, constraints, intervention, record["cost"], spent)
        if problems:
            record["violations"] = problems
        payload["initial_design"].append(record)
    _fit_fields(model)
    payload["initial_design_seconds"] = time.perf_counter() - start
    return spent


def _fit_fields(model: NetworkModel) -> float:
    """Fit the built field models that are due (`prepare_fields`), between a round's reading
    and the next decision: what the service's refits do beside its loop (agent/refits.py), so
    that a decision's time is the decision's (issue 17). The same fits at the same data as a
    proposal's own `field_draws` would run, so the proposals do not change. Their seconds."""
    started = time.perf_counter()
    for node in model.fields:
        model.refresh_field(node)
    return time.perf_counter() - started


def design_problems(
    env: Environment, spec: ExperimentSpec, design: Sequence[Mapping[str, float]]
) -> list[str]:
    """What the spec's constraints would object to in `design`, played in order and charged."""
    problems, spent = [], 0.0
    for intervention in design:
        constraints = Constraints.from_spec(spec, spent)
        cost = env.cost(intervention)
        spent += cost
        problems += violations(spec, constraints, intervention, cost, spent)
    return problems


def _reading(
    env: Environment, intervention: Mapping[str, float], readings: Mapping[str, float]
) -> dict[str, Any]:
    """What every round records: the action, its cost, the reward read and the oracle's value."""
    return {
        "intervention": dict(intervention),
        "cost": env.cost(intervention),
        "reward": readings[env.reward_node],
        "expected_reward": env.expected_reward(intervention),
    }


def violations(
    spec: ExperimentSpec,
    constraints: Constraints,
    intervention: Mapping[str, float],
    cost: float,
    spent: float,
) -> list[str]:
    """Constraints a played round broke (the benchmark checks policies, it does not trust them):
    cardinality, per-round cap, total budget and, for hard interventions, the target set."""
    if spec.parameters is not None:  # the limit counts θ's blocks changed from its default
        used = len(spec.parameters.changed_units(intervention))
    elif spec.intervention == "hard":
        used = len(intervention)
    else:
        used = sum(v != 0 for v in intervention.values())
    allowed = [set(s) for s in spec.allowed_target_sets()]
    problems = []
    limits = spec.constraints
    if limits.max_interventions is not None and used > limits.max_interventions:
        problems.append(f"cardinality {used} > {limits.max_interventions}")
    if cost > constraints.round_cap * (1 + 1e-9) + 1e-12:
        problems.append(f"cost {cost:g} > round cap {constraints.round_cap:g}")
    if limits.budget_total is not None and spent > limits.budget_total * (1 + 1e-9):
        problems.append(f"spent {spent:g} > total budget {limits.budget_total:g}")
    if spec.intervention == "hard" and set(intervention) not in allowed:
        problems.append(f"target set {sorted(intervention)} not allowed")
    return problems


def curves(history: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Per-round curves over the policy rounds t = 1..T (initial design excluded), each (T,):

    average_reward[t]    = (1/t) Σ_{s≤t} E[y | a_s]
    best_reward[t]       = max_{s≤t} E[y | a_s]
    cumulative_regret[t] = Σ_{s≤t} (f* − E[y | a_s])
    """
    values = np.array([r["expected_reward"] for r in history], dtype=np.float64)
    regrets = np.array([r["regret"] for r in history], dtype=np.float64)
    return {
        "average_reward": np.cumsum(values) / np.arange(1, len(values) + 1),
        "best_reward": np.maximum.accumulate(values),
        "cumulative_regret": np.cumsum(regrets),
    }


def final_metrics(history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The curves' last values and the mean per-round wall time of propose and learn."""
    last = {name: float(curve[-1]) for name, curve in curves(history).items()}
    decision = float(np.mean([r["decision_seconds"] for r in history]))
    update = float(np.mean([r["update_seconds"] for r in history]))
    return {
        "rounds_completed": len(history),
        **last,
        "seconds_per_round": decision + update,
        "decision_seconds": decision,
        "update_seconds": update,
    }
