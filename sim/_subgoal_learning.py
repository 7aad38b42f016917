"""Subgoal-based exploration (paper 001, Sec. 2): tabular Q-learning on the subgoal-augmented
MDP, vectorized over replications, and the greedy policy's evaluation on extrinsic reward.

A *task* (a gridworld, Mountain Car) gives, batched over R replications — each its own
environment ξ drawn from Ξ — the discrete states, the start, the dynamics, the extrinsic
reward and where each subgoal counts as reached. This module adds what the paper adds:

- the augmented state (s, i), i ∈ {0..K} the subgoals reached so far, i' = i + 1{s' ∈ 𝒢_{i+1}}
  (only the next subgoal counts: the order matters);
- potential-based shaping while i < K, g(s, s') = γ Φ_{i+1}(s') − Φ_{i+1}(s) with
  Φ_k(s) = w1 · exp(−½ ‖s − c_k‖² / w2), w1 = 0.2, w2 = 10 (Sec. 5), none once i = K;
- Q-learning with an ε-greedy behaviour policy (ε = 0.2) for exactly τ interactions per
  replication, a new episode started whenever one ends (goal or the episode cap); the step size
  decays per episode as the authors' code has it, α = 0.11 · N0 / (N0 + episodes^1.1), N0 = 100;
  Q starts at 0, ties broken at random;
- evaluation: one greedy episode (ε = 0) per replication on the same augmented dynamics,
  scored with the extrinsic reward only: the steps it took (the cap when it never arrived) and
  its discounted return.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

__all__ = ["Episode", "SubgoalTask", "bump", "evaluate", "train"]

EPSILON = 0.2
SHAPING_HEIGHT = 0.2  # w1
SHAPING_WIDTH = 10.0  # w2
_LR0, _LR_N0 = 0.11, 100.0


@dataclass
class Episode:
    """The greedy evaluation of R learners: steps (R,) and discounted extrinsic return (R,)."""

    steps: np.ndarray
    discounted_return: np.ndarray
    reached: np.ndarray  # (R,) bool: the goal was reached within the cap


class SubgoalTask(ABC):
    """R environments of one domain, stepped together.

    Attributes:
        replications: R.
        states: number of base states (the table's rows before the augmentation).
        actions: number of actions.
        gamma: the discount.
        episode_cap: steps after which an episode is cut off.
        subgoals: K.
    """

    replications: int
    states: int
    actions: int
    gamma: float
    episode_cap: int
    subgoals: int

    @abstractmethod
    def reset(self, rows: np.ndarray) -> None:
        """Start a new episode in the replications `rows` (an index array)."""

    @abstractmethod
    def state(self) -> np.ndarray:
        """(R,) the current base state of each replication."""

    @abstractmethod
    def step(
        self, actions: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Move every replication; returns extrinsic reward (R,), terminal (R,) bool and,
        per subgoal k, whether the move reached it, (R, K) bool."""

    @abstractmethod
    def potential(self, subgoal: np.ndarray) -> np.ndarray:
        """(R,) Φ_{subgoal}(current position) per replication; subgoal (R,) in 0..K−1."""

    def shaping(self, subgoal: np.ndarray) -> np.ndarray:
        """Φ of the active subgoal, 0 once all are reached."""
        done = subgoal >= self.subgoals
        value = self.potential(np.minimum(subgoal, max(self.subgoals - 1, 0)))
        return np.where(done, 0.0, value) if self.subgoals else np.zeros_like(value)


def bump(squared_distance: np.ndarray) -> np.ndarray:
    """Φ = w1 · exp(−½ d² / w2) of a squared distance to the subgoal's centre."""
    return SHAPING_HEIGHT * np.exp(-0.5 * squared_distance / SHAPING_WIDTH)


def _greedy(q_rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """argmax per row with ties broken at random: q_rows (R, A) -> (R,)."""
    noise = rng.random(q_rows.shape) * 1e-9
    return np.argmax(q_rows + noise, axis=1)


def train(task: SubgoalTask, interactions: int, rng: np.random.Generator) -> np.ndarray:
    """Q-learning for exactly `interactions` steps in each replication; the Q table
    (R, states · (K + 1), actions)."""
    r, k1 = task.replications, task.subgoals + 1
    q = np.zeros((r, task.states * k1, task.actions))
    rows = np.arange(r)
    task.reset(rows)
    subgoal = np.zeros(r, dtype=np.int64)
    episodes = np.zeros(r)
    length = np.zeros(r, dtype=np.int64)
    for _ in range(interactions):
        s = task.state() * k1 + subgoal
        explore = rng.random(r) < EPSILON
        chosen = np.where(explore, rng.integers(task.actions, size=r), _greedy(q[rows, s], rng))
        before = task.shaping(subgoal)
        reward, terminal, reached = task.step(chosen, rng)
        active = np.minimum(subgoal, max(task.subgoals - 1, 0))
        advance = (subgoal < task.subgoals) & reached[rows, active] if task.subgoals else False
        after = np.where(subgoal < task.subgoals, task.potential(active), 0.0)
        shaped = reward + np.where(subgoal < task.subgoals, task.gamma * after - before, 0.0)
        subgoal = subgoal + advance
        s_next = task.state() * k1 + subgoal
        future = np.where(terminal, 0.0, q[rows, s_next].max(axis=1))
        rate = _LR0 * _LR_N0 / (_LR_N0 + episodes**1.1)
        q[rows, s, chosen] += rate * (shaped + task.gamma * future - q[rows, s, chosen])
        length += 1
        over = terminal | (length >= task.episode_cap)
        if over.any():
            ended = rows[over]
            task.reset(ended)
            subgoal[ended] = 0
            length[ended] = 0
            episodes[ended] += 1
    return q


def evaluate(task: SubgoalTask, q: np.ndarray, rng: np.random.Generator) -> Episode:
    """One greedy episode per replication, extrinsic reward only (shaping off)."""
    r, k1 = task.replications, task.subgoals + 1
    rows = np.arange(r)
    task.reset(rows)
    subgoal = np.zeros(r, dtype=np.int64)
    running = np.ones(r, dtype=bool)
    steps = np.full(r, task.episode_cap, dtype=np.int64)
    ret = np.zeros(r)
    reached_goal = np.zeros(r, dtype=bool)
    for t in range(task.episode_cap):
        s = task.state() * k1 + subgoal
        chosen = _greedy(q[rows, s], rng)
        reward, terminal, reached = task.step(chosen, rng)
        active = np.minimum(subgoal, max(task.subgoals - 1, 0))
        if task.subgoals:
            subgoal = subgoal + ((subgoal < task.subgoals) & reached[rows, active])
        ret += np.where(running, task.gamma**t * reward, 0.0)
        finished = running & terminal
        steps[finished] = t + 1
        reached_goal |= finished
        running &= ~terminal
        if not running.any():
            break
    return Episode(steps, ret, reached_goal)
