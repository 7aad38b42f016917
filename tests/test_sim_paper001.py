"""Paper 001's domains: the maps match the digest (the authors' maps), Mountain Car steps as
gymnasium's, and the vectorized Q-learning solves an open grid."""

from __future__ import annotations

import numpy as np
from gymnasium.envs.classic_control.mountain_car import MountainCarEnv

from sim._gridworld import GridLayout, GridTask, shortest_path
from sim._subgoal_learning import evaluate, train
from sim.gw10 import GW10
from sim.gw20 import GW20
from sim.key2 import KEY2
from sim.mc import MountainCarTask
from sim.tr import TR


def _layouts(domain, draws: int = 400) -> list[GridLayout]:
    rng = np.random.default_rng(0)
    return [domain.layout(rng) for _ in range(draws)]


def test_gw10_has_a_wall_in_a_middle_row_with_a_four_cell_door() -> None:
    layouts = _layouts(GW10.create())
    rows = {int(np.argwhere(x.walls)[0, 0]) for x in layouts}
    assert rows == {2, 3, 4, 5, 6}
    for x in layouts[:20]:
        (row,) = {int(r) for r in np.argwhere(x.walls)[:, 0]}
        assert x.walls[row, :6].all() and not x.walls[row, 6:].any()
        assert {tuple(c) for c in np.argwhere(x.goal)} == {(8, 0), (9, 0), (9, 1)}
        assert 0.0 <= x.wind <= 0.02
        assert shortest_path(x, keyed=False) == 20  # 6 right to the door, 8 up, 6 back


def test_gw20_draws_the_eighteen_three_room_maps() -> None:
    layouts = _layouts(GW20.create(), 800)
    seen = set()
    for x in layouts:
        rows = sorted({int(r) for r in np.argwhere(x.walls)[:, 0]})
        first, second = rows
        door1 = tuple(np.flatnonzero(~x.walls[first])[[0, -1]])
        door2 = tuple(np.flatnonzero(~x.walls[second])[[0, -1]])
        assert door2 == (8, 15) and door1 in {(12, 19), (8, 15)}
        seen.add((first, door1, second))
    assert len(seen) == 18
    assert {f for f, _, _ in seen} == {5, 7, 9} and {s for _, _, s in seen} == {12, 14, 16}


def test_tr_walls_treasure_and_goal() -> None:
    for x in _layouts(TR.create(), 200):
        walls = {tuple(c) for c in np.argwhere(x.walls)}
        expected = {(2, 4), (3, 4), *((4, c) for c in range(4, 8)), *((7, c) for c in range(7))}
        assert walls == expected
        (treasure,) = [tuple(c) for c in np.argwhere(x.treasure)]
        assert treasure[0] in {0, 1, 2} and treasure[1] in {7, 8, 9}
        assert {tuple(c) for c in np.argwhere(x.goal)} == {(8, 9), (9, 8), (9, 9)}


def test_key_doors_open_only_with_a_key_near_a_side_wall() -> None:
    sides = set()
    for x in _layouts(KEY2.create(), 100):
        assert x.walls[4, :6].all() and x.doors[4, 6:].all() and x.wind == 0.0
        keys = {tuple(c) for c in np.argwhere(x.key)}
        assert keys in ({(2, 8), (2, 9), (3, 8), (3, 9)}, {(2, 0), (2, 1), (3, 0), (3, 1)})
        sides.add(min(c for _, c in keys))
        right = min(c for _, c in keys) == 8
        assert shortest_path(x, keyed=True) == (24 if right else 20)  # the key, then the door
    assert sides == {0, 8}


def test_mountain_car_steps_as_gymnasiums() -> None:
    rng = np.random.default_rng(1)
    starts = rng.uniform(-0.6, -0.4, size=6)
    task = MountainCarTask(starts, np.zeros(0))
    reference = MountainCarEnv()
    for _ in range(150):
        actions = rng.integers(3, size=6)
        before = np.stack([task.x, task.v], 1)
        _, terminal, _ = task.step(actions, rng)
        for i in range(6):
            reference.state = before[i].copy()
            state, _, done, _, _ = reference.step(int(actions[i]))
            assert np.allclose([task.x[i], task.v[i]], state, atol=1e-6)
            assert done == terminal[i]


def test_q_learning_solves_an_open_grid() -> None:
    shape = (6, 6)
    empty = np.zeros(shape, dtype=bool)
    goal = empty.copy()
    goal[5, 5] = True
    layout = GridLayout(empty, empty, empty, empty, goal, 0.0)
    task = GridTask([layout] * 8, np.zeros((0, 2)), gamma=0.95, episode_cap=100)
    rng = np.random.default_rng(0)
    episode = evaluate(task, train(task, 6000, rng), rng)
    assert episode.reached.all()
    assert (episode.steps == 10).all()  # the shortest path
