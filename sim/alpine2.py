"""Alpine2 function network of paper 004 (MCBO), noiseless and noisy."""

from __future__ import annotations

import numpy as np
import torch

from sim._paper004 import SoftNetwork, fn_actions, maximize_scalar, noise
from sim.base import NodeInfo, Optimum

NODES = ("X0", "X1", "X2", "X3", "X4", "Y")  # the chain X0 → … → X5, with X5 ≡ Y

# Representative node ranges: min/max of `sim._paper004.sampled_ranges(env, 20000, 10, seed=0)`
# (20000 uniform random actions × 10 rounds), padded by 5% and rounded (`padded_bounds`).
_BOUNDS = {
    False: {
        "X0": (-3.1, 2.45),
        "X1": (-9.0, 7.0),
        "X2": (-24.0, 19.5),
        "X3": (-60.0, 55.0),
        "X4": (-125.0, 140.0),
        "Y": (-220.0, 200.0),
    },
    True: {
        "X0": (-8.0, 7.5),
        "X1": (-20.0, 18.5),
        "X2": (-45.5, 40.5),
        "X3": (-110.0, 110.0),
        "X4": (-210.0, 195.0),
        "Y": (-320.0, 385.0),
    },
}


def _gain(x: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """The per-node factor g(x) = √x · sin x."""
    lib = torch if isinstance(x, torch.Tensor) else np
    return lib.sqrt(x) * lib.sin(x)


class Alpine2(SoftNetwork):
    """Alpine2 as a function network (Astudillo & Frazier 2021), as in paper 004.

    Graph: the chain X0 → X1 → X2 → X3 → X4 → Y (Y ≡ X5), and a_i → X_i for i = 0..5
    [P Fig. 3, C]. Soft actions a0..a5 ∈ [0, 1].

        x   = 10·a ∈ [0, 10]^6                         [C]
        X0  = −√x0 · sin(x0) + ω0                       [C]
        X_i = √x_i · sin(x_i) · X_{i−1} + ω_i,  i ≥ 1   [C]

    Noise: 0 in the noiseless task [P]; N(0, 1) on every node in the noisy one [P A.4].

    Oracle: each node is linear in its parent and the noises are zero-mean and independent of
    the parent, so E[X_i] = g(x_i)·E[X_{i−1}] and E[Y | a] = −∏_i g(x_i) with g(x) = √x sin x,
    noisy or not (exact).

    Optimum: with M₊ = max g ≈ 2.80813 (x ≈ 7.9171) and M₋ = −min g ≈ 2.18277 (x ≈ 4.8158) on
    [0, 10], any a with k negative factors has −∏ g ≤ M₋^k M₊^{6−k} for odd k (and ≤ 0 for even
    k); M₊ > M₋ makes k = 1 best: E[Y] = M₋·M₊⁵ ≈ 381.149 with one action at ≈0.4816 and five
    at ≈0.7917 (the digest's value). The negative factor may sit at any of the six nodes; the
    reported argmax puts it at a0.
    """

    def __init__(self, noisy: bool = False) -> None:
        self.noisy = noisy
        self.noise_std = 1.0 if noisy else 0.0
        bounds = _BOUNDS[noisy]
        super().__init__(
            name="alpine2-noisy" if noisy else "alpine2",
            intervention_type="soft",
            nodes=tuple(
                NodeInfo(name, (NODES[i - 1],) if i else (), self.noise_std, bounds[name])
                for i, name in enumerate(NODES)
            ),
            actions=fn_actions([(name,) for name in NODES]),
            reward_node="Y",
            description="Alpine2 function network (paper 004, Astudillo & Frazier 2021)"
            + (", noise std 1 per node" if noisy else ", noiseless"),
        )

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        gains = _gain(10.0 * self._action_tensor(values))
        out: dict[str, torch.Tensor] = {}
        parent = torch.full((num,), -1.0, dtype=torch.float64)  # X0 = −g(x0) + ω0
        for i, name in enumerate(NODES):
            parent = gains[i] * parent + noise(num, self.noise_std, generator)
            out[name] = parent
        return out

    def _mean_reward(self, actions: np.ndarray) -> np.ndarray:
        return -np.prod(_gain(10.0 * actions), axis=-1)

    def _compute_optimum(self) -> Optimum:
        x_plus, m_plus = maximize_scalar(_gain, 0.0, 10.0)
        x_minus, m_minus = maximize_scalar(lambda x: -_gain(x), 0.0, 10.0)
        count = len(NODES)
        # Odd numbers k of negative factors; the product of magnitudes is maximal per factor.
        k = max(range(1, count + 1, 2), key=lambda j: m_minus**j * m_plus ** (count - j))
        xs = [x_minus] * k + [x_plus] * (count - k)
        intervention = {f"a{i}": x / 10.0 for i, x in enumerate(xs)}
        return Optimum(intervention, self.expected_reward(intervention))
