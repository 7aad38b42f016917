"""Dropwave whose optimum drifts: the noisy Dropwave network with its centre moving on a circle.

The environment of issue 22's drift task. Round t's system is `Dropwave(noisy=True)` with the
action box's centre replaced by c(t):

    c(t) = (0.5 + 0.2·cos(2πt/T), 0.5 + 0.2·sin(2πt/T)),   T = `period` rounds (default 1000)
    x    = 10.24·(a − c(t))
    X0   = ‖x‖₂ + ω0,   Y = (1 + cos(12·X0)) / (2 + 0.5·X0²) + ω1,   ω ~ N(0, 0.1²)

so the peak moves 0.2·2π/T ≈ 0.0013 of the box per round: slowly against the ripple of width
about 0.05 that a model resolves, fast against 1000 rounds of memory. `at(t)` is round t's
system (an `Environment`: its oracle, its optimum); the instance itself is round 0's.

Oracle: as noisy Dropwave, E[Y | a] = E_Z[h(‖x‖ + 0.1 Z)] by 64-point Gauss–Hermite; its maximum
over ‖x‖ is at ‖x‖ = 0 (see `sim.dropwave`), i.e. at a = c(t), always inside the box, so the
optimum at every round is exact: c(t) with the value of noisy Dropwave's optimum.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from sim._paper004 import maximize_scalar, noise
from sim.base import NodeInfo, Optimum
from sim.dropwave import R_MAX, Dropwave, _drop

PERIOD = 1000  # rounds per turn of the centre
RADIUS = 0.2  # of the circle, in action units


class DropwaveDrift(Dropwave):
    """Noisy Dropwave whose centre is c(t) (see the module); this instance is round `round`."""

    def __init__(self, round: int = 0, period: int = PERIOD) -> None:
        super().__init__(noisy=True)
        self.name = "dropwave-drift"
        self.description = (
            f"noisy Dropwave whose optimum circles the box centre once every {period} rounds"
        )
        self.round, self.period = int(round), int(period)
        angle = 2.0 * math.pi * self.round / self.period
        self.centre = (0.5 + RADIUS * math.cos(angle), 0.5 + RADIUS * math.sin(angle))
        # ‖x‖ reaches 10.24·√2·(0.5 + RADIUS) at the corner farthest from the centre
        reach = 10.24 * math.sqrt(2.0) * (0.5 + RADIUS)
        self.nodes = (NodeInfo("X0", (), self.noise_std, (-0.55, reach + 0.5)), self.nodes[1])

    def at(self, round: int) -> DropwaveDrift:
        """Round `round`'s system."""
        return _at(self.period, int(round))

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        a = self._action_tensor(values)
        x = 10.24 * (a - torch.tensor(self.centre, dtype=a.dtype))
        x0 = torch.linalg.vector_norm(x) + noise(num, self.noise_std, generator)
        y = _drop(x0) + noise(num, self.noise_std, generator)
        return {"X0": x0, "Y": y}

    def _mean_reward(self, actions: np.ndarray) -> np.ndarray:
        radius = np.linalg.norm(10.24 * (actions - np.array(self.centre)), axis=-1)
        return self._mean_at_norm(radius)

    def _compute_optimum(self) -> Optimum:
        radius, value = _best_radius()
        step = radius / (10.24 * math.sqrt(2.0))  # on the diagonal through the centre
        return Optimum({"a0": self.centre[0] + step, "a1": self.centre[1] + step}, value)


@functools.cache
def _best_radius() -> tuple[float, float]:
    """The ‖x‖ maximizing noisy Dropwave's E[Y] and that maximum (the same every round)."""
    return maximize_scalar(Dropwave(noisy=True)._mean_at_norm, 0.0, R_MAX)


@functools.lru_cache(maxsize=4096)
def _at(period: int, round: int) -> DropwaveDrift:
    return DropwaveDrift(round, period)
