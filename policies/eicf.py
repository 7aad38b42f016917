"""EI-CF: expected improvement of a composite reward g(field) (Astudillo & Frazier 2019;
paper 002 §D.5 with a HOGP), over Matheron sample paths of the array nodes:

    EI(a) = (1/S) Σ_s max(g(f_s(a)) − best_f, 0),     best_f = the largest reward observed,

optimized as log EI with BoTorch's fat-tailed softplus (as `eifn`, so that points far from the
incumbent still have a gradient). Before any reward is observed, the sampled mean of the reward.
Compare `eimetric` (EI of a GP on g(field) itself, the paper's baseline).
"""

from __future__ import annotations

import torch
from botorch.utils.safe_math import log_fatplus, logmeanexp

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

TAU_RELU = 1e-6  # BoTorch's qLogEI temperature, in units of the observed rewards' spread


class EICFPolicy(SearchPolicy):
    """Expected improvement of g over sample paths of the fields."""

    name = "eicf"
    Settings = CompositeSettings
    handles_arrays = True
    handles_field_parents = True
    draws_fields = True

    def __init__(self, spec: ExperimentSpec, settings: dict | None = None) -> None:
        super().__init__(spec, settings)
        check_composite_spec(spec, self.name)

    def field_model_settings(self) -> tuple[FieldModelKind, int]:
        return composite_field_settings(self.settings)  # type: ignore[arg-type]

    def problem(self, model: NetworkModel, seed: int, deadline: Deadline) -> Problem:
        return _EICFProblem(self, model, seed)


class _EICFProblem(CompositeProblem):
    baseline_is_zero = True

    def __init__(self, policy: SearchPolicy, model: NetworkModel, seed: int) -> None:
        super().__init__(policy, model, seed)
        rewards = torch.tensor(model.observed_rewards, dtype=torch.float64)
        spread = float(rewards.std()) if len(rewards) > 1 else 1.0
        self.tau = TAU_RELU * (spread if spread > 0 else 1.0)

    def acquisition(self, samples: torch.Tensor) -> torch.Tensor:
        if self.best is None:
            return samples.mean(0)
        return logmeanexp(log_fatplus(samples - self.best, tau=self.tau), dim=0)
