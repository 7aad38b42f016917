"""D-GP-UCB (paper 003): GP-UCB on a reward decomposed into separately observed components.

Each component f_j has its own GP (a node of the network whose inputs are the actions). With
the posterior means μ_j and standard deviations σ_j at an action a:

  linear g (Alg. 3):   μ(a) = Σ_j w_j(a) μ_j(a),     σ²(a) = Σ_j w_j(a)² σ_j²(a)
  general g (Alg. 4):  μ(a) = g(μ_1(a), ..., μ_J(a)),  σ²(a) = J Σ_j B_j² σ_j²(a)

(Alg. 2 as printed squares the weights in the covariance; the proof of its Prop. 4 — and the
variance above — use w_j(x) k_j w_j(x'), as the digest notes.) The next action maximizes
μ + √β_t σ.

β_t. Paper 003's schedules, scaled down by `scale` (the paper divides by 5, following Srinivas
et al.): on a finite domain (candidates) β_t = 2 log(|X| t² π² / 6δ) (Thm 7), times J inside
the log for a general g (Thm 8); on a box of dimension d, β_t = 2 log(2 t² π² / 3δ)
+ 2 d log(t² d b r √log(4 d a / δ)) (its §2.6, with the Lipschitz constants a, b and the box
width r, which the paper leaves undefined, set to 1 on the unit-scaled box). `beta_mode:
constant` uses `beta` instead.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field

from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies._beta import paper_beta
from policies._optimize import Deadline
from policies._search import Problem, SearchPolicy, SearchSettings
from policies._supports import Region


class DGPUCBSettings(SearchSettings):
    """D-GP-UCB settings (plus the shared search settings).

    Attributes:
        beta_mode: "paper" (paper 003's β_t schedule) or "constant".
        beta: β for the constant mode (the UCB is μ + √β σ, as in the paper).
        delta: confidence parameter δ of the schedule.
        scale: factor on the paper's β_t (the paper uses 1/5 in its experiments).
    """

    beta_mode: Literal["paper", "constant"] = "paper"
    beta: float = Field(default=2.0, ge=0)
    delta: float = Field(default=0.05, gt=0, lt=1)
    scale: float = Field(default=0.2, gt=0)


class DGPUCBPolicy(SearchPolicy):
    """UCB of the composed reward from per-component GPs."""

    name = "dgpucb"
    Settings = DGPUCBSettings

    def __init__(self, spec: ExperimentSpec, settings: Any = None) -> None:
        super().__init__(spec, settings)
        reward = spec.reward
        if not reward.decomposed:
            raise ValueError(
                f"dgpucb: reward {reward.node!r} is not decomposed into components "
                "(reward.components); use gpucb or mcbo"
            )
        if spec.intervention != "soft":
            # do(f_j = v) leaves no action input to any component GP: the UCB would not
            # depend on the intervention at all (and its optimizer would have no gradient).
            raise ValueError(
                "dgpucb: D-GP-UCB models each component as a function of soft actions; "
                "hard interventions are not supported (use mcbo or eifn)"
            )
        fed = [c for c in reward.components if spec.node(c).parents]
        if fed:
            raise ValueError(
                f"dgpucb: components {fed} have parents; D-GP-UCB models each "
                "component as a function of the actions only"
            )

    def problem(self, model: NetworkModel, seed: int, deadline: Deadline) -> Problem:
        return _DecomposedUCB(self, model, seed)


class _DecomposedUCB(Problem):
    def __init__(self, policy: DGPUCBPolicy, model: NetworkModel, seed: int) -> None:
        super().__init__(policy, model, seed)
        g = model.reward_function
        assert g is not None
        self.g = g
        self.components = g.components
        self.bounds_sq = torch.tensor(g.derivative_bounds(), dtype=model.dtype).pow(2)
        self.beta = self._beta(policy.settings)

    def _beta(self, settings: DGPUCBSettings) -> float:
        if settings.beta_mode == "constant":
            return settings.beta
        spec = self.model.spec
        t = self.model.reward_count + 1
        raw = paper_beta(
            t,
            domain_size=None if spec.candidates is None else len(spec.candidates),
            dim=len(spec.actions),
            components=len(self.components),
            linear=self.g.linear,
            delta=settings.delta,
        )
        return settings.scale * raw

    def ucb(self, actions: torch.Tensor, beta: float) -> torch.Tensor:
        """(b, A) actions -> (b,) μ + √β σ of the composed reward."""
        mean, total_var = self.aggregate(actions)
        if beta == 0.0:
            return mean
        return mean + math.sqrt(beta) * total_var.clamp_min(1e-24).sqrt()

    def aggregate(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, A) actions -> (b,) mean μ and variance σ² of the composed reward (see above).

        For a nonlinear g the variance is the bound J Σ_j B_j² σ_j², not an exact variance.
        """
        means, variances = [], []
        for component in self.components:
            inputs = self.model.node_inputs_at(component, actions, {})
            mean, std = self.model.node_posterior(component, inputs)
            means.append(mean)
            variances.append(std.pow(2))
        mu, var = torch.stack(means, -1), torch.stack(variances, -1)
        named = {a: actions[..., i] for i, a in enumerate(self.model.action_names)}
        if self.g.linear:
            weights = self.g.weights(named, mu[..., 0])
            mean = (weights * mu).sum(-1)
            total_var = (weights.pow(2) * var).sum(-1)
        else:
            mean = self.g(mu)
            total_var = len(self.components) * (self.bounds_sq.to(var) * var).sum(-1)
        return mean, total_var

    def evaluate(self, region: Region, x: torch.Tensor) -> torch.Tensor:
        return self.ucb(region.embed(x[:, : region.dim]), self.beta)

    def evaluate_candidates(self, actions: torch.Tensor) -> torch.Tensor:
        return self.ucb(actions, self.beta)

    def mean_value(self, actions: torch.Tensor, set_actions: tuple[str, ...]) -> torch.Tensor:
        return self.ucb(actions, 0.0)

    def diagnostics(self) -> dict[str, Any]:
        return {"beta": self.beta}
