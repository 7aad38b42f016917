"""The known function g of a decomposed reward (paper 003), compiled from the spec.

    linear:      y = Σ_j w_j(a) f_j        (weights constant or expressions in the actions)
    expression:  y = g(f_1, ..., f_J)      (any whitelisted arithmetic, differentiable)

For D-GP-UCB's nonlinear variance bound σ² ≤ J Σ_j B_j² σ_j² the bounds B_j ≥ |∂g/∂f_j| come
from the spec, or are estimated here by autograd over a grid of the components' declared ranges.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch

from core.expression import compile_expression
from core.spec import ExperimentSpec

_GRID_POINTS = 9  # per component when estimating derivative bounds (9^J points, J small)
_GRID_LIMIT = 200_000


class RewardFunction:
    """g of a decomposed reward.

    Args:
        spec: a spec whose reward has components.
    """

    def __init__(self, spec: ExperimentSpec) -> None:
        reward = spec.reward
        if not reward.decomposed:
            raise ValueError(f"{spec.name}: the reward {reward.node!r} is not decomposed")
        self.spec = spec
        self.components: list[str] = list(reward.components)
        self.kind = reward.aggregation
        self._weights = [
            compile_expression(w, spec.action_names) if isinstance(w, str) else float(w)
            for w in (reward.weights or [])
        ]
        self._expression = (
            compile_expression(reward.expression, self.components)
            if reward.aggregation == "expression" and reward.expression
            else None
        )
        self._bounds = list(reward.derivative_bounds) if reward.derivative_bounds else None

    @property
    def linear(self) -> bool:
        return self.kind == "linear"

    def weights(self, actions: Mapping[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """(..., J) known weights g_j(a) of a linear reward, broadcast like `like` (...)."""
        if not self.linear:
            raise ValueError("weights exist only for a linear reward")
        columns = []
        for weight in self._weights:
            # a constant weight straight in `like`'s dtype: through torch's default float32 it
            # would be rounded (relative error ~6e-8), breaking D-GP-UCB's float64 algebra
            value = weight(actions) if callable(weight) else torch.tensor(weight, dtype=like.dtype)
            columns.append(value.to(like).expand_as(like))
        return torch.stack(columns, dim=-1)

    def __call__(
        self, components: torch.Tensor, actions: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """y from (..., J) component values (and the actions, for action-dependent weights)."""
        if self.linear:
            weights = self.weights(actions or {}, components[..., 0])
            return (weights * components).sum(-1)
        assert self._expression is not None
        named = {name: components[..., j] for j, name in enumerate(self.components)}
        return self._expression(named)

    def derivative_bounds(self) -> list[float]:
        """B_j ≥ |∂g/∂f_j|: from the spec, else the max over a grid of the component ranges."""
        if self._bounds is not None:
            return self._bounds
        ranges = [self.spec.node(name).bounds for name in self.components]
        if self.linear and all(not callable(w) for w in self._weights):
            self._bounds = [abs(float(w)) for w in self._weights]
            return self._bounds
        points = max(2, min(_GRID_POINTS, int(_GRID_LIMIT ** (1 / len(ranges)))))
        axes = [torch.linspace(low, high, points, dtype=torch.float64) for low, high in ranges]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(axes))
        grid.requires_grad_(True)
        actions = self._action_grid(grid.shape[0]) if self.linear else None
        (gradient,) = torch.autograd.grad(self(grid, actions).sum(), grid)
        self._bounds = gradient.abs().amax(0).tolist()
        return self._bounds

    def _action_grid(self, size: int) -> dict[str, torch.Tensor]:
        """Action values for x-dependent weights: the box's corners, then uniform draws."""
        bounds = torch.tensor([a.bounds for a in self.spec.actions], dtype=torch.float64)
        corners = torch.tensor(list(itertools.product(*bounds.tolist())), dtype=torch.float64)
        draws = torch.rand(
            size, len(bounds), generator=torch.Generator().manual_seed(0), dtype=torch.float64
        )
        picks = bounds[:, 0] + draws * (bounds[:, 1] - bounds[:, 0])
        picks[: min(size, len(corners))] = corners[:size]
        return {name: picks[:, k] for k, name in enumerate(self.spec.action_names)}
