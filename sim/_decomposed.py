"""Shared machinery of paper 003's environments (decomposed feedback, reward = g(components)).

Every environment of paper 003 has the same shape in our framework:

  - J component nodes f_1..f_J with no parent nodes; every action feeds every component (soft
    interventions: the actions are the inputs x of the components). A reading of component j is
    y_j = f_j(x) + ε_j, ε_j ~ N(0, σ_j²), independent across components and rounds.
  - one reward node whose parents are the components, noise_std 0, whose value in a sample is
    the known function g of the *noisy* component readings — the paper's "composed reward"
    y = g(y_1, ..., y_J).
  - the oracle `expected_reward(a)` returns the noiseless objective f(x) = g(f_1(x), ..., f_J(x)),
    the quantity on which the paper defines regret (r_t = f(x*) - f(x_t)). For a linear g this is
    also E[y | x]; for a nonlinear g (weather) E[g(noisy)] differs from g(E[noisy]) by a Jensen
    gap of the order of the noise, and the regret is still measured on f.

`DecomposedEnvironment` implements sampling, the oracle and (for finite candidate sets) the
optimum and the initial design on top of two methods per environment: `expected_components`
(the noiseless f_j) and `compose_reward` (g).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, Literal

import numpy as np
import torch

from sim.base import Environment, Intervention, Optimum

DTYPE = torch.float64


class DecomposedEnvironment(Environment):
    """An `Environment` whose reward node is a known function g of noisy component nodes.

    Subclasses call `Environment.__init__` with their structure, set `_noise_std` ((J,) float64
    tensor of the component noise stds) and `n_initial`, and implement `expected_components`,
    `compose_reward`, and (for continuous domains) `_compute_optimum` and `initial_design`.
    """

    # "linear": g(f)(x) = Σ_j g_j(x) f_j, the subclass provides `reward_weights`.
    # "general": any known differentiable g; use `compose_reward` and `reward_derivative_bounds`.
    reward_kind: ClassVar[Literal["linear", "general"]]
    _noise_std: torch.Tensor
    n_initial: int

    # ----------------------------------------------------------------- to implement
    @abstractmethod
    def expected_components(self, x: torch.Tensor) -> torch.Tensor:
        """Noiseless components f_j(x).

        Args:
            x: (..., A) float64 actions in `actions` order.

        Returns:
            (..., J) float64, in `reward_components` order.
        """

    @abstractmethod
    def compose_reward(self, components: torch.Tensor) -> torch.Tensor:
        """The known function g: (..., J) components -> (...) reward; torch-differentiable."""

    # ----------------------------------------------------------------- decomposition
    @property
    def num_components(self) -> int:
        return len(self.reward_components)

    @property
    def component_noise_std(self) -> torch.Tensor:
        """(J,) float64 noise std of each component reading (as in the component NodeInfo)."""
        return self._noise_std.clone()

    def reward_derivative_bounds(self) -> list[float]:
        """B_j = max |∂g/∂f_j| over the component data range (the node bounds box), one per j.

        The default evaluates the autograd gradient of `compose_reward` on a regular grid of
        the box spanned by the component nodes' bounds (corners included); linear subclasses
        override it with the exact max |g_j|.
        """
        lows = [self._node(n).bounds[0] for n in self.reward_components]
        highs = [self._node(n).bounds[1] for n in self.reward_components]
        return derivative_bounds(self.compose_reward, lows, highs)

    def _node(self, name: str):
        return self.nodes[self._node_index[name]]

    # ----------------------------------------------------------------- actions
    def action_tensor(self, intervention: Intervention) -> torch.Tensor:
        """(A,) float64 action vector in `actions` order; a missing action is 0 (soft)."""
        return torch.tensor(
            [float(intervention.get(name, 0.0)) for name in self.action_names], dtype=DTYPE
        )

    def intervention_of(self, x: torch.Tensor | Sequence[float]) -> dict[str, float]:
        """Inverse of `action_tensor`: (A,) values -> {action name: value}."""
        values = torch.as_tensor(x, dtype=DTYPE).reshape(-1)
        return {name: float(v) for name, v in zip(self.action_names, values, strict=True)}

    # ----------------------------------------------------------------- dynamics
    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        mean = self.expected_components(self.action_tensor(values))  # (J,)
        noise = torch.randn(num, self.num_components, generator=generator, dtype=DTYPE)
        components = mean + noise * self._noise_std
        reward = self.compose_reward(components)
        out = {name: components[:, j] for j, name in enumerate(self.reward_components)}
        out[self.reward_node] = reward
        return out

    def expected_reward(self, intervention: Intervention) -> float:
        """The noiseless objective f(x) = g(f_1(x), ..., f_J(x)) of paper 003 (regret is on f).

        For a linear g this equals E[y | x]; for a nonlinear g it is g of the expected
        components, not the expectation of g of the noisy readings.
        """
        x = self.action_tensor(self.validate(intervention))
        return float(self.compose_reward(self.expected_components(x)))

    # ----------------------------------------------------------------- finite domains
    def candidate_index(self, x: torch.Tensor) -> torch.Tensor:
        """Index of the candidate each action row equals: (..., A) -> (...) long.

        Raises:
            ValueError: if a row is not one of the candidates (relative gap > 1e-9).
        """
        if self.candidates is None:
            raise ValueError(f"{self.name}: no finite candidate set")
        span = torch.tensor([a.bounds[1] - a.bounds[0] for a in self.actions], dtype=DTYPE)
        flat = x.to(DTYPE).reshape(-1, len(self.actions))
        gaps = ((flat[:, None, :] - self.candidates[None]).abs() / span).amax(-1)  # (n, N)
        gap, index = gaps.min(-1)
        if bool((gap > 1e-9).any()):
            raise ValueError(f"{self.name}: action rows are not admissible candidates")
        return index.reshape(x.shape[:-1])

    def _discrete_optimum(self, candidate_components: torch.Tensor) -> Optimum:
        values = self.compose_reward(candidate_components)
        best = self.intervention_of(self.candidates[int(values.argmax())])
        # The value through the oracle itself, so that regret at the optimum is exactly 0: the
        # batched sum above may round differently from the oracle's in the last bit.
        return Optimum(best, self.expected_reward(best))

    def _candidate_design(self, seed: int) -> list[dict[str, float]]:
        """`n_initial` distinct candidates drawn uniformly at random (numpy PCG64, `seed`)."""
        rng = np.random.default_rng(seed)
        picks = rng.choice(len(self.candidates), size=self.n_initial, replace=False)
        return [self.intervention_of(self.candidates[int(i)]) for i in picks]


def derivative_bounds(
    compose: Callable[[torch.Tensor], torch.Tensor],
    lows: Sequence[float],
    highs: Sequence[float],
    points_per_dim: int = 21,
) -> list[float]:
    """max over a regular grid of the box [lows, highs] of |∂compose/∂c_j|, one float per j.

    The grid has `points_per_dim` points per component (corners included), evaluated in one
    batched autograd call; fine enough for the smooth, monotone-in-each-argument g of paper 003.
    """
    axes = [
        torch.linspace(lo, hi, points_per_dim, dtype=DTYPE)
        for lo, hi in zip(lows, highs, strict=True)
    ]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(axes))
    grid.requires_grad_(True)
    (grad,) = torch.autograd.grad(compose(grid).sum(), grid)
    return [float(v) for v in grad.abs().amax(0)]


def padded_range(values: torch.Tensor, noise_std: float, rel: float = 0.05) -> tuple[float, float]:
    """(low, high) of `values` widened by 3 noise stds and `rel` of the span on each side."""
    low, high = float(values.min()), float(values.max())
    pad = 3.0 * noise_std + rel * (high - low)
    return (low - pad, high + pad)
