"""TR (paper 001, Sec. 5.2): a 10 × 10 gridworld with a treasure hidden in a small room.

Walls at (2, 4), (3, 4), row 4 columns 4–7 and row 7 columns 0–6; the room is rows 0–3,
columns 5–9. The treasure lies at one cell of rows 0–2 × columns 7–9 (drawn per environment),
pays 10 once; the goal cells (8, 9), (9, 8), (9, 9) pay 10; γ = 0.98; the return counts 0 when
the goal is not reached (the paper). No wind. K = 2, 𝒯 = {400, 1200, 2000}, 𝒬 = {5, 20},
episodes capped at 500 steps. The score is the discounted return (higher is better).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim._grid_domain import GridDomain, cells
from sim._gridworld import GridLayout, GridTask, shortest_path
from sim._subgoal_env import SubgoalDomain

__all__ = ["TR", "tr_layout"]

GOAL = ((8, 9), (9, 8), (9, 9))
GAMMA = 0.98


def tr_layout(treasure: tuple[int, int]) -> GridLayout:
    shape = (10, 10)
    walls = cells(shape, (2, 4), (3, 4))
    walls[4, 4:8] = True
    walls[7, 0:7] = True
    empty = np.zeros(shape, dtype=bool)
    return GridLayout(walls, empty, empty, cells(shape, treasure), cells(shape, *GOAL), 0.0)


@dataclass(eq=False)
class TR(GridDomain):
    def layout(self, rng: np.random.Generator) -> GridLayout:
        return tr_layout((int(rng.integers(0, 3)), int(rng.integers(7, 10))))

    def best_steps(self, task: GridTask) -> np.ndarray:
        """The best discounted return: the treasure on the way, or straight to the goal."""
        best = []
        for layout in task.layouts:
            direct = shortest_path(layout, keyed=False)
            keyed = GridLayout(
                layout.walls, layout.doors, layout.treasure, layout.treasure, layout.goal
            )
            through = shortest_path(keyed, keyed=True)
            to_treasure = int(np.abs(np.argwhere(layout.treasure)[0]).sum())  # open room
            via = 10 * GAMMA ** (to_treasure - 1) + 10 * GAMMA ** (through - 1)
            best.append(max(10 * GAMMA ** (direct - 1), via))
        return np.array(best)

    @classmethod
    def create(cls, seed: int = 0) -> TR:
        levels, reps = (400.0, 1200.0, 2000.0), (5, 20)
        names = [f"g{k}_{a}" for k in (1, 2) for a in ("row", "col")]
        return cls(
            name="tr",
            description="TR of paper 001: a treasure in a small room, 2 subgoals",
            **SubgoalDomain.structure(names, [(0.0, 9.0)] * 4, levels, reps, (0.0, 20.0)),
            levels=levels,
            replication_set=reps,
            subgoal_count=2,
            step_metric=False,
            table1_interval=200,
            seed=seed,
            size=10,
            gamma=GAMMA,
            episode_cap=500,
            goal_reward=10.0,
            treasure_reward=10.0,
        )
