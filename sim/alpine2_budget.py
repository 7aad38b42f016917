"""`alpine2-budget`: Alpine2 run as a plant with natural settings, under a cardinality limit.

The cardinality/budget scenario of issue 4. In plain Alpine2 a soft action of 0 ("no
intervention") sets x_i = 0, which zeroes that node and everything downstream, so "at most two
interventions" would make every admissible reward 0. Here a node that is not intervened on runs
at its natural setting x_i⁰ = 10·b_i (the plant's defaults, below), and an intervention a_i ∈
(0, 1] overrides it with x_i = 10·a_i. Every intervention costs 1; the example spec allows at
most 2 per round and a total budget.

    natural settings b = (0.62, 0.35, 0.55, 0.75, 0.42, 0.66)   (chosen: an ordinary plant whose
    baseline reward is small, so two well-chosen interventions matter; not from a paper)

The optimum respects the cardinality limit (`max_interventions`, default 2): every support of at
most that many actions is searched exactly, the free factors taking the best of the per-node
extremes of g(x) = √x sin x (the reward is −∏ g(x_i), as in Alpine2).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from sim._paper004 import maximize_scalar
from sim.alpine2 import Alpine2, _gain
from sim.base import Optimum

NATURAL = np.array([0.62, 0.35, 0.55, 0.75, 0.42, 0.66])


class Alpine2Budget(Alpine2):
    """Alpine2 with natural settings for nodes not intervened on (noiseless)."""

    def __init__(self, max_interventions: int = 2) -> None:
        super().__init__(noisy=False)
        self.name = "alpine2-budget"
        self.description = (
            "Alpine2 with natural settings for idle nodes, at most "
            f"{max_interventions} interventions per round (issue 4's budget scenario)"
        )
        self.max_interventions = max_interventions

    def _settings(self, actions: np.ndarray) -> np.ndarray:
        """x = 10·a where intervened (a > 0), else the natural setting."""
        return 10.0 * np.where(actions > 0, actions, NATURAL)

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        settings = self._settings(self.action_vector(values)) / 10.0
        natural = dict(zip(self.action_names, settings.tolist(), strict=True))
        return super()._sample(natural, num, generator)

    def _mean_reward(self, actions: np.ndarray) -> np.ndarray:
        return -np.prod(_gain(self._settings(actions)), axis=-1)

    def _compute_optimum(self) -> Optimum:
        x_plus, g_plus = maximize_scalar(_gain, 0.0, 10.0)
        x_minus, g_minus = maximize_scalar(lambda x: -_gain(x), 0.0, 10.0)
        extremes = ((x_plus, g_plus), (x_minus, -g_minus))  # the best free factors, ±
        fixed = _gain(10.0 * NATURAL)
        best: tuple[float, dict[str, float]] = (float(-np.prod(fixed)), {})
        count = len(self.action_names)
        for size in range(1, self.max_interventions + 1):
            for support in itertools.combinations(range(count), size):
                rest = -np.prod(np.delete(fixed, support))
                for choice in itertools.product(extremes, repeat=size):
                    value = float(rest * np.prod([g for _, g in choice]))
                    if value > best[0]:
                        intervention = {
                            self.action_names[i]: x / 10.0
                            for i, (x, _) in zip(support, choice, strict=True)
                        }
                        best = (value, intervention)
        intervention = {name: best[1].get(name, 0.0) for name in self.action_names}
        return Optimum(intervention, self.expected_reward(intervention))
