"""What the composite policies (paper 002) share: Monte-Carlo samples of the reward g(field)
through the array nodes' Matheron samples.

For S fixed base samples, each array node's field model gives sample paths f_s(x) (Matheron's
rule, `core.gp.matheron`); each scalar node with a GP (a reward component, or a node between a
field and a component) is μ(z_s, a) + σ(z_s, a)·ε_s at its sampled parents z_s — a field parent
seen through its features (`core.field_features`, issue 15) — in the network's topological
order (`NetworkModel.rollout`); the reward sample is y_s(a) = g(components_s(a))
(`core.field_reward`). The paths are drawn once per proposal, so the sample average is a
deterministic, smooth function of the actions and BoTorch's multi-start L-BFGS-B applies
(sample-average approximation, the paper's Prop. 1). Before the samples are drawn, each field
model is refitted when its schedule says so (`refit_every`) — here, in the policy's worker
thread, never on the ingest path.

When g is −Σ r(f)² of an affine r of one array component (the shipped metrics,
`core.field_metrics.FIELD_RESIDUALS`), the field is never formed at a point: a Matheron path is
linear in K = n + 2 coefficients, f_s(a) = Σ_k γ_k(a) V_{s,k} (`FieldSamples.coefficients`,
`.basis`), so g_s(a) = −γ(a)ᵀ H_s γ(a) with H_s = U_s U_sᵀ, U_{s,k} = r(V_{s,k}) − r(0) (k ≥ 1),
U_{s,0} = r(V_{s,0}). H (S × K × K) is computed once per proposal — the output rotations and
g's reductions over the t outputs then happen once per path, not once per point and L-BFGS-B
step (issue 17: on the Brusselator's 8,192 outputs they were the whole decision). The same
numbers as the rollout up to rounding (tests/test_composite_fast.py).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field

from core.field_metrics import FieldResidual
from core.gp.field import FieldModelKind, FieldSamples
from core.network import NetworkModel, NodeQuery
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


def composite_field_settings(settings: CompositeSettings) -> tuple[FieldModelKind, int]:
    """The composite policies' `Policy.field_model_settings`: their own `field_model` and
    `fit_steps`."""
    return settings.field_model, settings.fit_steps


def check_composite_spec(spec: ExperimentSpec, name: str) -> None:
    """ValueError unless the reward is g over components among which are array nodes."""
    if not set(spec.array_nodes) & set(spec.reward.components):
        raise ValueError(f"{name}: needs a spec with array nodes (a `shape`) in the reward")


class CompositeProblem(Problem):
    """Reward samples y_s(a) for an acquisition over them (`acquisition`)."""

    def __init__(self, policy: SearchPolicy, model: NetworkModel, seed: int) -> None:
        super().__init__(policy, model, seed)
        settings: CompositeSettings = policy.settings  # type: ignore[assignment]
        assert model.field_reward is not None
        self.g = model.field_reward
        self.samples = settings.mc_samples
        self.fields = model.field_draws(
            settings.mc_samples, seed, settings.field_model, settings.fit_steps
        )
        self.refitted = self.fields.refitted
        self.upkeep_seconds = self.fields.fit_seconds  # kept out of the cap (`_search`)
        # Before a field has any reading there is nothing to fit: every point is alike (the
        # acquisition is flat, 0), as for the other policies' prior before data.
        self.blind = any(node not in self.fields.paths for node in model.array_shapes)
        normals = sobol_normals(
            settings.mc_samples, len(model.order), seed, dtype=self.dtype, device=self.device
        )
        self.normals = {node: normals[:, j, None] for j, node in enumerate(model.order)}
        self.best = model.best_reward if model.reward_count else None
        # g's quadratic form on the paths' basis (module docstring), when g allows it
        self.gram: tuple[str, torch.Tensor] | None = None
        if not self.blind and self.g.residual is not None and self.samples > 0:
            node, residual = self.g.residual
            self.gram = (node, residual_gram(self.fields.paths[node], residual))

    def reward_samples(self, actions: torch.Tensor) -> torch.Tensor:
        """(b, A) action vectors -> (S, b) reward samples; differentiable in the actions."""
        if self.gram is not None:  # None when blind (the rollout's zeros)
            node, gram = self.gram
            gamma = self.fields.paths[node].coefficients(self.model.field_inputs(node, actions))
            gamma = gamma.to(gram)
            # −γᵀ H_s γ for every sample s and point: (b, K) (S, K, K) -> (S, b); one batched
            # product (torch's einsum picked a bmm per (s, b) pair here, 10× slower)
            return -((gamma @ gram) * gamma).sum(-1).to(actions)
        return self.reward_samples_by_rollout(actions)

    def reward_samples_by_rollout(self, actions: torch.Tensor) -> torch.Tensor:
        """(b, A) -> (S, b) reward samples through the network's rollout (the fields formed at
        every point): what `reward_samples` computes, the reference for its quadratic form."""
        if self.blind:
            return actions.new_zeros(self.samples, actions.shape[0]) + 0.0 * actions.sum(-1)

        def sampler(query: NodeQuery) -> torch.Tensor:
            return query.mean + query.std * self.normals[query.node]

        batch = actions.unsqueeze(0)  # paths broadcast in: (1, b, A) -> (S, b) downstream
        values = self.model.rollout(batch, sampler, fields=self.fields)
        return values[self.model.reward_node].expand(self.samples, actions.shape[0])

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
        return {
            "best_f": self.best,
            "refitted": self.refitted,
            "field_fit_seconds": self.fields.fit_seconds,
            "quadratic_g": self.gram is not None,
        }


def residual_gram(
    paths: FieldSamples, residual: FieldResidual, chunk_elements: int = 1 << 23
) -> torch.Tensor:
    """(S, K, K) H_s = U_s U_sᵀ of g = −Σ r(f)² on the paths' basis (module docstring).

    The basis is formed `chunk_elements` numbers at a time (a few samples: S K t in all, 71 MB
    for the Brusselator's 64 paths at n = 15), so memory stays bounded as n grows.
    """
    shape = paths.model.shape
    t = math.prod(shape)
    step = max(1, chunk_elements // (paths.terms * t))
    zero = torch.zeros(shape, dtype=torch.float64, device=paths.model.mean.device)
    offset = residual(zero)  # r(0): the affine part
    grams = []
    for start in range(0, paths.draws.samples, step):
        basis = paths.basis(start, start + step)  # (s, K, *shape)
        u = residual(basis)  # (s, K, m)
        u[:, 1:] -= offset  # the linear part for the terms scaled by γ_k, k ≥ 1
        grams.append(u @ u.transpose(-1, -2))
    return torch.cat(grams)
