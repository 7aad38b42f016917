"""Rosenbrock function network of paper 004 (MCBO), noiseless and noisy."""

from __future__ import annotations

import numpy as np
import torch

from sim._paper004 import SoftNetwork, fn_actions, noise
from sim.base import NodeInfo, Optimum

NODES = ("X0", "X1", "X2", "Y")  # the chain X0 → X1 → X2 → X3, with X3 ≡ Y
DIM = 5

# Representative node ranges: min/max of `sim._paper004.sampled_ranges(env, 20000, 10, seed=0)`
# (20000 uniform random actions × 10 rounds), padded by 5% and rounded (`padded_bounds`).
_BOUNDS = {
    False: {
        "X0": (-3700.0, 200.0),
        "X1": (-7100.0, 350.0),
        "X2": (-10000.0, 500.0),
        "Y": (-11500.0, 1000.0),
    },
    True: {
        "X0": (-3750.0, 200.0),
        "X1": (-7100.0, 350.0),
        "X2": (-10000.0, 500.0),
        "Y": (-11500.0, 1000.0),
    },
}


def _term(u: np.ndarray | torch.Tensor, v: np.ndarray | torch.Tensor):
    """The negated Rosenbrock term r(u, v) = −100 (v − u²)² − (1 − u)² ≤ 0."""
    return -100.0 * (v - u**2) ** 2 - (1.0 - u) ** 2


class Rosenbrock(SoftNetwork):
    """Rosenbrock as a function network (Astudillo & Frazier 2021), as in paper 004.

    Graph: the chain X0 → X1 → X2 → Y (Y ≡ X3); node i receives a_i and a_{i+1} [C action map
    `[[0,1],[1,2],[2,3],[3,4]]`, P Fig. 3]. Soft actions a0..a4 ∈ [0, 1].

        x   = 4·(a − 0.5) ∈ [−2, 2]^5                                   [C]
        X0  = −100 (x1 − x0²)² − (1 − x0)² + ω0                          [C]
        X_i = −100 (x_{i+1} − x_i²)² − (1 − x_i)² + X_{i−1} + ω_i, i ≥ 1  [C]

    Noise: 0 in the noiseless task [P]; N(0, 1) on every node in the noisy one [P A.4].

    Oracle: every node is its parent plus a term of the actions plus zero-mean noise, so
    E[Y | a] = Σ_{i=0}^{3} r(x_i, x_{i+1}) with r(u, v) = −100 (v − u²)² − (1 − u)², noisy or not
    (exact). Optimum: every r ≤ 0 with equality at u = v = 1, so 0 at a = 0.75 (x = 1) [C test].
    """

    def __init__(self, noisy: bool = False) -> None:
        self.noisy = noisy
        self.noise_std = 1.0 if noisy else 0.0
        bounds = _BOUNDS[noisy]
        feeds = [[name for i, name in enumerate(NODES) if j in (i, i + 1)] for j in range(DIM)]
        super().__init__(
            name="rosenbrock-noisy" if noisy else "rosenbrock",
            intervention_type="soft",
            nodes=tuple(
                NodeInfo(name, (NODES[i - 1],) if i else (), self.noise_std, bounds[name])
                for i, name in enumerate(NODES)
            ),
            actions=fn_actions(feeds),
            reward_node="Y",
            description="Rosenbrock function network (paper 004, Astudillo & Frazier 2021)"
            + (", noise std 1 per node" if noisy else ", noiseless"),
        )

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        x = 4.0 * (self._action_tensor(values) - 0.5)
        out: dict[str, torch.Tensor] = {}
        parent = torch.zeros(num, dtype=torch.float64)
        for i, name in enumerate(NODES):
            parent = parent + _term(x[i], x[i + 1]) + noise(num, self.noise_std, generator)
            out[name] = parent
        return out

    def _mean_reward(self, actions: np.ndarray) -> np.ndarray:
        x = 4.0 * (actions - 0.5)
        return _term(x[:, :-1], x[:, 1:]).sum(-1)

    def _compute_optimum(self) -> Optimum:
        return Optimum({f"a{j}": 0.75 for j in range(DIM)}, 0.0)
