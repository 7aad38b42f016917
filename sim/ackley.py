"""Ackley function network of paper 004 (MCBO), noiseless only."""

from __future__ import annotations

import math

import numpy as np
import torch

from sim._paper004 import SoftNetwork, fn_actions
from sim.base import NodeInfo, Optimum

DIM = 6

# Representative node ranges: min/max of `sim._paper004.sampled_ranges(env, 20000, 10, seed=0)`
# (20000 uniform random actions × 10 rounds), padded by 5% and rounded (`padded_bounds`).
_BOUNDS = {"X0": (-0.15, 3.5), "X1": (-1.0, 1.05), "Y": (-8.05, -1.6)}


class Ackley(SoftNetwork):
    """Ackley as a function network (Astudillo & Frazier 2021), as in paper 004.

    Graph: a0..a5 → X0, a0..a5 → X1, X0, X1 → Y [P Fig. 3, C]. Soft actions a0..a5 ∈ [0, 1],
    each feeding both X0 and X1.

        x  = 4·(a − 0.5) ∈ [−2, 2]^6               [C]
        X0 = (1/6) Σ_j x_j²                         [C]
        X1 = (1/6) Σ_j cos(2π x_j)                  [C]
        Y  = 20·exp(−0.2·√X0) + exp(X1) − 20 − e    [C]

    Noiseless only: "There is no noisy version of Ackley because adding noise can make the
    environment unstable by producing very large or very small rewards" [P A.4] (also, √X0 of
    a noisy X0 < 0 would be undefined).

    Oracle: the network is deterministic, E[Y | a] = Y(a). Optimum: 0 at a = 0.5 (x = 0), the
    global maximum of the negated Ackley function [C test].
    """

    def __init__(self) -> None:
        self.noisy = False
        super().__init__(
            name="ackley",
            intervention_type="soft",
            nodes=(
                NodeInfo("X0", (), 0.0, _BOUNDS["X0"]),
                NodeInfo("X1", (), 0.0, _BOUNDS["X1"]),
                NodeInfo("Y", ("X0", "X1"), 0.0, _BOUNDS["Y"]),
            ),
            actions=fn_actions([("X0", "X1")] * DIM),
            reward_node="Y",
            description="Ackley function network (paper 004, Astudillo & Frazier 2021), noiseless",
        )

    @staticmethod
    def _network(x: torch.Tensor) -> dict[str, torch.Tensor]:
        x0 = (x**2).mean(-1)
        x1 = torch.cos(2.0 * math.pi * x).mean(-1)
        y = 20.0 * torch.exp(-0.2 * torch.sqrt(x0)) + torch.exp(x1) - 20.0 - math.e
        return {"X0": x0, "X1": x1, "Y": y}

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        x = 4.0 * (self._action_tensor(values) - 0.5)
        return {name: value.expand(num).clone() for name, value in self._network(x).items()}

    def _mean_reward(self, actions: np.ndarray) -> np.ndarray:
        return self._network(torch.from_numpy(4.0 * (actions - 0.5)))["Y"].numpy()

    def _compute_optimum(self) -> Optimum:
        return Optimum({f"a{j}": 0.5 for j in range(DIM)}, 0.0)
