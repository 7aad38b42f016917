"""Composite UCB: an upper confidence bound of g(field) over Matheron sample paths, in
BoTorch's qUCB form (Wilson et al. 2017),

    UCB(a) = μ(a) + β · √(π/2) · (1/S) Σ_s |y_s(a) − μ(a)|,   μ(a) = (1/S) Σ_s y_s(a),

with y_s(a) = g(f_s(a)); for a Gaussian reward √(π/2)·E|y − μ| = σ, so β is a σ-multiplier
(MCBO's and `gpucb`'s meaning), without assuming g(field) is Gaussian.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from core.gp.field import FieldModelKind
from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies._composite import (
    CompositeProblem,
    CompositeSettings,
    check_composite_spec,
    composite_field_settings,
)
from policies._optimize import Deadline
from policies._search import Problem, SearchPolicy


class UCBCFSettings(CompositeSettings):
    """Composite UCB settings (besides the composite ones)."""

    beta: float = Field(
        default=1.0, ge=0, description="The σ-multiplier β of μ + β·√(π/2)·E|y − μ|."
    )


class UCBCFPolicy(SearchPolicy):
    """Upper confidence bound of g over sample paths of the fields."""

    name = "ucbcf"
    Settings = UCBCFSettings
    handles_arrays = True
    draws_fields = True
    handles_field_parents = True

    def __init__(self, spec: ExperimentSpec, settings: dict | None = None) -> None:
        super().__init__(spec, settings)
        check_composite_spec(spec, self.name)

    def field_model_settings(self) -> tuple[FieldModelKind, int]:
        return composite_field_settings(self.settings)  # type: ignore[arg-type]

    def problem(self, model: NetworkModel, seed: int, deadline: Deadline) -> Problem:
        return _UCBCFProblem(self, model, seed)


class _UCBCFProblem(CompositeProblem):
    def acquisition(self, samples: torch.Tensor) -> torch.Tensor:
        mean = samples.mean(0)
        spread = (samples - mean).abs().mean(0) * math.sqrt(math.pi / 2)
        return mean + self.settings.beta * spread  # type: ignore[attr-defined]
