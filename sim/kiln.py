"""A kiln (issue 15): a 16-probe temperature field that feeds a scalar node, the reward.

Two burners (soft actions `left`, `right` ∈ [0, 1]) heat a kiln; 16 probes along it report the
temperature field `temps` (an array node, shape [16]),

    T_i = 20 + 480 · (left · exp(−(s_i − 0.25)² / 0.05) + right · exp(−(s_i − 0.75)² / 0.05)),
    s_i = i / 15,

without noise. The product's `quality` (a scalar node, the reward) depends on the whole field
and on the dwell time (`dwell` ∈ [0, 1], a soft action on `quality`):

    quality = −mean(((T − 350) / 100)²) − 2 (dwell − (1 − mean(T) / 600))² + ε,  ε ~ N(0, 0.01²):

an even firing at 350° and a dwell that shortens as the kiln runs hotter. The field is a parent
of a scalar node, so the agent's model of `quality` takes the field (its 16 probes, flattened:
`core.field_features`) and `dwell` as inputs, and MCBO's and EI-FN's rollouts pass the field's
Matheron sample paths on to it.
"""

from __future__ import annotations

import torch

from sim.base import ActionInfo, Environment, Intervention, NodeInfo, Optimum
from sim.environmental import uniform_design

PROBES = 16
QUALITY_NOISE = 0.01
_POSITIONS = torch.linspace(0.0, 1.0, PROBES, dtype=torch.float64)
_BOUNDS = {"left": (0.0, 1.0), "right": (0.0, 1.0), "dwell": (0.0, 1.0)}
INITIAL_DESIGN = 5


def kiln_temperatures(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """(...) burner settings -> (..., 16) the probes' temperatures."""
    bump = lambda centre: torch.exp(-((_POSITIONS - centre) ** 2) / 0.05)  # noqa: E731
    return 20.0 + 480.0 * (left[..., None] * bump(0.25) + right[..., None] * bump(0.75))


def kiln_quality(temps: torch.Tensor, dwell: torch.Tensor) -> torch.Tensor:
    """(..., 16) field, (...) dwell -> (...) the noiseless quality."""
    evenness = (((temps - 350.0) / 100.0) ** 2).mean(-1)
    return -evenness - 2.0 * (dwell - (1.0 - temps.mean(-1) / 600.0)) ** 2


class Kiln(Environment):
    """The kiln as a device: burners → a 16-probe field → quality (with dwell)."""

    def __init__(
        self,
        name: str = "kiln",
        temps_bounds: tuple[float, float] = (0.0, 600.0),
        description: str = "A kiln: a 16-probe temperature field feeding the quality (issue 15)",
    ) -> None:
        """`name`, `temps_bounds` and `description` let a variant (sim.kiln_draft) keep the
        kiln's nodes and actions."""
        super().__init__(
            name=name,
            intervention_type="soft",
            nodes=(
                NodeInfo("temps", (), 0.0, temps_bounds, shape=(PROBES,)),
                NodeInfo("quality", ("temps",), QUALITY_NOISE, (-12.0, 0.0)),
            ),
            actions=(
                ActionInfo("left", ("temps",), _BOUNDS["left"], cost=1.0),
                ActionInfo("right", ("temps",), _BOUNDS["right"], cost=1.0),
                ActionInfo("dwell", ("quality",), _BOUNDS["dwell"], cost=1.0),
            ),
            reward_node="quality",
            description=description,
        )

    @staticmethod
    def _inputs(values: Intervention) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.tensor(float(values.get(name, 0.0)), dtype=torch.float64) for name in _BOUNDS
        )

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        left, right, dwell = self._inputs(values)
        temps = kiln_temperatures(left, right)
        noise = QUALITY_NOISE * torch.randn(num, generator=generator, dtype=torch.float64)
        return {
            "temps": temps.expand(num, PROBES).clone(),
            "quality": kiln_quality(temps, dwell) + noise,
        }

    def expected_reward(self, intervention: Intervention) -> float:
        left, right, dwell = self._inputs(self.validate(intervention))
        return float(kiln_quality(kiln_temperatures(left, right), dwell))

    def _compute_optimum(self) -> Optimum:
        """A 401 × 401 grid of the burners; the best dwell in closed form (clipped to [0, 1])."""
        grid = torch.linspace(0.0, 1.0, 401, dtype=torch.float64)
        left, right = torch.meshgrid(grid, grid, indexing="ij")
        temps = kiln_temperatures(left, right)
        dwell = (1.0 - temps.mean(-1) / 600.0).clamp(0.0, 1.0)
        quality = kiln_quality(temps, dwell)
        best = int(torch.argmax(quality))
        point = {
            "left": float(left.reshape(-1)[best]),
            "right": float(right.reshape(-1)[best]),
            "dwell": float(dwell.reshape(-1)[best]),
        }
        return Optimum(point, float(quality.reshape(-1)[best]))

    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """INITIAL_DESIGN uniform random inputs in the bounds, seeded."""
        return uniform_design(_BOUNDS, INITIAL_DESIGN, seed)
