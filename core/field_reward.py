"""g of a decomposed reward whose components include array nodes (paper 002's composite
objective): an expression over the components with array reductions, or a registered metric.

    expression:  y = g(f_1, ..., f_J)   arrays reduced by sum, mean, var, amax, amin
    function:    y = metric(f_1, ..., f_J)   (`core.field_metrics`)

Differentiable and batched: Monte-Carlo samples of a field (S, b, *shape) give rewards (S, b).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from core.expression import compile_expression
from core.field_metrics import FIELD_RESIDUALS, FieldResidual, field_metric
from core.spec import ExperimentSpec

__all__ = ["FieldReward"]


class FieldReward:
    """g of a decomposed reward over scalar and array components.

    Args:
        spec: a spec whose decomposed reward has aggregation `expression` or `function`.
    """

    def __init__(self, spec: ExperimentSpec) -> None:
        reward = spec.reward
        if reward.aggregation not in ("expression", "function"):
            raise ValueError(f"{spec.name}: a field reward is an expression or a function")
        self.components: list[str] = list(reward.components)
        arrays = spec.array_nodes
        self.shapes: dict[str, tuple[int, ...]] = {c: arrays.get(c, ()) for c in self.components}
        self._metric = field_metric(reward.function) if reward.aggregation == "function" else None
        # g = −Σ r(f)² of an affine r of one array component (`core.field_metrics`), or None
        self.residual: tuple[str, FieldResidual] | None = None
        if self._metric is not None and len(self.components) == 1:
            (only,) = self.components
            residual = FIELD_RESIDUALS.get(reward.function or "")
            if residual is not None and self.shapes[only]:
                self.residual = (only, residual)
        self._expression = (
            compile_expression(reward.expression or "", self.components, arrays=True)
            if self._metric is None
            else None
        )

    def __call__(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The reward (...) from each component: an array (..., *shape), a scalar (...)."""
        if self._metric is not None:
            return self._metric({c: values[c] for c in self.components})
        assert self._expression is not None
        flat = {}
        for name in self.components:
            value, shape = values[name], self.shapes[name]
            if shape:
                flat[name] = value.reshape(*value.shape[: value.dim() - len(shape)], -1)
            else:
                flat[name] = value.unsqueeze(-1)
        out = self._expression(flat)
        if out.shape[-1:] != (1,):
            raise ValueError(
                "the expression must reduce every array to one number (sum, mean, var, amax, amin)"
            )
        return out.squeeze(-1)

    def check(self) -> None:
        """Evaluate g on a batch of zero and one components; ValueError if it is not (2,)."""
        values = {
            name: torch.stack([torch.zeros(shape), torch.ones(shape)]).double()
            for name, shape in self.shapes.items()
        }
        out = self(values)
        if out.shape != (2,):
            raise ValueError(f"gives shape {tuple(out.shape)} for 2 samples, expected (2,)")
