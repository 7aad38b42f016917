"""What the composite policies (paper 002) share: Monte-Carlo samples of the reward g(field)
through the array nodes' Matheron samples.

For S fixed base samples, each array node's field model gives sample paths f_s(x) (Matheron's
rule, `core.gp.matheron`); a scalar component fed only by actions is μ(a) + σ(a)·ε_s; the reward
sample is y_s(a) = g(components_s(a)) (`core.field_reward`). The paths are drawn once per
proposal, so the sample average is a deterministic, smooth function of the actions and BoTorch's
multi-start L-BFGS-B applies (sample-average approximation, the paper's Prop. 1). Before the
samples are drawn, each field model is refitted when its schedule says so (`refit_every`) — here,
in the policy's worker thread, never on the ingest path.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from core.gp.field import FieldSamples
from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies._optimize import sobol_normals
from policies._search import Problem, SearchPolicy, SearchSettings
from policies._supports import Region


class CompositeSettings(SearchSettings):
    """Settings of the composite policies (besides the shared search settings).

    Attributes:
        field_model: `hogp` (BoTorch's HigherOrderGP, the paper's EI-CF model) or `icm`
            (KroneckerMultiTaskGP over the flattened array).
        mc_samples: Matheron sample paths per proposal (paper: 64 on the PDE, 256 on the
            environmental model).
        fit_steps: L-BFGS-B iterations of a field model's refit.
    """

    field_model: Literal["hogp", "icm"] = "hogp"
    mc_samples: int = Field(default=64, ge=1, le=4096)
    fit_steps: int = Field(default=50, ge=1)


def check_composite_spec(spec: ExperimentSpec, name: str) -> None:
    """ValueError unless the reward is g over array nodes and action-fed scalar nodes."""
    if not spec.array_nodes:
        raise ValueError(f"{name}: needs a spec with array nodes (a `shape`) in the reward")
    for component in spec.reward.components:
        node = spec.node(component)
        if node.shape is None and node.parents:
            raise ValueError(
                f"{name}: the scalar reward component {component!r} has parents; composite "
                "policies take components fed by actions only"
            )


class CompositeProblem(Problem):
    """Reward samples y_s(a) for an acquisition over them (`acquisition`)."""

    def __init__(self, policy: SearchPolicy, model: NetworkModel, seed: int) -> None:
        super().__init__(policy, model, seed)
        settings: CompositeSettings = policy.settings  # type: ignore[assignment]
        assert model.field_reward is not None
        self.g = model.field_reward
        generator = torch.Generator().manual_seed(seed)
        self.paths: dict[str, FieldSamples] = {}
        self.refitted: list[str] = []
        self.samples = settings.mc_samples
        # Before a field has any reading there is nothing to fit: every point is alike (the
        # acquisition is flat, 0), as for the other policies' prior before data.
        self.blind = False
        for node in model.array_shapes:
            field = model.field_model(node, settings.field_model, settings.fit_steps)
            if field.n == 0:
                self.blind = True
                continue
            if model.refresh_field(node):
                self.refitted.append(node)
            self.paths[node] = field.samples(settings.mc_samples, generator)
        scalars = [c for c in self.g.components if c not in model.array_shapes]
        normals = sobol_normals(
            settings.mc_samples, len(scalars), seed, dtype=self.dtype, device=self.device
        )
        self.normals = {c: normals[:, i, None] for i, c in enumerate(scalars)}  # (S, 1)
        rewards = model.observed_rewards
        self.best = max(rewards) if rewards else None

    def reward_samples(self, actions: torch.Tensor) -> torch.Tensor:
        """(b, A) action vectors -> (S, b) reward samples; differentiable in the actions."""
        if self.blind:
            return actions.new_zeros(self.samples, actions.shape[0]) + 0.0 * actions.sum(-1)
        values: dict[str, torch.Tensor] = {}
        for node, paths in self.paths.items():
            values[node] = paths(self.model.field_inputs(node, actions))
        for node, eps in self.normals.items():
            inputs = self.model.node_inputs_at(node, actions, {})
            mean, std = self.model.node_posterior(node, inputs)
            values[node] = mean + std * eps
        return self.g(values)

    def acquisition(self, samples: torch.Tensor) -> torch.Tensor:
        """(S, b) reward samples -> (b,) acquisition values."""
        raise NotImplementedError

    def evaluate(self, region: Region, x: torch.Tensor) -> torch.Tensor:
        return self.acquisition(self.reward_samples(region.embed(x[:, : region.dim])))

    def evaluate_candidates(self, actions: torch.Tensor) -> torch.Tensor:
        return self.acquisition(self.reward_samples(actions))

    def mean_value(self, actions: torch.Tensor, set_actions: tuple[str, ...]) -> torch.Tensor:
        return self.reward_samples(actions).mean(0)

    def diagnostics(self) -> dict[str, Any]:
        return {"best_f": self.best, "refitted": self.refitted}
