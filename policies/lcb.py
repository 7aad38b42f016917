"""LCB (paper 001's baseline, GPyOpt's name for a minimizer's bound): the optimistic bound
μⁿ(θ, τ_max) + κ · σⁿ(θ, τ_max) of a maximizer, κ = 2, every trial at τ_max with q_max.
Multi-fidelity specs only; `gpucb` is the bound of a flat GP over any spec.
"""

from __future__ import annotations

import torch
from pydantic import Field

from policies._fidelity import FidelitySettings
from policies.ei import ExpectedImprovement

__all__ = ["ConfidenceBound"]


class LCBSettings(FidelitySettings):
    kappa: float = Field(default=2.0, ge=0, description="Width of the bound, κ.")


class ConfidenceBound(ExpectedImprovement):
    """The confidence bound at τ_max and q_max."""

    name = "lcb"
    Settings = LCBSettings

    def score(self, mean: torch.Tensor, std: torch.Tensor, best: float) -> torch.Tensor:
        return mean + self.settings.kappa * std
