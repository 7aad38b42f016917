"""Multi-agent MuJoCo (`gymnasium-robotics`' MaMuJoCo on `mujoco`): 2×1 Swimmer with a controller θ.

MaMuJoCo splits MuJoCo's Swimmer into two agents, one joint each (`mamujoco_v1.parallel_env(
"Swimmer", "2x1")`, PettingZoo parallel API); every agent sees its own 6 observations and sets
its joint's torque in [−1, 1]; the reward, the swimmer's forward progress minus a control cost,
is shared by both. The agents run a compact linear policy, one per agent,

    a_i = tanh(W_i · o_i + b_i),   W_i ∈ R^{1×6}, b_i ∈ R,

so θ has 2 × 7 = 14 parameters, agent by agent (W_i then b_i): the spec's blocks `agent_0` and
`agent_1`. One round is one 1,000-step episode (MaMuJoCo's default length), reset with a seed
drawn from the device's noise stream (MuJoCo's start-state noise is the episode's randomness;
the return's spread for a fixed θ is a few units, `RETURN_STD`); the reward is the episode
return. The oracle's E[y | θ] is the mean return over `ORACLE_EPISODES` fixed seeds. The
"optimum" is a reference, not a known maximum: `REFERENCE` is above the returns that linear
policies reach on single-agent Swimmer in the literature (Mania et al. 2018, ARS: about 350),
so the regret is a gap to it, and the best return is the comparison paper 000 makes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from sim._episodes import EpisodeEnvironment
from sim.base import ActionInfo, NodeInfo
from sim.errors import EnvironmentUnavailable

__all__ = [
    "AGENTS",
    "OBS",
    "MaMuJoCoSwimmer",
    "blocks",
    "linear_actions",
    "parallel_env",
    "parameter_count",
    "play",
    "play_kept",
]

AGENTS = 2
OBS = 6  # each agent's observation in MaMuJoCo's 2x1 Swimmer
STEPS = 1000
ORACLE_EPISODES = 4
REFERENCE = 400.0
# Returns of four random θ over three seeds each spread by 1–4 (measured); declared as the noise.
RETURN_STD = 3.0


def parameter_count() -> int:
    """D: AGENTS · (OBS + 1)."""
    return AGENTS * (OBS + 1)


def blocks() -> dict[str, tuple[int, int]]:
    """Each agent's weights and bias as a half-open range of θ."""
    return {f"agent_{i}": (i * (OBS + 1), (i + 1) * (OBS + 1)) for i in range(AGENTS)}


def linear_actions(theta: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """Torques (AGENTS,) in [−1, 1] for observations (AGENTS, OBS): one linear policy each."""
    layout = theta.reshape(AGENTS, OBS + 1)
    return np.tanh((layout[:, :OBS] * obs).sum(-1) + layout[:, OBS])


class MaMuJoCoSwimmer(EpisodeEnvironment):
    """MaMuJoCo's 2×1 Swimmer with the agents' linear-policy parameters θ as the action."""

    oracle_episodes = ORACLE_EPISODES
    reference_return = REFERENCE
    records_states = True

    def __init__(self) -> None:
        self.dim = parameter_count()
        self._env = parallel_env("mamujoco-swimmer", "Swimmer", "2x1", max_episode_steps=STEPS)
        super().__init__(
            name="mamujoco-swimmer",
            intervention_type="soft",
            nodes=(NodeInfo("R", (), RETURN_STD, (-200.0, 500.0)),),
            actions=tuple(
                ActionInfo(f"theta.{i}", ("R",), (-1.0, 1.0), cost=0.0) for i in range(self.dim)
            ),
            reward_node="R",
            description="Multi-agent MuJoCo 2x1 Swimmer (gymnasium-robotics), the two agents' "
            "linear policies (paper 000)",
        )

    def episode(self, theta: np.ndarray, seed: int) -> float:
        """The return of one episode with θ, reset with `seed`."""
        return play_kept(
            self, self._env, lambda obs: linear_actions(theta, obs)[:, None], seed, STEPS
        )


def parallel_env(name: str, scenario: str, agent_conf: str, **options):
    """MaMuJoCo's PettingZoo parallel env, or EnvironmentUnavailable naming the missing extra."""
    with warnings.catch_warnings():  # gymnasium-robotics warns about unrelated Adroit envs
        warnings.simplefilter("ignore")
        try:
            from gymnasium_robotics import mamujoco_v1
        except ImportError as missing:  # the optional `mamujoco` extra (not in the image)
            raise EnvironmentUnavailable(
                name, "gymnasium-robotics and mujoco", "mamujoco"
            ) from missing
    return mamujoco_v1.parallel_env(scenario, agent_conf, **options)


def play_kept(
    environment: EpisodeEnvironment,
    env,
    controller: Callable[[np.ndarray], np.ndarray],
    seed: int,
    steps: int,
) -> float:
    """`play` on `env`, the environment's MaMuJoCo env; where the environment records states
    (`record_states`), the observations the controller saw become its `last_states`."""
    if not environment.record_states:
        return play(env, controller, seed, steps)
    visited: list[np.ndarray] = []

    def recording(obs: np.ndarray) -> np.ndarray:
        visited.append(np.array(obs, dtype=np.float64))
        return controller(obs)

    total = play(env, recording, seed, steps)
    environment.keep_states(visited)
    return total


def play(env, controller: Callable[[np.ndarray], np.ndarray], seed: int, steps: int) -> float:
    """The shared return of one episode, reset with `seed`, of at most `steps` steps.

    `controller` maps the agents' observations (agents, obs) to their actions (agents, act);
    the episode ends early when MuJoCo's task terminates (e.g. an Ant that falls over).
    """
    observations, _ = env.reset(seed=seed)
    agents = list(env.agents)
    total = 0.0
    for _ in range(steps):
        moves = controller(np.stack([observations[a] for a in agents])).astype(np.float32)
        actions = {a: moves[i] for i, a in enumerate(agents)}
        observations, rewards, terminated, truncated, _ = env.step(actions)
        total += float(rewards[agents[0]])  # shared by the agents
        if any(terminated.values()) or any(truncated.values()):
            break
    return total
