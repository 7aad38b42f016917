"""What the gridworld domains of paper 001 share: θ = K cells (row, col), a layout per
environment, the task, and the shortest path as the reference."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import numpy as np

from sim._gridworld import GridLayout, GridTask, shortest_path
from sim._subgoal_env import SubgoalDomain

__all__ = ["GridDomain", "cells"]


def cells(shape: tuple[int, int], *points: tuple[int, int]) -> np.ndarray:
    """A boolean map of `shape` true at `points`."""
    grid = np.zeros(shape, dtype=bool)
    for point in points:
        grid[point] = True
    return grid


@dataclass(eq=False)
class GridDomain(SubgoalDomain):
    """A gridworld domain; subclasses draw layouts and set the constants."""

    size: int = 10
    gamma: float = 1.0
    episode_cap: int = 500
    goal_reward: float = 1.0
    treasure_reward: float = 0.0
    keyed: bool = False

    @abstractmethod
    def layout(self, rng: np.random.Generator) -> GridLayout:
        """One environment ξ ~ Ξ."""

    def theta_names(self) -> list[str]:
        return [f"g{k}_{axis}" for k in range(1, self.subgoal_count + 1) for axis in ("row", "col")]

    def theta_bounds(self) -> list[tuple[float, float]]:
        return [(0.0, float(self.size - 1))] * (2 * self.subgoal_count)

    def task(
        self, theta: np.ndarray | None, replications: int, rng: np.random.Generator
    ) -> GridTask:
        layouts = [self.layout(rng) for _ in range(replications)]
        centres = np.zeros((0, 2)) if theta is None else np.asarray(theta).reshape(-1, 2)
        task = GridTask(
            layouts,
            centres,
            gamma=self.gamma,
            episode_cap=self.episode_cap,
            goal_reward=self.goal_reward,
            treasure_reward=self.treasure_reward,
        )
        task.layouts = layouts
        return task

    def best_steps(self, task: GridTask) -> np.ndarray:
        return np.array([shortest_path(x, keyed=self.keyed) for x in task.layouts], dtype=float)
