"""Paper 000's environments step through their real packages: mpe2's simple_tag, and the
additive functions on an Erdős–Rényi graph whose structure is known."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from core.spec import load_spec
from sim.additive_er import AdditiveER
from sim.mpe_tag import HETEROGENEOUS, MPETag, blocks, mlp_actions, parameter_count
from tests.test_policies_properties import EXAMPLES


def test_mpe_tag_plays_simple_tag_episodes_through_mpe2():
    env = MPETag()
    assert env.dim == parameter_count() == 181
    assert type(env._env.unwrapped).__module__.startswith("mpe2.")
    theta = np.random.default_rng(0).uniform(-1, 1, env.dim)
    returns = [env.episode(theta, seed) for seed in range(6)]
    assert all(r >= 0 and r % 10 == 0 for r in returns)  # MPE pays +10 per contact
    assert env.episode(theta, 3) == returns[3]  # a seed fixes the episode
    # the oracle averages fixed seeds: deterministic
    values = {f"theta.{i}": float(v) for i, v in enumerate(theta)}
    assert env.expected_reward(values) == env.expected_reward(values)
    reading = env.step(values, torch.Generator().manual_seed(0))
    assert set(reading) == {"R"} and reading["R"] % 10 == 0


def test_mpe_tag_het_gives_the_predators_their_own_speeds():
    env = MPETag(heterogeneous=True)
    env.episode(np.zeros(env.dim), 0)
    predators = [a for a in env._env.unwrapped.world.agents if a.adversary]
    assert [(a.max_speed, a.accel) for a in predators] == list(HETEROGENEOUS)


def test_mlp_layout_matches_the_blocks():
    theta = np.zeros(parameter_count())
    _, stop = blocks()["out_2"]
    theta[stop - 1] = 5.0  # out_2's bias
    actions = mlp_actions(theta, np.zeros((3, 16)))
    assert actions.shape == (3, 5)
    assert np.allclose(actions[:, 2], 1 / (1 + np.exp(-5.0))) and np.allclose(actions[:, 0], 0.5)
    spans = sorted(blocks().values())
    assert spans[0][0] == 0 and spans[-1][1] == parameter_count()
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_additive_er_is_additive_over_its_cliques_with_the_known_edges():
    env = AdditiveER(20, seed=3)
    assert {c for g in env.groups for c in g} == set(range(20))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(20, dtype=torch.float64, generator=g)
    for a, b in [(0, 1), (2, 5), (3, 15)]:
        h = 0.3
        ea, eb = torch.zeros(20, dtype=torch.float64), torch.zeros(20, dtype=torch.float64)
        ea[a], eb[b] = h, h
        mixed = env.value(x + ea + eb) - env.value(x + ea) - env.value(x + eb) + env.value(x)
        edge = (a, b) in env.dependency_edges
        assert (abs(float(mixed)) > 1e-9) == edge
    assert AdditiveER(20, seed=4).dependency_edges == env.dependency_edges  # graph per D


@pytest.mark.parametrize(
    "name",
    [
        "mpe-tag",
        "mpe-tag-het",
        "mpe-tag-hom",
        "mpe-tag-hom-no-ra",
        "mpe-tag-hom-no-ri",
        "mpe-tag-het-hom",
        "mamujoco-swimmer",
        "mamujoco-ant",
        "additive-er-20",
        "additive-er-50",
    ],
)
def test_paper000_specs_declare_the_simulators_parameters(name):
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    assert spec.parameters is not None
    assert spec.action_names == spec.parameter_vector


def test_mamujoco_swimmer_plays_episodes_through_gymnasium_robotics():
    from sim.mamujoco import MaMuJoCoSwimmer, blocks, linear_actions, parameter_count

    env = MaMuJoCoSwimmer()
    assert env.dim == parameter_count() == 14
    assert type(env._env.unwrapped).__module__.startswith("gymnasium_robotics.")
    assert blocks() == {"agent_0": (0, 7), "agent_1": (7, 14)}
    theta = np.random.default_rng(0).uniform(-1, 1, env.dim)
    first = env.episode(theta, 3)
    assert first == env.episode(theta, 3)  # a seed fixes the episode
    assert env.episode(theta, 4) != first  # MuJoCo's start noise differs per seed
    assert env.episode(np.zeros(env.dim), 3) != first  # θ drives the joints
    # agent i's torque reads only its own observation and its own block of θ
    obs = np.random.default_rng(1).normal(size=(2, 6))
    moved = obs.copy()
    moved[1] += 1.0
    assert linear_actions(theta, moved)[0] == linear_actions(theta, obs)[0]
    assert linear_actions(theta, moved)[1] != linear_actions(theta, obs)[1]
    values = {f"theta.{i}": float(v) for i, v in enumerate(theta)}
    reading = env.step(values, torch.Generator().manual_seed(0))
    assert set(reading) == {"R"} and np.isfinite(reading["R"])
    spec = load_spec(EXAMPLES / "mamujoco-swimmer.yaml")
    assert spec.parameters.blocks == blocks()


def test_mamujoco_ant_plays_episodes_through_gymnasium_robotics():
    from sim.mamujoco_ant import MaMuJoCoAnt, blocks, linear_actions, parameter_count

    env = MaMuJoCoAnt()
    assert env.dim == parameter_count() == 160 < 500
    assert type(env._env.unwrapped).__module__.startswith("gymnasium_robotics.")
    assert env._env.observation_space("agent_0").shape == (19,)
    assert [env._env.action_space(a).shape for a in env._env.agents] == [(4,), (4,)]
    standing = env.episode(np.zeros(env.dim), 0)  # zero torques: the Ant stands all 1,000 steps
    assert 950 < standing < 1050
    theta = np.random.default_rng(0).uniform(-1, 1, env.dim)
    first = env.episode(theta, 3)
    assert first == env.episode(theta, 3) and first < 500  # a seed fixes it; it falls over
    # joint k of agent i reads its own block of θ and nothing else
    obs = np.random.default_rng(1).normal(size=(2, 19))
    start, stop = blocks()["agent_1_joint_2"]
    moved = theta.copy()
    moved[start:stop] += 0.5  # that joint's weights and bias
    changed = linear_actions(moved, obs) != linear_actions(theta, obs)
    assert changed.tolist() == [[False] * 4, [False, False, True, False]]
    values = {f"theta.{i}": float(v) for i, v in enumerate(theta)}
    reading = env.step(values, torch.Generator().manual_seed(0))
    assert set(reading) == {"R"} and np.isfinite(reading["R"])
    assert load_spec(EXAMPLES / "mamujoco-ant.yaml").parameters.blocks == blocks()


@pytest.mark.parametrize(
    ("name", "steps"),
    [
        ("mpe-tag", 25),
        ("mpe-tag-het", 25),
        ("mpe-tag-hom", 25),
        ("mpe-tag-hom-no-ra", 25),
        ("mpe-tag-hom-no-ri", 25),
        ("mpe-tag-het-hom", 25),
        ("mamujoco-swimmer", 682),  # 1,000 steps thinned to 8,192 values of 2 x 6
        ("mamujoco-ant", 215),  # θ = 0 stands all 1,000 steps: thinned, 8,192 values of 2 x 19
    ],
)
def test_episode_environments_record_the_states_their_controller_saw(name, steps):
    """What `cbo-agent sim NAME --send-states` sends (issue 13): the observations (T, agents,
    obs) the controller was fed, in the shape of the controller hagpucb differentiates, the
    first the reset's; recording changes no return, and nothing is kept unless asked."""
    from connectors.arrays import MAX_ARRAY_ELEMENTS
    from sim.controllers import controllers
    from sim.registry import make_environment

    env = make_environment(name, 0)
    theta = np.zeros(env.dim)
    assert env.records_states and not env.record_states
    plain = env.episode(theta, 5)
    assert env.last_states is None
    env.record_states = True
    try:
        assert env.episode(theta, 5) == plain
        states = env.last_states
    finally:
        env.record_states, env.last_states = False, None
    controller = controllers()[name]
    assert states.shape == (steps, controller.agents, controller.obs)
    assert states.size <= MAX_ARRAY_ELEMENTS and np.isfinite(states).all()
    observations, _ = env._env.reset(seed=5)
    agents = [a for a in observations if a.startswith("adversary")] or list(observations)
    assert np.array_equal(states[0], np.stack([observations[a] for a in agents]))
    assert not np.array_equal(states[-1], states[0])  # the episode moved on
