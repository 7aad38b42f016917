"""The environmental model function (Bliznyuk et al. 2008; Astudillo & Frazier 2019), paper
002's first composite problem (§D.5): a chemical spill in a long, narrow channel.

Inputs (soft actions, the spill's unknown parameters to be calibrated): the mass M ∈ [7, 13],
the diffusion rate D ∈ [0.02, 0.12], the location of a second spill L ∈ [0.01, 3] and its time
τ ∈ [30.01, 30.295] (the digest's bounds). Output: the concentration on a 3 × 4 grid of
positions s ∈ {0, 1, 2.5} and times t ∈ {15, 30, 45, 60},

    c(s, t) = M/√(4πDt) exp(−s²/(4Dt)) + 1{t > τ} M/√(4πD(t−τ)) exp(−(s−L)²/(4D(t−τ))),

observed without noise. Reward: −Σ (c − c*)², c* the field at the true parameters
(M0, D0, L0, τ0) = (10, 0.07, 1.505, 30.1525) (authors' code, digest §6.19): 0 at the optimum.
Node `field` is the array, `score` the reward g(field) (`core.field_metrics.environmental_sse`).
"""

from __future__ import annotations

import torch

from core.field_metrics import (
    ENVIRONMENTAL_TARGET_INPUT,
    environmental_concentration,
    environmental_target,
)
from sim.base import ActionInfo, Environment, Intervention, NodeInfo, Optimum

_BOUNDS = {
    "M": (7.0, 13.0),
    "D": (0.02, 0.12),
    "L": (0.01, 3.0),
    "tau": (30.01, 30.295),
}
INITIAL_DESIGN = 5  # random rounds (the paper's count is not in the file; BoTorch's tutorial: 5)


class Environmental(Environment):
    """The environmental model as a device: actions (M, D, L, τ) → a 3 × 4 field."""

    def __init__(self) -> None:
        super().__init__(
            name="environmental",
            intervention_type="soft",
            nodes=(
                NodeInfo("field", (), 0.0, (0.0, 10.0), shape=(3, 4)),
                NodeInfo("score", ("field",), 0.0, (-114.0, 0.0)),
            ),
            actions=tuple(
                ActionInfo(name, ("field",), bounds, cost=1.0) for name, bounds in _BOUNDS.items()
            ),
            reward_node="score",
            reward_components=("field",),
            description="Environmental model function (paper 002, Astudillo & Frazier 2019)",
        )

    def _inputs(self, values: Intervention) -> torch.Tensor:
        return torch.tensor([float(values.get(n, 0.0)) for n in _BOUNDS], dtype=torch.float64)

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        field = environmental_concentration(self._inputs(values))
        score = -((field - environmental_target()) ** 2).sum()
        return {"field": field.expand(num, 3, 4).clone(), "score": score.expand(num).clone()}

    def expected_reward(self, intervention: Intervention) -> float:
        field = environmental_concentration(self._inputs(self.validate(intervention)))
        return float(-((field - environmental_target()) ** 2).sum())

    def _compute_optimum(self) -> Optimum:
        point = dict(zip(_BOUNDS, ENVIRONMENTAL_TARGET_INPUT, strict=True))
        return Optimum(point, 0.0)

    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """INITIAL_DESIGN uniform random inputs in the bounds, seeded."""
        return uniform_design(_BOUNDS, INITIAL_DESIGN, seed)


def uniform_design(
    bounds: dict[str, tuple[float, float]], count: int, seed: int
) -> list[dict[str, float]]:
    """`count` inputs drawn uniformly in the box `bounds` (name -> (low, high)), seeded; the
    random initial design of paper 002's problems."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.rand(count, len(bounds), generator=generator, dtype=torch.float64)
    return [
        {
            n: lo + float(u) * (hi - lo)
            for (n, (lo, hi)), u in zip(bounds.items(), draw, strict=True)
        }
        for draw in draws
    ]
