"""MPE predator–prey (`mpe2`'s `simple_tag_v3`, PettingZoo parallel API) with a controller θ.

Three predators (MPE's adversaries) chase one faster, more agile prey among two obstacles for
25 steps (paper 000's "PredPrey 3"); MPE rewards the predators +10 for every predator–prey
contact in a step. The predators run a plain MLP policy whose parameters are θ, shared by the
three (each feeds its own 16-value observation): 16 → `HIDDEN` tanh units → 5 sigmoid outputs,
MPE's continuous action (no-op, left, right, down, up) in [0, 1]. θ is laid out unit by unit,
each hidden unit's 16 weights and bias, then each output's `HIDDEN` weights and bias, so the
spec's blocks (`hidden_j`, `out_k`) are the network's units. The prey is scripted (not
learned): it runs away from the predators, each weighted by 1 / distance².

One round is one episode, reset with a seed drawn from the device's noise stream (the start
positions are the episode's randomness); the reward is the predators' return (the same for
each of them in MPE, so no per-agent components). The oracle's E[y | θ] is the mean return over
`ORACLE_EPISODES` fixed seeds (an estimate, common to every θ); the "optimum" is the upper bound
3 contacts × 10 × 25 steps = 750, not a reachable value: the regret is a gap to that bound, and
the best return is the comparison paper 000 makes.

`mpe-tag-het` gives the predators different speeds and accelerations (paper 000's
heterogeneous variant; the values are ours, the paper does not give them).

`controller` picks what θ parameterizes: `mlp` (above), or paper 000's role-based higher-order
policy `hom` (`sim.hom.HOMController`: 414 parameters for the three predators, roles assigned by
the Hungarian algorithm, message passing over the role-interaction graph) and its ablations
`hom-no-ra` (no role assignment, 363) and `hom-no-ri` (no role interaction, 164). The HOM's
hidden state h ∈ (−1, 1)^5 becomes MPE's action (1 + h) / 2. Environments `mpe-tag-hom`,
`mpe-tag-hom-no-ra`, `mpe-tag-hom-no-ri` and `mpe-tag-het-hom`.

Every variant records the states its controller visits where asked (`record_states`: `cbo-agent
sim NAME --send-states`, or `bench regret` for `hagpucb`'s `visited_states`): the three
predators' observations of each step, [25, 3, 16] per episode.
"""

from __future__ import annotations

import numpy as np

from sim._episodes import EpisodeEnvironment
from sim.base import ActionInfo, NodeInfo
from sim.errors import EnvironmentUnavailable
from sim.hom import HOMController, unit_blocks

__all__ = ["CONTROLLERS", "HIDDEN", "MPETag", "controller_blocks", "mlp_actions", "parameter_count"]

OBS = 16  # a predator's observation in simple_tag with 3 predators, 1 prey, 2 obstacles
ACT = 5
HIDDEN = 8
STEPS = 25
ORACLE_EPISODES = 8
BOUND = 750.0
# The return's spread over start positions for a fixed θ: 19–26 measured for four random θ
# over 30 seeds each; the spec declares it as the reward's noise.
RETURN_STD = 22.0
HETEROGENEOUS = ((0.8, 2.5), (1.0, 3.0), (1.3, 3.5))  # (max_speed, accel) per predator
PREDATORS = 3
# controller name -> the HOM variant (role assignment, role interaction); `mlp` is not a HOM
CONTROLLERS = {
    "mlp": None,
    "hom": (True, True),
    "hom-no-ra": (False, True),
    "hom-no-ri": (True, False),
}


def hom_controller(controller: str) -> HOMController:
    """The predators' HOM policy of a `hom*` controller name."""
    role_assignment, role_interaction = CONTROLLERS[controller]
    return HOMController(PREDATORS, OBS, ACT, role_assignment, role_interaction)


def controller_blocks(controller: str) -> dict[str, tuple[int, int]]:
    """θ's blocks (the spec's `parameters.blocks`) for a controller name."""
    return blocks() if controller == "mlp" else hom_controller(controller).blocks


def parameter_count(hidden: int = HIDDEN) -> int:
    """D of the MLP: hidden · (OBS + 1) + ACT · (hidden + 1)."""
    return hidden * (OBS + 1) + ACT * (hidden + 1)


def blocks(hidden: int = HIDDEN) -> dict[str, tuple[int, int]]:
    """The network's units as half-open ranges of θ."""
    return unit_blocks(OBS, hidden, ACT, 0, ("hidden_", "out_"))


