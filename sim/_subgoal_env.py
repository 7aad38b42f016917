"""Paper 001's domains as environments of the agent: θ (K subgoals), τ and q in, a score out.

One round is one trial: q replications, each in a fresh environment ξ ~ Ξ (the authors' code
draws one per replication), each training Q-learning with the subgoals θ for exactly τ
interactions and then evaluating the greedy policy on extrinsic reward. The reading `score` is
the mean over the replications, reported with the variance of that mean and q
(`SubgoalDomain.trial`; the device sends both, docs/protocol.md):

- step domains (GW10, GW20, KEY2, KEY3, MC): score = −log(steps to the goal), the cap when
  the greedy episode never arrives (the authors' code models log steps);
- TR: score = the discounted return, 0 when the greedy episode misses the goal (the paper).

`test(θ, interactions, environments)` is the paper's evaluation of a recommendation: fresh
test environments, τ_max interactions (or any T, for Table 1), without subgoals when θ is None
(the QL baseline). The oracle E[score | θ] is that test's Monte-Carlo estimate at τ_max over
`oracle_environments` fixed environments (common random numbers across θ), cached per θ; the
"optimum" is the score of the shortest path in each environment, which no learner exceeds.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch

from sim._subgoal_learning import Episode, SubgoalTask, evaluate, train
from sim.base import ActionInfo, Environment, NodeInfo, Optimum

__all__ = ["SubgoalDomain", "Trial"]

SCORE = "score"
TAU, REPS = "tau", "reps"


@dataclass(frozen=True)
class Trial:
    """One round's result: the mean score, the variance of that mean, q and each replicate's."""

    mean: float
    variance: float
    replications: int
    scores: np.ndarray


@dataclass(eq=False)
class SubgoalDomain(Environment):
    """A domain of paper 001. Subclasses give the task builder and the constants."""

    levels: tuple[float, ...] = ()
    replication_set: tuple[int, ...] = ()
    subgoal_count: int = 2
    step_metric: bool = True  # score = −log(steps); False: the discounted return (TR)
    table1_interval: int = 100  # m of Table 1
    oracle_environments: int = 32
    seed: int = 0
    _oracle_cache: dict[tuple[float, ...], float] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ to implement
    @abstractmethod
    def theta_bounds(self) -> list[tuple[float, float]]:
        """Bounds of θ's coordinates (K subgoals, each 1 or 2 numbers)."""

    @abstractmethod
    def theta_names(self) -> list[str]:
        """Names of θ's coordinates, the actions."""

    @abstractmethod
    def task(
        self, theta: np.ndarray | None, replications: int, rng: np.random.Generator
    ) -> SubgoalTask:
        """R fresh environments with the subgoals θ (None: no subgoals)."""

    @abstractmethod
    def best_steps(self, task: SubgoalTask) -> np.ndarray:
        """(R,) a reference per environment: the fewest steps (step domains) or the highest
        discounted return (TR) any policy gets."""

    # ------------------------------------------------------------------ structure
    @classmethod
    def structure(
        cls, names: list[str], bounds: list[tuple[float, float]], levels, replications, score
    ) -> dict:
        actions = [ActionInfo(n, (SCORE,), b, cost=0.0) for n, b in zip(names, bounds, strict=True)]
        actions.append(ActionInfo(TAU, (SCORE,), (min(levels), max(levels)), cost=0.0))
        # from 1: a fixed count (GW20's q = 20) still needs bounds with room
        actions.append(ActionInfo(REPS, (SCORE,), (1.0, float(max(replications))), cost=0.0))
        return {
            "intervention_type": "soft",
            "nodes": (NodeInfo(SCORE, (), 0.0, score),),
            "actions": tuple(actions),
            "reward_node": SCORE,
        }

    @property
    def tau_max(self) -> float:
        return max(self.levels)

    def _theta(self, values: dict[str, float]) -> np.ndarray:
        return np.array([values.get(n, 0.0) for n in self.theta_names()])

    # ------------------------------------------------------------------ trials
    def score_of(self, episode: Episode) -> np.ndarray:
        """(R,) the score of each greedy episode."""
        if self.step_metric:
            return -np.log(episode.steps.astype(np.float64))
        return np.where(episode.reached, episode.discounted_return, 0.0)

    def trial(self, intervention: dict[str, float], rng: np.random.Generator) -> Trial:
        """q replications of τ interactions at θ; the mean score and its variance."""
        values = self.validate(intervention)
        tau, reps = round(values[TAU]), round(values[REPS])
        task = self.task(self._theta(values), reps, rng)
        q_table = train(task, tau, rng)
        scores = self.score_of(evaluate(task, q_table, rng))
        variance = float(scores.var(ddof=1) / reps) if reps > 1 else 0.0
        return Trial(float(scores.mean()), variance, reps, scores)

    def test(
        self,
        theta: np.ndarray | None,
        interactions: int,
        environments: int,
        rng: np.random.Generator,
    ) -> Episode:
        """The greedy policy learnt in `environments` fresh test environments after
        `interactions` steps, with the subgoals θ (None: plain Q-learning)."""
        task = self.task(theta, environments, rng)
        return evaluate(task, train(task, interactions, rng), rng)

    def step_with_spread(
        self, intervention: dict[str, float], generator: torch.Generator | None = None
    ) -> tuple[dict[str, float], dict[str, tuple[float, int]]]:
        seed = int(torch.randint(2**31 - 1, (1,), generator=generator))
        result = self.trial(intervention, np.random.default_rng(seed))
        return {SCORE: result.mean}, {SCORE: (result.variance, result.replications)}

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        seeds = torch.randint(2**31 - 1, (num,), generator=generator).tolist()
        means = [self.trial(values, np.random.default_rng(s)).mean for s in seeds]
        return {SCORE: torch.tensor(means, dtype=torch.float64)}

    # ------------------------------------------------------------------ oracle
    def expected_reward(self, intervention: dict[str, float]) -> float:
        theta = self._theta(dict(intervention))
        key = tuple(theta.tolist())
        if key not in self._oracle_cache:
            rng = np.random.default_rng(self.seed + 7919)
            episode = self.test(theta, int(self.tau_max), self.oracle_environments, rng)
            self._oracle_cache[key] = float(self.score_of(episode).mean())
        return self._oracle_cache[key]

    def _compute_optimum(self) -> Optimum:
        rng = np.random.default_rng(self.seed + 7919)
        task = self.task(None, self.oracle_environments, rng)
        best = self.best_steps(task)
        value = float(np.mean(-np.log(best))) if self.step_metric else float(np.mean(best))
        return Optimum({}, value)

    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """2.5 × dim θ Latin-hypercube θ at every level with q_max (the authors' code)."""
        rng = np.random.default_rng(seed)
        names, bounds = self.theta_names(), np.array(self.theta_bounds())
        count = math.ceil(2.5 * len(names))
        slices = np.stack([rng.permutation(count) for _ in names], axis=1)
        unit = (slices + rng.random((count, len(names)))) / count  # a Latin hypercube
        thetas = bounds[:, 0] + unit * (bounds[:, 1] - bounds[:, 0])
        design = []
        for theta in thetas:
            for tau in self.levels:
                point = dict(zip(names, theta.tolist(), strict=True))
                point[TAU], point[REPS] = float(tau), float(max(self.replication_set))
                design.append(point)
        return design
