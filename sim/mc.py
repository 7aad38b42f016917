"""MC (paper 001, Sec. 5.2): Mountain Car with two subgoals on the position.

The dynamics are gymnasium's `MountainCarEnv` (its constants read from it, its step
vectorized over replications: v ← clip(v + (a − 1)·force − cos(3x)·gravity, ±max_speed),
x ← clip(x + v), v = 0 at the left wall, the goal x ≥ 0.5), reward −1 a step. Ξ draws the
start position x0 ~ U[−0.6, −0.4] per environment (the paper). A subgoal c counts as reached
when a move crosses it (the authors' code); θ = (c1, c2) ∈ [−1.2, 0.6]². 𝒯 = {4000, 7000,
10000}, 𝒬 = {10, 50}, episodes capped at 200 steps, γ = 1.

The learner is tabular Q-learning like the gridworlds', over a 20 × 20 grid of (x, v) — the
paper names no function approximator (the authors' code uses Q(λ) on radial basis features).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gymnasium.envs.classic_control.mountain_car import MountainCarEnv

from sim._subgoal_env import SubgoalDomain
from sim._subgoal_learning import SubgoalTask, bump

__all__ = ["MC", "MountainCarTask"]

BINS = 20
_CONSTANTS = MountainCarEnv()  # the constants only; it is never stepped here


class MountainCarTask(SubgoalTask):
    """R Mountain Cars, each with its own start position."""

    actions = 3
    gamma = 1.0
    episode_cap = 200
    states = BINS * BINS

    def __init__(self, starts: np.ndarray, centres: np.ndarray) -> None:
        env = _CONSTANTS
        self.low, self.high = env.min_position, env.max_position
        self.max_speed, self.goal = env.max_speed, env.goal_position
        self.force, self.gravity = env.force, env.gravity
        self.replications = len(starts)
        self.starts = np.asarray(starts, dtype=np.float64)
        self.centres = np.asarray(centres, dtype=np.float64).reshape(-1)
        self.subgoals = self.centres.size
        self.x = self.starts.copy()
        self.v = np.zeros(self.replications)

    def reset(self, rows: np.ndarray) -> None:
        self.x[rows] = self.starts[rows]
        self.v[rows] = 0.0

    def state(self) -> np.ndarray:
        x_bin = ((self.x - self.low) / (self.high - self.low) * BINS).astype(np.int64)
        v_bin = ((self.v + self.max_speed) / (2 * self.max_speed) * BINS).astype(np.int64)
        return np.clip(x_bin, 0, BINS - 1) * BINS + np.clip(v_bin, 0, BINS - 1)

    def step(
        self, actions: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        before = self.x.copy()
        v = self.v + (actions - 1) * self.force - np.cos(3 * self.x) * self.gravity
        v = np.clip(v, -self.max_speed, self.max_speed)
        x = np.clip(self.x + v, self.low, self.high)
        v = np.where((x == self.low) & (v < 0), 0.0, v)
        self.x, self.v = x, v
        terminal = x >= self.goal
        low, high = np.minimum(before, x), np.maximum(before, x)
        reached = (low[:, None] <= self.centres[None]) & (self.centres[None] <= high[:, None])
        return np.full(self.replications, -1.0), terminal, reached

    def potential(self, subgoal: np.ndarray) -> np.ndarray:
        if not self.subgoals:
            return np.zeros(self.replications)
        return bump((self.x - self.centres[subgoal]) ** 2)


@dataclass(eq=False)
class MC(SubgoalDomain):
    def theta_names(self) -> list[str]:
        return ["g1_x", "g2_x"]

    def theta_bounds(self) -> list[tuple[float, float]]:
        return [(-1.2, 0.6)] * 2

    def task(
        self, theta: np.ndarray | None, replications: int, rng: np.random.Generator
    ) -> MountainCarTask:
        starts = rng.uniform(-0.6, -0.4, size=replications)
        return MountainCarTask(starts, np.zeros(0) if theta is None else np.asarray(theta))

    def score_of(self, episode):  # the steps' score; reward −1 a step is the same ordering
        return -np.log(episode.steps.astype(np.float64))

    def best_steps(self, task: MountainCarTask) -> np.ndarray:
        """Steps of the energy-pumping controller (push along the velocity), a near-optimal
        reference: Mountain Car has no closed-form optimum."""
        task.reset(np.arange(task.replications))
        steps = np.full(task.replications, task.episode_cap)
        running = np.ones(task.replications, dtype=bool)
        rng = np.random.default_rng(0)
        for t in range(task.episode_cap):
            push = np.where(task.v >= 0, 2, 0)
            _, terminal, _ = task.step(push, rng)
            steps[running & terminal] = t + 1
            running &= ~terminal
        return steps.astype(float)

    @classmethod
    def create(cls, seed: int = 0) -> MC:
        levels, reps = (4000.0, 7000.0, 10000.0), (10, 50)
        names = ["g1_x", "g2_x"]
        return cls(
            name="mc",
            description="MC of paper 001: Mountain Car (gymnasium's dynamics), 2 subgoals",
            **SubgoalDomain.structure(names, [(-1.2, 0.6)] * 2, levels, reps, (-5.3, -4.0)),
            levels=levels,
            replication_set=reps,
            subgoal_count=2,
            table1_interval=1000,
            seed=seed,
        )
