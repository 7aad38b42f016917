"""The differentiable controllers the shipped devices run, for `hagpucb`'s surrogate Hessian.

They live beside the environments whose devices run them; the policy finds them through the
entry-point group `cbo_agent.controllers` (pyproject.toml; `policies/_controllers.py`), so no
room imports sim/ for them (docs/design.md).

Paper 000's phase 1 reads the additive structure off H_π = ∂²π/∂θ_a∂θ_b, the Hessian of the
*policy's output* in its parameters (`core.structure.surrogate_hessian`). The agent computes it
itself, on its own copy of the controller the devices run: θ is all the devices receive, and
the controller is the same torch (or numpy, here re-expressed in torch) function on both sides.
A controller is named after the environment whose devices run it (`cbo-agent sim NAME`), and
`hagpucb`'s `controller` setting picks one; its `dim` must equal the spec's θ.

Each controller maps (θ (D,), states (agents, obs)) to the agents' actions (agents, act),
differentiably in θ — for the HOM policies the relaxation the paper uses for this phase only
(Sinkhorn–Knopp role assignment, sigmoid role-interaction edges: `sim.hom`, `soft=True`); the
devices play the hard policy.

`state_bounds` is a box of typical observations: where `hagpucb` has no recorded states
(`visited_states` sent by the devices, or a `states_file`), it draws the states H_π is averaged
over uniformly in it. It is a rough range read off a few episodes, not the visited
distribution; which entries of H_π vanish (the edges) depends on the controller's form, the
magnitudes on the states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch

__all__ = ["Controller", "controllers"]

Actions = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Controller:
    """A differentiable policy π(θ; s).

    Attributes:
        name: the environment whose devices run it.
        dim: D, the length of θ.
        agents, obs: the states' shape (agents, obs).
        state_bounds: a box of typical observations (see the module docstring).
        actions: (θ (D,), states (agents, obs)) -> actions (agents, act).
    """

    name: str
    dim: int
    agents: int
    obs: int
    state_bounds: tuple[float, float]
    actions: Actions


def _mpe_mlp(theta: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """`sim.mpe_tag.mlp_actions` in torch: 16 → 8 tanh → 5 sigmoid, shared by the predators."""
    from sim.mpe_tag import ACT, HIDDEN, OBS

    split = HIDDEN * (OBS + 1)
    first = theta[:split].reshape(HIDDEN, OBS + 1)
    second = theta[split:].reshape(ACT, HIDDEN + 1)
    h = torch.tanh(states @ first[:, :OBS].T + first[:, OBS])
    return torch.sigmoid(h @ second[:, :HIDDEN].T + second[:, HIDDEN])


def _swimmer(theta: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """`sim.mamujoco.linear_actions` in torch: one tanh-linear policy per agent, (agents, 1)."""
    from sim.mamujoco import AGENTS, OBS

    layout = theta.reshape(AGENTS, OBS + 1)
    return torch.tanh((layout[:, :OBS] * states).sum(-1) + layout[:, OBS]).unsqueeze(-1)


def _ant(theta: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """`sim.mamujoco_ant.linear_actions` in torch: (agents, joints) torques."""
    from sim.mamujoco_ant import AGENTS, JOINTS, OBS

    layout = theta.reshape(AGENTS, JOINTS, OBS + 1)
    return torch.tanh(torch.einsum("ajo,ao->aj", layout[..., :OBS], states) + layout[..., OBS])


def _hom(variant: str) -> tuple[int, Actions]:
    from sim.mpe_tag import hom_controller

    policy = hom_controller(variant)

    def actions(theta: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        return policy.actions(theta, states, soft=True)

    return policy.dim, actions


@cache
def controllers() -> dict[str, Controller]:
    """Every shipped controller by the name of its environment (the entry point's target)."""
    from sim import mamujoco, mamujoco_ant, mpe_tag

    mpe = (mpe_tag.PREDATORS, mpe_tag.OBS, (-2.0, 2.0))
    out = {
        name: Controller(name, mpe_tag.parameter_count(), *mpe, _mpe_mlp)
        for name in ("mpe-tag", "mpe-tag-het")
    }
    for name, variant in (
        ("mpe-tag-hom", "hom"),
        ("mpe-tag-het-hom", "hom"),
        ("mpe-tag-hom-no-ra", "hom-no-ra"),
        ("mpe-tag-hom-no-ri", "hom-no-ri"),
    ):
        dim, actions = _hom(variant)
        out[name] = Controller(name, dim, *mpe, actions)
    out["mamujoco-swimmer"] = Controller(
        "mamujoco-swimmer",
        mamujoco.parameter_count(),
        mamujoco.AGENTS,
        mamujoco.OBS,
        (-3.0, 3.0),
        _swimmer,
    )
    out["mamujoco-ant"] = Controller(
        "mamujoco-ant",
        mamujoco_ant.parameter_count(),
        mamujoco_ant.AGENTS,
        mamujoco_ant.OBS,
        (-2.0, 2.0),
        _ant,
    )
    return out
