"""EI on the scalar metric: expected improvement of one GP from the actions to the reward
g(field) itself (`NetworkModel.flat_model`), ignoring the fields — paper 002's "EI on the
metric objective" baseline for composite BO. Analytic log EI (Ament et al. 2023, BoTorch's
`LogExpectedImprovement`) of the flat GP's latent posterior, best_f the largest reward observed.

(`ei` is paper 001's multi-fidelity EI; this is the single-fidelity baseline of paper 002.)
"""

from __future__ import annotations

import torch
from botorch.acquisition.analytic import _log_ei_helper

from core.network import NetworkModel
from policies._optimize import Deadline
from policies._search import Problem, SearchPolicy, SearchSettings
from policies._supports import Region


class EIMetricPolicy(SearchPolicy):
    """Expected improvement of a GP on the reward, blind to the graph and the fields."""

    name = "eimetric"
    Settings = SearchSettings
    handles_arrays = True
    handles_field_parents = True

    def problem(self, model: NetworkModel, seed: int, deadline: Deadline) -> Problem:
        return _EIMetricProblem(self, model, seed)


class _EIMetricProblem(Problem):
    baseline_is_zero = True

    def __init__(self, policy: SearchPolicy, model: NetworkModel, seed: int) -> None:
        super().__init__(policy, model, seed)
        self.gp = model.flat_model()
        self.best = model.best_reward if model.reward_count else None

    def log_ei(self, actions: torch.Tensor, set_actions: tuple[str, ...]) -> torch.Tensor:
        """(b, A) -> (b,) log EI of the flat GP (its mean before any reward is observed)."""
        x = self.model.flat_encode(actions, set_actions)
        post = self.gp.posterior(x.unsqueeze(0), members=[0])
        mean, std = post.mean[0], post.variance[0].clamp_min(1e-24).sqrt()
        if self.best is None:
            return mean
        return _log_ei_helper((mean - self.best) / std) + std.log()

    def evaluate(self, region: Region, x: torch.Tensor) -> torch.Tensor:
        return self.log_ei(region.embed(x[:, : region.dim]), region.set_actions)

    def evaluate_candidates(self, actions: torch.Tensor) -> torch.Tensor:
        return self.log_ei(actions, ())
