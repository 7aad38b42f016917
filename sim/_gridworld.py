"""Gridworlds of paper 001 (GW10, GW20, TR, KEY2, KEY3) as a batch of R environments.

Cells are (row, col), row 0 the start row (the paper's figures draw it at the bottom). The
four compass moves; a move into the border, a wall or a closed door leaves the agent where it
is (the paper: "the agent will stay in the current location when it hits the wall"); with the
environment's wind probability p the move goes in a random direction instead. A subgoal θ_k =
(row, col) counts as reached on entering the cell nearest to it (the authors' code); its
shaping potential is a bump around θ_k itself (`sim._subgoal_learning`). Items (a key, a
treasure) add one bit to the state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim._subgoal_learning import SubgoalTask, bump

__all__ = ["GridLayout", "GridTask", "shortest_path"]

MOVES = np.array([[1, 0], [-1, 0], [0, 1], [0, -1]])  # up, down, right, left


@dataclass(frozen=True)
class GridLayout:
    """One environment ξ of a gridworld: (H, W) boolean maps and its wind.

    Attributes:
        walls: cells never entered.
        doors: cells entered only while holding the item (the key).
        key: cells that give the item (the key).
        treasure: cells that give the item and `treasure_reward`, once.
        goal: terminal cells that pay `goal_reward`.
        wind: probability that a move goes in a random direction.
    """

    walls: np.ndarray
    doors: np.ndarray
    key: np.ndarray
    treasure: np.ndarray
    goal: np.ndarray
    wind: float = 0.0


class GridTask(SubgoalTask):
    """R gridworld environments (one layout each) learning together."""

    actions = 4

    def __init__(
        self,
        layouts: list[GridLayout],
        centres: np.ndarray,
        *,
        gamma: float,
        episode_cap: int,
        goal_reward: float = 1.0,
        treasure_reward: float = 0.0,
        start: tuple[int, int] = (0, 0),
    ) -> None:
        self.replications = len(layouts)
        self.height, self.width = layouts[0].walls.shape
        self.walls = np.stack([x.walls for x in layouts])
        self.doors = np.stack([x.doors for x in layouts])
        self.key = np.stack([x.key for x in layouts])
        self.treasure = np.stack([x.treasure for x in layouts])
        self.goal = np.stack([x.goal for x in layouts])
        self.wind = np.array([x.wind for x in layouts])
        self.items = 2 if (self.key.any() or self.treasure.any()) else 1
        self.states = self.height * self.width * self.items
        self.centres = np.asarray(centres, dtype=np.float64).reshape(-1, 2)  # (K, 2)
        self.subgoals = self.centres.shape[0]
        cells = np.rint(self.centres).astype(np.int64)
        self.cells = np.clip(cells, 0, [self.height - 1, self.width - 1])
        self.gamma, self.episode_cap = gamma, episode_cap
        self.goal_reward, self.treasure_reward = goal_reward, treasure_reward
        self.start = np.array(start)
        self.position = np.tile(self.start, (self.replications, 1))
        self.item = np.zeros(self.replications, dtype=np.int64)
        self._rows = np.arange(self.replications)

    def reset(self, rows: np.ndarray) -> None:
        self.position[rows] = self.start
        self.item[rows] = 0

    def state(self) -> np.ndarray:
        row, col = self.position[:, 0], self.position[:, 1]
        return (row * self.width + col) * self.items + self.item

    def step(
        self, actions: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        gust = rng.random(self.replications) < self.wind
        actions = np.where(gust, rng.integers(4, size=self.replications), actions)
        target = self.position + MOVES[actions]
        row, col = target[:, 0], target[:, 1]
        inside = (row >= 0) & (row < self.height) & (col >= 0) & (col < self.width)
        row_c, col_c = np.clip(row, 0, self.height - 1), np.clip(col, 0, self.width - 1)
        r = self._rows
        blocked = self.walls[r, row_c, col_c] | (self.doors[r, row_c, col_c] & (self.item == 0))
        move = inside & ~blocked
        self.position = np.where(move[:, None], np.stack([row_c, col_c], 1), self.position)
        row, col = self.position[:, 0], self.position[:, 1]
        reward = np.zeros(self.replications)
        found = self.treasure[r, row, col] & (self.item == 0)
        reward += np.where(found, self.treasure_reward, 0.0)
        picked = self.key[r, row, col] | found
        self.item = np.where(picked, 1, self.item)
        terminal = self.goal[r, row, col]
        reward += np.where(terminal, self.goal_reward, 0.0)
        reached = (self.position[:, None, :] == self.cells[None]).all(-1)  # (R, K)
        return reward, terminal, reached

    def potential(self, subgoal: np.ndarray) -> np.ndarray:
        if not self.subgoals:
            return np.zeros(self.replications)
        distance = ((self.position - self.centres[subgoal]) ** 2).sum(-1)
        return bump(distance)


def shortest_path(layout: GridLayout, start: tuple[int, int] = (0, 0), *, keyed: bool) -> int:
    """Moves from `start` to the nearest goal cell without wind (through the key first when
    the doors need it); the optimum a learner can reach."""
    height, width = layout.walls.shape

    def bfs(sources: list[tuple[int, int]], item: bool) -> np.ndarray:
        distance = np.full((height, width), np.iinfo(np.int64).max)
        frontier = list(sources)
        for cell in frontier:
            distance[cell] = 0
        while frontier:
            nxt = []
            for row, col in frontier:
                for d_row, d_col in MOVES:
                    r, c = row + d_row, col + d_col
                    if not (0 <= r < height and 0 <= c < width) or layout.walls[r, c]:
                        continue
                    if layout.doors[r, c] and not item:
                        continue
                    if distance[r, c] > distance[row, col] + 1:
                        distance[r, c] = distance[row, col] + 1
                        nxt.append((r, c))
            frontier = nxt
        return distance

    if not keyed:
        return int(bfs([start], False)[layout.goal].min())
    to_key = bfs([start], False)
    keys = [tuple(k) for k in np.argwhere(layout.key)]
    best = min(int(to_key[k]) + int(bfs([k], True)[layout.goal].min()) for k in keys)
    return best
