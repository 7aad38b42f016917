"""GW10 (paper 001, Sec. 5.2): a windy 10 × 10 gridworld split by a wall.

The wall lies in one of the middle five rows (2–6, drawn per environment), across columns
0–5; its door is the gap at columns 6–9. Start (0, 0), goal the upper-left cells (8, 0),
(9, 0), (9, 1), reward 1. Wind p ~ U(0, 0.02) per environment. K = 2 subgoals, 𝒯 = {200, 600,
1000}, 𝒬 = {5, 20}, episodes capped at 500 steps, γ = 1 (the maps of the authors' code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim._grid_domain import GridDomain, cells
from sim._gridworld import GridLayout
from sim._subgoal_env import SubgoalDomain

__all__ = ["GW10", "gw10_layout"]

GOAL = ((8, 0), (9, 0), (9, 1))


def gw10_layout(wall_row: int, wind: float) -> GridLayout:
    shape = (10, 10)
    walls = np.zeros(shape, dtype=bool)
    walls[wall_row, 0:6] = True
    empty = np.zeros(shape, dtype=bool)
    return GridLayout(walls, empty, empty, empty, cells(shape, *GOAL), wind)


@dataclass(eq=False)
class GW10(GridDomain):
    def layout(self, rng: np.random.Generator) -> GridLayout:
        return gw10_layout(int(rng.integers(2, 7)), float(rng.uniform(0.0, 0.02)))

    @classmethod
    def create(cls, seed: int = 0) -> GW10:
        levels, reps = (200.0, 600.0, 1000.0), (5, 20)
        names = [f"g{k}_{a}" for k in (1, 2) for a in ("row", "col")]
        return cls(
            name="gw10",
            description="GW10 of paper 001: windy two-room gridworld, 2 subgoals",
            **SubgoalDomain.structure(names, [(0.0, 9.0)] * 4, levels, reps, (-6.3, 0.0)),
            levels=levels,
            replication_set=reps,
            subgoal_count=2,
            table1_interval=100,
            seed=seed,
            size=10,
            episode_cap=500,
        )
