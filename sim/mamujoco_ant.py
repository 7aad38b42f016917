"""Multi-agent MuJoCo's 2×4 Ant (`gymnasium-robotics`' MaMuJoCo on `mujoco`) with a controller θ.

MaMuJoCo splits MuJoCo's Ant (Gymnasium's Ant-v5) into two agents of two legs each
(`mamujoco_v1.parallel_env("Ant", "2x4")`), each setting its 4 hip and ankle torques in
[−1, 1]; the reward — forward progress, +1 per step while the torso stays healthy, minus control
and contact costs — is shared by both, and the episode ends when the Ant falls over (its torso
leaves Ant-v5's healthy height range). Each agent observes its own 4 joints' angles and
velocities (`agent_obsk=0`, local categories qpos and qvel: MaMuJoCo's default for Ant adds
the neighbours' joints and contact forces, 63 values, which would take a linear policy past the
paper's 500 parameters) and MaMuJoCo's global torso state (height, orientation quaternion and
its 6 velocities): 19 values. The agents run a compact linear policy, one per agent,

    a_i = tanh(W_i · o_i + b_i),   W_i ∈ R^{4×19}, b_i ∈ R^4,

so θ has 2 × 4 × 20 = 160 parameters, laid out agent by agent and joint by joint (that joint's
19 weights, then its bias): the spec's blocks `agent_{i}_joint_{k}`. One round is one episode
of at most `STEPS` = 1,000 steps (MaMuJoCo's and Ant-v5's length; one episode takes under a
second on 2 busy cores, measured), reset with a seed drawn from the device's noise stream. The
oracle's E[y | θ] is the mean return over `ORACLE_EPISODES` fixed seeds. The "optimum" is a
reference, not a known maximum: Gymnasium's `reward_threshold` for Ant-v5, 6,000, so the regret
is a gap to it and the best return is the comparison paper 000 makes. Where asked
(`record_states`), an episode keeps the agents' observations it fed the controller, [T, 2, 19]
thinned evenly to at most 215 states (8,192 values, one reading), as the Swimmer does.
"""

from __future__ import annotations

import numpy as np

from sim._episodes import EpisodeEnvironment
from sim.base import ActionInfo, NodeInfo
from sim.mamujoco import parallel_env, play_kept

__all__ = ["AGENTS", "JOINTS", "OBS", "MaMuJoCoAnt", "blocks", "linear_actions", "parameter_count"]

AGENTS = 2
JOINTS = 4  # per agent: two legs, hip and ankle each
OBS = 19  # an agent's 8 joint angles and velocities + the torso's 11 global values
STEPS = 1000
ORACLE_EPISODES = 4
REFERENCE = 6000.0  # Gymnasium's reward_threshold for Ant-v5
# The return's spread over start noise for a fixed θ, declared as the reward's noise: measured
# over 5 seeds, 3 for θ = 0 (the Ant stands, about 995), 8 to 87 for six random θ (when it falls
# over varies with the start noise), one of them 239 (a single episode of −643).
RETURN_STD = 50.0


def parameter_count() -> int:
    """D: AGENTS · JOINTS · (OBS + 1)."""
    return AGENTS * JOINTS * (OBS + 1)


def blocks() -> dict[str, tuple[int, int]]:
    """Each joint's weights and bias as a half-open range of θ, agent by agent."""
    out = {}
    for i in range(AGENTS):
        for k in range(JOINTS):
            start = (i * JOINTS + k) * (OBS + 1)
            out[f"agent_{i}_joint_{k}"] = (start, start + OBS + 1)
    return out


def linear_actions(theta: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """Torques (AGENTS, JOINTS) in [−1, 1] for observations (AGENTS, OBS), one policy per agent."""
    layout = theta.reshape(AGENTS, JOINTS, OBS + 1)
    return np.tanh(np.einsum("ajo,ao->aj", layout[..., :OBS], obs) + layout[..., OBS])


class MaMuJoCoAnt(EpisodeEnvironment):
    """MaMuJoCo's 2×4 Ant with the agents' linear-policy parameters θ as the action."""

    oracle_episodes = ORACLE_EPISODES
    reference_return = REFERENCE
    records_states = True

    def __init__(self) -> None:
        self.dim = parameter_count()
        self._env = parallel_env(
            "mamujoco-ant",
            "Ant",
            "2x4",
            agent_obsk=0,
            local_categories=[["qpos", "qvel"]],
            max_episode_steps=STEPS,
        )
        super().__init__(
            name="mamujoco-ant",
            intervention_type="soft",
            nodes=(NodeInfo("R", (), RETURN_STD, (-200.0, 1200.0)),),
            actions=tuple(
                ActionInfo(f"theta.{i}", ("R",), (-1.0, 1.0), cost=0.0) for i in range(self.dim)
            ),
            reward_node="R",
            description="Multi-agent MuJoCo 2x4 Ant (gymnasium-robotics), the two agents' "
            "linear policies (paper 000)",
        )

    def episode(self, theta: np.ndarray, seed: int) -> float:
        """The return of one episode with θ, reset with `seed` (ends early if the Ant falls)."""
        return play_kept(self, self._env, lambda obs: linear_actions(theta, obs), seed, STEPS)
