"""A drafty kiln (issue 15): the field carries information the actions do not.

The kiln of `sim.kiln` (burners `left`, `right` → a 16-probe field `temps` → `quality`, with
`dwell`), plus a draft the agent cannot see or set: each round a cold draft of strength
d ~ U(0, 1), drawn afresh, enters at the kiln's left door and cools the field,

    T_i = kiln_i(left, right) − 150 · d · exp(−3 s_i),     s_i = i / 15,

and `quality` is the kiln's function of the field actually reached (and `dwell`). The probes see
the draft; the actions do not. A flat GP of the reward over the actions (GP-UCB) sees the draft
as reward noise of up to about ±1 (its size depends on the actions: heteroscedastic), while a
network model learns `quality` from the field it was reached with — nearly noiseless (0.01) —
and the field from the burners, with the draft as the field's noise.

The draft enters the field additively and its law does not depend on the actions, so the
expected reward is the reward at the mean field plus a constant (quality is quadratic in the
field): the same maximizer for a model that optimizes the reward at its mean field (MCBO's
and EI-FN's rollouts pass sample paths of the *latent* field on) as for E[y | a].

The oracle E[y | a] = E_d[quality] is exact: quality is quadratic in d, and the two-point
Gauss–Legendre rule on [0, 1] integrates cubics exactly.
"""

from __future__ import annotations

import math

import torch

from sim.base import Intervention, Optimum
from sim.kiln import PROBES, QUALITY_NOISE, Kiln, kiln_quality, kiln_temperatures

DRAFT = 150.0  # the draft's cooling at the door (°) for d = 1
_POSITIONS = torch.linspace(0.0, 1.0, PROBES, dtype=torch.float64)
_PROFILE = torch.exp(-3.0 * _POSITIONS)  # (16,) how far into the kiln the draft reaches
# two-point Gauss–Legendre on [0, 1]: exact for the cubic (here quadratic) in d
_NODES = torch.tensor([0.5 - 0.5 / math.sqrt(3.0), 0.5 + 0.5 / math.sqrt(3.0)], dtype=torch.float64)


def drafty_temperatures(
    left: torch.Tensor, right: torch.Tensor, draft: torch.Tensor
) -> torch.Tensor:
    """(...) burners and draft d ∈ [0, 1] -> (..., 16) the probes' temperatures."""
    return kiln_temperatures(left, right) - DRAFT * draft[..., None] * _PROFILE


def expected_quality(left: torch.Tensor, right: torch.Tensor, dwell: torch.Tensor) -> torch.Tensor:
    """(...) -> (...) E_d[quality] over the draft d ~ U(0, 1) (exact: see the module)."""
    draws = [
        kiln_quality(drafty_temperatures(left, right, torch.full_like(left, float(d))), dwell)
        for d in _NODES
    ]
    return 0.5 * (draws[0] + draws[1])


class KilnDraft(Kiln):
    """The kiln with an unobserved draft that only the field reveals."""

    def __init__(self) -> None:
        super().__init__(
            name="kiln-draft",
            temps_bounds=(-DRAFT, 600.0),
            description="A drafty kiln: an unseen draft that only the field reveals (issue 15)",
        )

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        left, right, dwell = self._inputs(values)
        draft = torch.rand(num, generator=generator, dtype=torch.float64)  # one per sample
        temps = drafty_temperatures(left.expand(num), right.expand(num), draft)
        noise = QUALITY_NOISE * torch.randn(num, generator=generator, dtype=torch.float64)
        return {"temps": temps, "quality": kiln_quality(temps, dwell) + noise}

    def expected_reward(self, intervention: Intervention) -> float:
        left, right, dwell = self._inputs(self.validate(intervention))
        return float(expected_quality(left, right, dwell))

    def _compute_optimum(self) -> Optimum:
        """A 401 × 401 grid of the burners; the best dwell in closed form: quality's dwell
        term −2 (dwell − c(d))² has its expectation's maximum at E[c(d)] (clipped to [0, 1])."""
        grid = torch.linspace(0.0, 1.0, 401, dtype=torch.float64)
        left, right = torch.meshgrid(grid, grid, indexing="ij")
        means = [
            drafty_temperatures(left, right, torch.full_like(left, float(d))).mean(-1)
            for d in _NODES
        ]
        dwell = (1.0 - 0.5 * (means[0] + means[1]) / 600.0).clamp(0.0, 1.0)
        quality = expected_quality(left, right, dwell)
        best = int(torch.argmax(quality))
        point = {
            "left": float(left.reshape(-1)[best]),
            "right": float(right.reshape(-1)[best]),
            "dwell": float(dwell.reshape(-1)[best]),
        }
        return Optimum(point, float(quality.reshape(-1)[best]))
