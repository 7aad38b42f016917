"""GW20 (paper 001, Sec. 5.2): a windy 20 × 20 gridworld of three rooms.

Wall 1 in row 5, 7 or 9 with its door (8 cells) at columns 12–19 or 8–15; wall 2 in row 12,
14 or 16 with its door at columns 8–15 (the 18 maps of the authors' code). Start (0, 0), goal
the upper-right cells (18, 19), (19, 18), (19, 19), reward 1. Wind "the same as GW10" (the
paper), p ~ U(0, 0.02). K = 2, 𝒯 = {4000, 7000, 10000}, q = 20 fixed, episodes capped at
1000 steps, γ = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim._grid_domain import GridDomain, cells
from sim._gridworld import GridLayout
from sim._subgoal_env import SubgoalDomain

__all__ = ["GW20", "gw20_layout"]

GOAL = ((18, 19), (19, 18), (19, 19))
FIRST_ROWS, FIRST_DOORS = (5, 7, 9), ((12, 20), (8, 16))
SECOND_ROWS, SECOND_DOOR = (12, 14, 16), (8, 16)


def gw20_layout(first: int, first_door: tuple[int, int], second: int, wind: float) -> GridLayout:
    shape = (20, 20)
    walls = np.zeros(shape, dtype=bool)
    walls[first] = True
    walls[first, first_door[0] : first_door[1]] = False
    walls[second] = True
    walls[second, SECOND_DOOR[0] : SECOND_DOOR[1]] = False
    empty = np.zeros(shape, dtype=bool)
    return GridLayout(walls, empty, empty, empty, cells(shape, *GOAL), wind)


@dataclass(eq=False)
class GW20(GridDomain):
    def layout(self, rng: np.random.Generator) -> GridLayout:
        first = FIRST_ROWS[int(rng.integers(3))]
        door = FIRST_DOORS[int(rng.integers(2))]
        second = SECOND_ROWS[int(rng.integers(3))]
        return gw20_layout(first, door, second, float(rng.uniform(0.0, 0.02)))

    @classmethod
    def create(cls, seed: int = 0) -> GW20:
        levels, reps = (4000.0, 7000.0, 10000.0), (20,)
        names = [f"g{k}_{a}" for k in (1, 2) for a in ("row", "col")]
        return cls(
            name="gw20",
            description="GW20 of paper 001: windy three-room gridworld, 2 subgoals",
            **SubgoalDomain.structure(names, [(0.0, 19.0)] * 4, levels, reps, (-7.0, 0.0)),
            levels=levels,
            replication_set=reps,
            subgoal_count=2,
            table1_interval=1000,
            seed=seed,
            size=20,
            episode_cap=1000,
        )
