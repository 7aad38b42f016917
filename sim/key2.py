"""KEY2 (paper 001, Sec. 5.2): a 10 × 10 gridworld whose door opens only with a key.

The wall in row 4 spans columns 0–5; its door, the cells at columns 6–9, lets the agent
through only while it holds the key. The key is a 2 × 2 block at rows 2–3, either columns 8–9
(near the right wall) or 0–1 (the left), each with probability ½, on the start's side. Start
(0, 0), goal (8, 0), (9, 0), (9, 1), reward 1, γ = 0.999 (the authors' code), no wind. K = 2
subgoals, 𝒯 = {400, 700, 1000}, 𝒬 = {5, 20}, episodes capped at 500 steps. KEY3 (`sim.key3`)
is the same with three subgoals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim._grid_domain import GridDomain, cells
from sim._gridworld import GridLayout
from sim._subgoal_env import SubgoalDomain

__all__ = ["KEY2", "key_layout"]

GOAL = ((8, 0), (9, 0), (9, 1))


def key_layout(right: bool) -> GridLayout:
    shape = (10, 10)
    walls = np.zeros(shape, dtype=bool)
    walls[4, 0:6] = True
    doors = np.zeros(shape, dtype=bool)
    doors[4, 6:10] = True
    key = np.zeros(shape, dtype=bool)
    columns = slice(8, 10) if right else slice(0, 2)
    key[2:4, columns] = True
    empty = np.zeros(shape, dtype=bool)
    return GridLayout(walls, doors, key, empty, cells(shape, *GOAL), 0.0)


@dataclass(eq=False)
class KEY2(GridDomain):
    def layout(self, rng: np.random.Generator) -> GridLayout:
        return key_layout(bool(rng.integers(2)))

    @classmethod
    def create(cls, seed: int = 0, subgoals: int = 2, name: str = "key2") -> KEY2:
        levels, reps = (400.0, 700.0, 1000.0), (5, 20)
        names = [f"g{k}_{a}" for k in range(1, subgoals + 1) for a in ("row", "col")]
        bounds = [(0.0, 9.0)] * len(names)
        return cls(
            name=name,
            description=f"{name.upper()} of paper 001: key and door, {subgoals} subgoals",
            **SubgoalDomain.structure(names, bounds, levels, reps, (-6.3, 0.0)),
            levels=levels,
            replication_set=reps,
            subgoal_count=subgoals,
            table1_interval=500,
            seed=seed,
            size=10,
            gamma=0.999,
            episode_cap=500,
            keyed=True,
        )