def mlp_actions(theta: np.ndarray, obs: np.ndarray, hidden: int = HIDDEN) -> np.ndarray:
    """Actions (n, 5) in [0, 1] of the shared MLP for observations (n, 16)."""
    first = theta[: hidden * (OBS + 1)].reshape(hidden, OBS + 1)
    second = theta[hidden * (OBS + 1) :].reshape(ACT, hidden + 1)
    h = np.tanh(obs @ first[:, :OBS].T + first[:, OBS])
    return 1.0 / (1.0 + np.exp(-(h @ second[:, :hidden].T + second[:, hidden])))


def _prey_action(obs: np.ndarray) -> np.ndarray:
    """Flee: away from the predators (relative positions obs[8:14]), weighted by 1/d²."""
    rel = obs[8:14].reshape(3, 2)
    weight = 1.0 / np.maximum((rel**2).sum(-1, keepdims=True), 1e-3)
    away = -(rel * weight).sum(0)
    away = away / max(float(np.linalg.norm(away)), 1e-9)
    return np.array(
        [0.0, max(away[0], 0.0), max(-away[0], 0.0), max(away[1], 0.0), max(-away[1], 0.0)],
        dtype=np.float32,
    )


class MPETag(EpisodeEnvironment):
    """Predator–prey from MPE with the predators' MLP parameters θ as the action."""

    oracle_episodes = ORACLE_EPISODES
    reference_return = BOUND
    records_states = True

    def __init__(self, heterogeneous: bool = False, controller: str = "mlp") -> None:
        name = ("mpe-tag-het" if heterogeneous else "mpe-tag") + (
            "" if controller == "mlp" else f"-{controller}"
        )
        try:
            from mpe2 import simple_tag_v3
        except ImportError as missing:  # the optional `mpe` extra (not in the image)
            raise EnvironmentUnavailable(name, "mpe2", "mpe") from missing
        self.heterogeneous = heterogeneous
        self.controller = controller
        self._hom = None if controller == "mlp" else hom_controller(controller)
        self.dim = parameter_count() if self._hom is None else self._hom.dim
        self.parameter_blocks = controller_blocks(controller)
        self._env = simple_tag_v3.parallel_env(
            num_good=1,
            num_adversaries=3,
            num_obstacles=2,
            max_cycles=STEPS,
            continuous_actions=True,
        )
        super().__init__(
            name=name,
            intervention_type="soft",
            nodes=(NodeInfo("R", (), RETURN_STD, (0.0, 200.0)),),
            actions=tuple(
                ActionInfo(f"theta.{i}", ("R",), (-1.0, 1.0), cost=0.0) for i in range(self.dim)
            ),
            reward_node="R",
            description="MPE simple_tag (3 predators, 1 prey), the predators' "
            + ("MLP parameters" if self._hom is None else f"{_HOM_NAMES[controller]} parameters")
            + (", heterogeneous predators" if heterogeneous else "")
            + " (paper 000)",
        )

    def episode(self, theta: np.ndarray, seed: int) -> float:
        """The predators' return of one 25-step episode with θ, reset with `seed`."""
        observations, _ = self._env.reset(seed=seed)
        if self.heterogeneous:
            predators = [a for a in self._env.unwrapped.world.agents if a.adversary]
            for agent, (speed, accel) in zip(predators, HETEROGENEOUS, strict=True):
                agent.max_speed, agent.accel = speed, accel
        total = 0.0
        predators = [f"adversary_{i}" for i in range(3)]
        visited: list[np.ndarray] = []
        for _ in range(STEPS):
            if not self._env.agents:
                break
            obs = np.stack([observations[a] for a in predators])
            if self.record_states:
                visited.append(obs.astype(np.float64))
            moves = self._predator_actions(theta, obs).astype(np.float32)
            actions = {a: moves[i] for i, a in enumerate(predators)}
            actions["agent_0"] = _prey_action(observations["agent_0"])
            observations, rewards, _, _, _ = self._env.step(actions)
            total += float(rewards["adversary_0"])
        if self.record_states:
            self.keep_states(visited)
        return total

    def _predator_actions(self, theta: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """Actions (3, 5) in [0, 1] of the controller θ for the predators' observations."""
        if self._hom is None:
            return mlp_actions(theta, obs)
        return (1.0 + self._hom.numpy_actions(theta, obs)) / 2.0


_HOM_NAMES = {
    "hom": "role-based HOM policy",
    "hom-no-ra": "HOM policy without role assignment",
    "hom-no-ri": "HOM policy without role interaction",
}
