"""Finding the differentiable controller the devices run, for `hagpucb`'s surrogate Hessian.

The controllers belong to the environments whose devices run them (`sim/controllers.py`), and
policies may import only core (docs/design.md). So the policy looks them up by name through the
entry-point group `cbo_agent.controllers`: each entry point names a function that returns a
mapping of controller name -> controller, and a package of one's own devices can add one
(`[project.entry-points."cbo_agent.controllers"]` in its pyproject.toml) without a change here.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from core.plain_errors import unknown_name

__all__ = ["CONTROLLERS_GROUP", "Controller", "controller", "controller_names"]

CONTROLLERS_GROUP = "cbo_agent.controllers"


class Controller(Protocol):
    """A differentiable policy π(θ; s), as a device runs it.

    Attributes:
        name: the environment whose devices run it.
        dim: D, the length of θ.
        agents, obs: the states' shape (agents, obs).
        state_bounds: a box of typical observations, where no visited states are recorded.
        actions: (θ (D,) float64, states (agents, obs) float64) -> actions (agents, act),
            differentiable in θ.
    """

    name: str
    dim: int
    agents: int
    obs: int
    state_bounds: tuple[float, float]
    actions: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _installed() -> dict[str, Controller]:
    """Every controller the installed entry points offer; a name offered twice is an error."""
    found: dict[str, Controller] = {}
    for entry in importlib.metadata.entry_points(group=CONTROLLERS_GROUP):
        offered: Mapping[str, Controller] = entry.load()()
        for name, value in offered.items():
            if name in found:
                raise RuntimeError(
                    f"two entry points of group {CONTROLLERS_GROUP} offer controller {name!r}"
                )
            found[name] = value
    return found


def controller_names() -> list[str]:
    return sorted(_installed())


def controller(name: str) -> Controller:
    """The controller of environment `name`.

    Raises:
        KeyError: an unknown name (the message lists the known ones; none are known where the
            package's entry points are not installed).
    """
    found = _installed()
    if name not in found:
        raise KeyError(unknown_name("controller", name, sorted(found)))
    return found[name]
