"""Dropwave function network of paper 004 (MCBO), noiseless and noisy."""

from __future__ import annotations

import math

import numpy as np
import torch

from sim._paper004 import SoftNetwork, fn_actions, maximize_scalar, noise
from sim._quadrature import standard_normal_rule
from sim.base import NodeInfo, Optimum

NOISE_STD = 0.1  # [P A.4] unit-Gaussian noise "scaled by 0.1"; [C] Normal(0, 0.1) is a std
R_MAX = 5.12 * math.sqrt(2.0)  # largest ‖x‖ over the action box

# Representative node ranges: min/max of `sim._paper004.sampled_ranges(env, 20000, 10, seed=0)`
# (20000 uniform random actions × 10 rounds), padded by 5% and rounded (`padded_bounds`).
_BOUNDS = {
    False: {"X0": (-0.35, 7.6), "Y": (-0.05, 1.05)},
    True: {"X0": (-0.55, 7.85), "Y": (-0.5, 1.3)},
}


def _drop(x: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """The Dropwave profile h(x) = (1 + cos 12x) / (2 + x²/2)."""
    lib = torch if isinstance(x, torch.Tensor) else np
    return (1.0 + lib.cos(12.0 * x)) / (2.0 + 0.5 * x**2)


class Dropwave(SoftNetwork):
    """Dropwave as a function network (Astudillo & Frazier 2021), as in paper 004.

    Graph: a0, a1 → X0 → Y. Soft actions a0, a1 ∈ [0, 1], both feeding X0 [P Fig. 3, C].

        x  = 10.24·a − 5.12 ∈ [−5.12, 5.12]²           [C]
        X0 = ‖x‖₂ + ω0                                  [C]
        Y  = (1 + cos(12·X0)) / (2 + 0.5·X0²) + ω1      [C as given by the digest, §3.3]

    Noise: 0 in the noiseless task [P]; N(0, 0.1²) on every node in the noisy one [P A.4, C].

    Note: the released code evaluates Y at the noiseless norm ‖x‖ instead of at X0, which cuts
    the X0 → Y edge the paper's graph draws. The two agree when noiseless; with noise this class
    follows the paper's graph and the digest (Y reads the noisy X0).

    Oracle: noiseless, E[Y | a] = h(‖x‖); noisy, E[Y | a] = E_Z[h(‖x‖ + 0.1 Z)] by 64-point
    Gauss–Hermite (Y's own noise averages out).

    Optimum: noiseless, 1 at a = (0.5, 0.5) [C test]; noisy, a 1-D search over ‖x‖ gives
    ≈0.74240, also at a = (0.5, 0.5) [D] (the noise damps the ripple cos(12·X0) by about
    e^{−0.72} at every ‖x‖, so the centre stays best).
    """

    def __init__(self, noisy: bool = False) -> None:
        self.noisy = noisy
        self.noise_std = NOISE_STD if noisy else 0.0
        bounds = _BOUNDS[noisy]
        super().__init__(
            name="dropwave-noisy" if noisy else "dropwave",
            intervention_type="soft",
            nodes=(
                NodeInfo("X0", (), self.noise_std, bounds["X0"]),
                NodeInfo("Y", ("X0",), self.noise_std, bounds["Y"]),
            ),
            actions=fn_actions([("X0",), ("X0",)]),
            reward_node="Y",
            description="Dropwave function network (paper 004, Astudillo & Frazier 2021)"
            + (", noise std 0.1 per node" if noisy else ", noiseless"),
        )

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        x = 10.24 * self._action_tensor(values) - 5.12
        x0 = torch.linalg.vector_norm(x) + noise(num, self.noise_std, generator)
        y = _drop(x0) + noise(num, self.noise_std, generator)
        return {"X0": x0, "Y": y}

    def _mean_at_norm(self, radius: np.ndarray) -> np.ndarray:
        """E[Y] as a function of r = ‖x‖: (N,) -> (N,)."""
        if not self.noisy:
            return _drop(radius)
        nodes, weights = standard_normal_rule(64)
        return _drop(radius[:, None] + self.noise_std * nodes[None, :]) @ weights

    def _mean_reward(self, actions: np.ndarray) -> np.ndarray:
        radius = np.linalg.norm(10.24 * actions - 5.12, axis=-1)
        return self._mean_at_norm(radius)

    def _compute_optimum(self) -> Optimum:
        if not self.noisy:
            return Optimum({"a0": 0.5, "a1": 0.5}, 1.0)
        radius, value = maximize_scalar(self._mean_at_norm, 0.0, R_MAX)
        # Any action with that norm is optimal; take the diagonal direction (always in the box).
        a = 0.5 + radius / (10.24 * math.sqrt(2.0))
        return Optimum({"a0": a, "a1": a}, value)
