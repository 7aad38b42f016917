"""Synthetic additive functions on an Erdős–Rényi dependency graph (paper 000, Assumption 1).

The dependency graph over the D coordinates of θ ∈ [0, 1]^D is drawn from G(D, p_g); its maximal
cliques are the groups, and each group i carries an independent sample of a GP with a Matérn-5/2
kernel over its coordinates (lengthscale `LENGTHSCALE`, unit variance):

    v(θ) = Σ_i v_i(θ^(i)),   y = v(θ) + ε,  ε ~ N(0, σ²).

A GP sample is drawn by random Fourier features (Rahimi & Recht 2007) with `FEATURES` features:
Matérn-ν frequencies are Student-t with 2ν degrees of freedom scaled by 1/ℓ, so v_i(x) =
√(2/m) Σ_j w_j cos(ω_jᵀx + b_j), w ~ N(0, 1), b ~ U(0, 2π) has the Matérn-5/2 covariance up to
the features' Monte-Carlo error. The seed draws the samples (a new task per
seed, on the graph of its D); the true edges are known, so structure learning is scored
(`dependency_edges`).

The optimum is searched by multi-start L-BFGS-B on the noiseless v (it is not certified global;
the oracle's optimum is the best point found, so a policy could in principle beat it by a
hair and show a negative regret).
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import torch
from scipy.optimize import minimize

from sim.base import ActionInfo, Environment, NodeInfo, Optimum

__all__ = ["DIMENSIONS", "AdditiveER"]

DIMENSIONS = (20, 50, 100)
EDGE_DEGREE = 1.5  # p_g = 1.5 / (D − 1): mean degree 1.5, cliques of 1–3 coordinates mostly
LENGTHSCALE = 0.25
FEATURES = 256
NOISE_STD = 0.1
_DTYPE = torch.float64
_STARTS = 6


class AdditiveER(Environment):
    """v(θ) = Σ_cliques v_i(θ^(i)) on a G(D, p_g) graph, θ = `theta.0` … `theta.{D-1}` ∈ [0, 1]."""

    def __init__(self, dim: int, seed: int = 0) -> None:
        self.dim, self.seed = dim, seed
        # The graph depends on D only (so a given decomposition, `addgpucb`'s ablation, can be
        # written into a spec); the seed draws the functions on its cliques.
        graph = nx.gnp_random_graph(dim, EDGE_DEGREE / max(dim - 1, 1), seed=dim)
        rng = np.random.default_rng([dim, seed])
        self.dependency_edges: tuple[tuple[int, int], ...] = tuple(
            sorted((min(a, b), max(a, b)) for a, b in graph.edges)
        )
        self.groups: tuple[tuple[int, ...], ...] = tuple(
            sorted(tuple(sorted(c)) for c in nx.find_cliques(graph))
        )
        self._features = [self._draw(len(group), rng) for group in self.groups]
        self._stack_features()
        spread = round(3.0 * math.sqrt(len(self.groups)), 1)  # 3 prior std of the sum
        super().__init__(
            name=f"additive-er-{dim}",
            intervention_type="soft",
            nodes=(
                NodeInfo(
                    "R",
                    (),
                    NOISE_STD,
                    (-spread, spread),
                ),
            ),
            actions=tuple(
                ActionInfo(f"theta.{i}", ("R",), (0.0, 1.0), cost=0.0) for i in range(dim)
            ),
            reward_node="R",
            description=f"additive GP sample over the maximal cliques of an Erdős–Rényi graph, "
            f"D = {dim} (paper 000, Assumption 1)",
        )

    @staticmethod
    def _draw(
        width: int, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Random Fourier features of a unit-variance Matérn-5/2 GP on `width` coordinates."""
        nu = 2.5
        normal = rng.standard_normal((FEATURES, width))
        chi2 = rng.chisquare(2 * nu, size=(FEATURES, 1))
        omega = normal * np.sqrt(2 * nu / chi2) / LENGTHSCALE
        phase = rng.uniform(0.0, 2.0 * math.pi, FEATURES)
        weight = rng.standard_normal(FEATURES) * math.sqrt(2.0 / FEATURES)
        return (
            torch.tensor(omega, dtype=_DTYPE),
            torch.tensor(phase, dtype=_DTYPE),
            torch.tensor(weight, dtype=_DTYPE),
        )

    def _stack_features(self) -> None:
        """All groups' features padded to one width, so v is evaluated in one batched call."""
        width = max(len(g) for g in self.groups)
        count = len(self.groups)
        self._index = torch.full((count, width), self.dim, dtype=torch.long)  # pad: a zero column
        self._omega = torch.zeros(count, FEATURES, width, dtype=_DTYPE)
        for i, (group, (omega, _, _)) in enumerate(zip(self.groups, self._features, strict=True)):
            self._index[i, : len(group)] = torch.tensor(group)
            self._omega[i, :, : len(group)] = omega
        self._phase = torch.stack([phase for _, phase, _ in self._features])  # (M, F)
        self._weight = torch.stack([weight for _, _, weight in self._features])  # (M, F)

    # ----------------------------------------------------------------- the function
    def value(self, theta: torch.Tensor) -> torch.Tensor:
        """Noiseless v at θ (..., D) in [0, 1]^D -> (...); differentiable."""
        padded = torch.cat([theta, theta.new_zeros(*theta.shape[:-1], 1)], dim=-1)
        x = padded[..., self._index]  # (..., M, s)
        angles = torch.einsum("...ms,mfs->...mf", x, self._omega) + self._phase
        return (torch.cos(angles) * self._weight).sum((-1, -2))

    def _theta(self, values: dict[str, float]) -> torch.Tensor:
        return torch.tensor([values.get(f"theta.{i}", 0.0) for i in range(self.dim)], dtype=_DTYPE)

    def cost(self, intervention) -> float:
        """One episode costs 1, as the spec's `parameters.cost`."""
        return 1.0 if intervention else 0.0

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        mean = self.value(self._theta(values))
        noise = torch.randn(num, generator=generator, dtype=_DTYPE) * NOISE_STD
        return {"R": mean + noise}

    def expected_reward(self, intervention) -> float:
        return float(self.value(self._theta(self.validate(intervention))))

    def _compute_optimum(self) -> Optimum:
        rng = np.random.default_rng([self.dim, self.seed, 1])

        index, omega = self._index.numpy(), self._omega.numpy()
        phase, weight = self._phase.numpy(), self._weight.numpy()

        def negative(x: np.ndarray) -> tuple[float, np.ndarray]:
            """−v and its gradient in numpy (the optimizer calls it hundreds of times)."""
            padded = np.append(x, 0.0)
            angles = np.einsum("ms,mfs->mf", padded[index], omega) + phase
            slope = -np.einsum("mf,mfs->ms", np.sin(angles) * weight, omega)
            grad = np.zeros(self.dim + 1)
            np.add.at(grad, index, slope)
            return -float((np.cos(angles) * weight).sum()), -grad[:-1]

        # Cliques that share no coordinate are independent: start every clique's coordinates
        # at its own best of many random draws, then polish the whole vector jointly.
        best_x, best_value = None, -math.inf
        for start in range(_STARTS):
            x0 = rng.uniform(0.0, 1.0, self.dim) if start else self._clique_wise_start(rng)
            result = minimize(
                negative, x0, jac=True, method="L-BFGS-B", bounds=[(0.0, 1.0)] * self.dim
            )
            if -result.fun > best_value:
                best_x, best_value = result.x, float(-result.fun)
        assert best_x is not None
        return Optimum({f"theta.{i}": float(v) for i, v in enumerate(best_x)}, best_value)

    def _clique_wise_start(self, rng: np.random.Generator) -> np.ndarray:
        x = rng.uniform(0.0, 1.0, self.dim)
        draws = torch.tensor(rng.uniform(0.0, 1.0, (2048, self.dim)), dtype=_DTYPE)
        for group, (omega, phase, weight) in zip(self.groups, self._features, strict=True):
            part = draws[:, list(group)]
            best = int((torch.cos(part @ omega.T + phase) @ weight).argmax())
            x[list(group)] = part[best].numpy()  # later overlapping cliques overwrite: a start
        return x

    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """Two uniform random points, the same for every policy of a seed."""
        g = torch.Generator().manual_seed(seed)
        draws = torch.rand(2, self.dim, generator=g, dtype=_DTYPE)
        return [{f"theta.{i}": float(v) for i, v in enumerate(row)} for row in draws]
