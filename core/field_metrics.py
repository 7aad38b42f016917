"""Registered rewards of fields: Python functions g(field) too heavy or too specific for the
spec's expression language, named by `reward.function` (aggregation `function`).

Each metric takes the decomposed reward's components by name — an array component as a tensor
(..., *shape), a scalar one as (...) — and returns the reward (...), to be maximized;
differentiable, batched over the leading dims (Monte-Carlo samples, candidates). Metrics of a
paper's problem carry its constants (papers/digests/002.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

__all__ = [
    "FIELD_METRICS",
    "FIELD_RESIDUALS",
    "FieldMetric",
    "FieldResidual",
    "environmental_target",
    "field_metric",
]

FieldMetric = Callable[[Mapping[str, torch.Tensor]], torch.Tensor]
# An affine map r of one array component (..., *shape) -> (..., m) with metric(f) = −Σ r(f)²:
# for such a metric the reward of a sample path that is linear in some coefficients γ,
# f = Σ_k γ_k V_k, is the quadratic form −γᵀ (U Uᵀ) γ of U_k = r(V_k) − r(0) (k ≥ 1),
# U_0 = r(V_0) — what `policies._composite` uses instead of forming the field at every point.
FieldResidual = Callable[[torch.Tensor], torch.Tensor]

# Environmental model (Astudillo & Frazier; digest §3.5 and §6.19): the concentration
# c(s, t; M, D, L, τ) observed on the grid s ∈ {0, 1, 2.5}, t ∈ {15, 30, 45, 60}, and the target
# c at (M0, D0, L0, τ0) = (10, 0.07, 1.505, 30.1525).
ENVIRONMENTAL_S = (0.0, 1.0, 2.5)
ENVIRONMENTAL_T = (15.0, 30.0, 45.0, 60.0)
ENVIRONMENTAL_TARGET_INPUT = (10.0, 0.07, 1.505, 30.1525)


def environmental_concentration(params: torch.Tensor) -> torch.Tensor:
    """(..., 4) inputs (M, D, L, τ) -> (..., 3, 4) concentrations on the grid (s, t).

    c = M/√(4πDt) exp(−s²/(4Dt)) + 1{t > τ} M/√(4πD(t−τ)) exp(−(s−L)²/(4D(t−τ))).
    """
    s = torch.tensor(ENVIRONMENTAL_S, dtype=params.dtype, device=params.device)[:, None]
    t = torch.tensor(ENVIRONMENTAL_T, dtype=params.dtype, device=params.device)[None, :]
    m, d, spill, tau = (params[..., i, None, None] for i in range(4))
    first = m / torch.sqrt(4 * torch.pi * d * t) * torch.exp(-(s**2) / (4 * d * t))
    late = t - tau
    positive = late > 0
    safe = torch.where(positive, late, torch.ones_like(late))
    spread = 4 * d * safe
    second = m / torch.sqrt(torch.pi * spread) * torch.exp(-((s - spill) ** 2) / spread)
    return first + torch.where(positive, second, torch.zeros_like(second))


def environmental_target(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(3, 4) the target field: the concentrations at (M0, D0, L0, τ0)."""
    return environmental_concentration(torch.tensor(ENVIRONMENTAL_TARGET_INPUT, dtype=dtype))


def _environmental_sse(values: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """−Σ (field − target)² over the 3 × 4 grid of the one array component."""
    (field,) = values.values()
    target = environmental_target(field.dtype).to(field.device)
    return -((field - target) ** 2).sum(dim=(-2, -1))


def _environmental_residual(field: torch.Tensor) -> torch.Tensor:
    """(..., 3, 4) -> (..., 12) field − target: −Σ of its squares is `environmental_sse`."""
    target = environmental_target(field.dtype).to(field.device)
    return (field - target).flatten(-2)


def _border_weights(h: int, w: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(h, w) the Brusselator metric's weights: 1 on the two outer rows and columns, else 0.1."""
    weights = torch.full((h, w), 0.1, dtype=dtype, device=device)
    weights[:2, :] = weights[-2:, :] = 1.0
    weights[:, :2] = weights[:, -2:] = 1.0
    return weights


def _weighted_variance_residual(field: torch.Tensor) -> torch.Tensor:
    """(..., c, h, w) -> (..., c h w) (x − mean x)/√t of the weighted field x (t elements):
    −Σ of its squares is `weighted_variance` (the population variance)."""
    h, w = field.shape[-2:]
    flat = (field * _border_weights(h, w, field.dtype, field.device)).flatten(-3)
    return (flat - flat.mean(-1, keepdim=True)) / flat.shape[-1] ** 0.5


def _weighted_variance(values: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """−(weighted variance) of a (..., c, h, w) field (the Brusselator metric, digest §3.5 and
    §6.18): the first two and last two rows and columns weigh 1, the rest 0.1, as the authors'
    code; minimized in the paper, so its negative is the reward."""
    (field,) = values.values()
    h, w = field.shape[-2:]
    weighted = field * _border_weights(h, w, field.dtype, field.device)
    flat = weighted.reshape(*field.shape[:-3], -1)
    return -flat.var(dim=-1, unbiased=False)


FIELD_METRICS: dict[str, FieldMetric] = {
    "environmental_sse": _environmental_sse,
    "weighted_variance": _weighted_variance,
}
# the metrics that are −Σ r(f)² of an affine r of their one array component
FIELD_RESIDUALS: dict[str, FieldResidual] = {
    "environmental_sse": _environmental_residual,
    "weighted_variance": _weighted_variance_residual,
}


def field_metric(name: str) -> FieldMetric:
    """The registered metric `name`; KeyError listing the known ones."""
    try:
        return FIELD_METRICS[name]
    except KeyError:
        raise KeyError(f"unknown field metric {name!r}; known: {sorted(FIELD_METRICS)}") from None
