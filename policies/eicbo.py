"""EICBO: Causal Bayesian Optimization (Aglietti et al. 2020; paper 004's CBO baseline).

Hard interventions on a known DAG. For every target set I (a set of actions, each setting one
node) EICBO keeps its own GP of the reward as a function of the do-values x_I, with a *causal
prior* estimated from observational data by do-calculus:

    f_I ~ GP(m_I, k_θ + σ̂_I σ̂_Iᵀ),   m_I(x) = Ê[Y | do(X_I = x)],  σ̂_I²(x) = V̂[Y | do(X_I = x)]

and picks the target set and values with the largest expected improvement over the best reward
observed under any intervention. A set's GP learns only from the rounds that intervened on
exactly that set: unlike MCBO and EI-FN it cannot reuse data across target sets.

Do-calculus on a known DAG with every node observed and no hidden confounder reduces to the
truncated factorization: E[Y | do(X_I = x)] = ∫ E[Y | pa_Y] Π_{i ∉ I} p(x_i | pa_i) dx. The
conditionals p(x_i | pa_i) are estimated, as Aglietti et al. fit them, by one GP per node on the
*observational* rounds only (`ObservationalModel`: a `NetworkModel` fed the rounds with no
intervention). Samples go through the cut graph in topological order — node i drawn as
μ_i + √(σ_i² + ρ_i²)·ε at its sampled parents (σ_i the latent std, ρ_i the known noise) —
over `mc_samples` fixed scrambled-Sobol draws, so m_I and σ̂_I are smooth functions of x:

    m_I(x)  = (1/S) Σ_s μ_Y(z_s),        σ̂_I²(x) = (1/S) Σ_s σ_Y²(z_s)

(the mean over the ancestors' spread of Y's GP mean, and of its latent variance: Aglietti's
mean and variance of the do-effect computed from the fitted observational GPs). Before any
observational round the prior is m = 0, σ̂ = 0 and EICBO is EI with one plain GP per set.

k_θ (the spec's kernel, on x_I scaled to the unit cube by the action bounds) is fit by MAP with
the spec's priors (`core.hyperfit`) on the residuals y − m_I(x) of the set's rounds, once it has
`min_fit_points` of them; before that it has the prior's mode as lengthscale (1/3 on the unit
cube) and the variance of the observed rewards as output scale. The observation noise is the
reward node's known (or learned) noise: our environments return one noisy reading per round,
whereas paper 004 gave EICBO noiseless interventional outcomes (digest §4).

Acquisition: EI(x) = E[(f_I(x) − y*)⁺] with y* the best reward read under an intervention (all
rewards before any), optimized as log EI (BoTorch's `_log_ei_helper`: finite gradients where EI
underflows; plain EI in cost-aware mode, which divides it by a cost) over each target set's box
by the shared multi-start L-BFGS-B. The empty target set is never proposed (EICBO's
observational rounds are the initial design's; Aglietti's ε-greedy observe/intervene rule is not
implemented). Other differences from the original code: no cost division unless `cost_aware`,
MAP instead of GPy's maximum likelihood.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from botorch.acquisition.analytic import _log_ei_helper
from pydantic import Field

from core.hyperfit import fit_hyperparameters
from core.kernels import kernel_matrix
from core.network import NetworkModel, NodeQuery
from core.spec import ExperimentSpec
from policies._optimize import Deadline, sobol_normals
from policies._search import Problem, Scorer, SearchPolicy, SearchSettings, Solution
from policies._supports import Region
from policies.base import Constraints, Proposal

_PRIOR_LENGTHSCALE = 1.0 / 3.0  # mode of the Gamma(3, 6) lengthscale prior (unit cube)
_MIN_STD = 1e-9  # output units: keeps log EI and its gradient finite at a training point
_JITTER = 1e-8  # relative diagonal jitter of a set's Gram matrix


class EICBOSettings(SearchSettings):
    """EICBO settings (the shared search settings in `policies._search.SearchSettings`).

    Attributes:
        mc_samples: scrambled-Sobol draws of the do-calculus estimate of m_I and σ̂_I.
        min_fit_points: a set's kernel hyperparameters are fit once it has this many rounds.
        warm_starts: 0 — last round's best point has just been sampled, so its EI is ≈ 0.
    """

    mc_samples: int = Field(default=64, ge=1)
    min_fit_points: int = Field(default=3, ge=1)
    warm_starts: int = Field(default=0, ge=0)


class EICBOPolicy(SearchPolicy):
    """Causal BO: one GP per target set with a do-calculus prior, EI across the sets."""

    name = "eicbo"
    Settings = EICBOSettings

    def __init__(self, spec: ExperimentSpec, settings: dict[str, Any] | None = None) -> None:
        super().__init__(spec, settings)
        if spec.intervention != "hard":
            raise ValueError(
                f"eicbo: needs hard interventions (intervention: hard); {spec.name} has soft ones"
            )
        self._observational: ObservationalModel | None = None

    def observational(self, model: NetworkModel) -> ObservationalModel:
        """The node GPs of the observational rounds, rebuilt when new ones have arrived."""
        rounds = observational_rounds(model)
        cached = self._observational
        if cached is None or cached.source is not model or cached.rounds != len(rounds):
            self._observational = ObservationalModel.build(model, rounds)
        return self._observational

    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        self.observational(model)  # refit outside the search's time cap (rarely: cached)
        return super().propose(model, constraints, rng)

    def problem(self, model: NetworkModel, seed: int, deadline: Deadline) -> Problem:
        return _EICBOProblem(self, model, seed)

    def _search(
        self,
        problem: Problem,
        regions: list[Region],
        scorer: Scorer,
        deadline: Deadline,
        rng: torch.Generator,
    ) -> tuple[tuple[Region, Solution], int, bool]:
        # The empty target set is never proposed; searched first, it could be all a cut-short
        # search returns.
        acting = [region for region in regions if region.actions] or regions
        return super()._search(problem, acting, scorer, deadline, rng)


def observational_rounds(model: NetworkModel) -> list[dict[str, float]]:
    """Readings of the rounds with no intervention and a reward reading, in order."""
    return [
        dict(r.readings)
        for r in model.history
        if not r.intervention and model.reward_node in r.readings
    ]


@dataclass
class ObservationalModel:
    """A `NetworkModel` of the same spec that learned only the observational rounds.

    Attributes:
        source: the agent's model it was built from (a rebuild is due when it changes).
        rounds: how many observational rounds it learned.
        network: the node GPs, hyperparameters fit once on all of them.
    """

    source: NetworkModel
    rounds: int
    network: NetworkModel

    @classmethod
    def build(cls, model: NetworkModel, rounds: list[dict[str, float]]) -> ObservationalModel:
        network = NetworkModel(model.spec, dtype=model.dtype, device=model.device)
        for readings in rounds:
            network.learn({}, readings, refit=False)
        if rounds:
            network.gp.refit()
        return cls(model, len(rounds), network)


@dataclass
class _SetGP:
    """The GP of one target set: its rounds and the factor of its causal-prior covariance.

    Attributes:
        z: (n, d) unit-cube do-values; prior_std: (n,) σ̂ at them; lower: (n, n) Cholesky factor
        of k_θ(Z, Z) + σ̂σ̂ᵀ + ρ²I; alpha: (n,) its inverse applied to y − m(Z).
    """

    z: torch.Tensor
    prior_std: torch.Tensor
    lengthscale: torch.Tensor
    outputscale: torch.Tensor
    lower: torch.Tensor
    alpha: torch.Tensor


class _EICBOProblem(Problem):
    def __init__(self, policy: EICBOPolicy, model: NetworkModel, seed: int) -> None:
        super().__init__(policy, model, seed)
        self.observational = policy.observational(model).network
        self.reward = model.reward_node
        self.kernel = model.spec.model.kernel
        nodes = len(self.observational.order)
        self.eps = sobol_normals(
            self.settings.mc_samples, nodes, seed, dtype=self.dtype, device=self.device
        )
        self.column = {node: j for j, node in enumerate(self.observational.order)}
        self.noise_var = self._reward_noise() ** 2
        rewards = [r.readings[self.reward] for r in model.history if self.reward in r.readings]
        acted = [
            r.readings[self.reward]
            for r in model.history
            if r.intervention and self.reward in r.readings
        ]
        self.best = max(acted or rewards or [-math.inf])
        self.reward_var = float(torch.tensor(rewards).var()) if len(rewards) > 1 else 1.0
        self.sets: dict[tuple[str, ...], _SetGP | None] = {}
        self.info: dict[str, Any] = {
            "observational_rounds": policy.observational(model).rounds,
            "best_f": self.best,
        }

    def _reward_noise(self) -> float:
        if self.model.reward_function is not None:  # g(components) has no noise of its own
            return math.sqrt(1e-6)
        return self.model.known_noise_std(self.reward)

    baseline_is_zero = True  # EI is itself an improvement

    # ------------------------------------------------------------------ causal prior
    def causal_prior(
        self, actions: torch.Tensor, set_actions: tuple[str, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """m_I and σ̂_I at (b, A) action vectors (the do-values in the set's columns).

        Returns:
            mean (b,) and std (b,), differentiable in `actions`.
        """
        network = self.observational
        if network.gp.num_observations.max() == 0:  # no observational round yet
            zero = actions.new_zeros(actions.shape[0])
            return zero, zero
        eps, reward = self.eps, self.reward
        reward_var: list[torch.Tensor] = []

        def sampler(query: NodeQuery) -> torch.Tensor:
            if query.node == reward:
                reward_var.append(query.std.square())
                return query.mean
            spread = (query.std.square() + network.known_noise_std(query.node) ** 2).sqrt()
            return query.mean + spread * eps[:, self.column[query.node]].unsqueeze(-1)

        values = network.rollout(actions.unsqueeze(0), sampler, set_actions=set_actions)
        draws = values[reward].expand(eps.shape[0], actions.shape[0])
        mean = draws.mean(0)
        if reward_var:
            variance = reward_var[0].expand_as(draws).mean(0)
        else:  # a decomposed reward g(components): the spread of g over the draws
            variance = draws.var(0) if draws.shape[0] > 1 else torch.zeros_like(mean)
        return mean, variance.clamp_min(0.0).sqrt()

    # ------------------------------------------------------------------ one GP per set
    def _scaled(self, region: Region, values: torch.Tensor) -> torch.Tensor:
        lower, upper = region.lower.to(values), region.upper.to(values)
        return (values - lower) / (upper - lower).clamp_min(1e-12)

    def set_gp(self, region: Region) -> _SetGP | None:
        """The set's GP on its rounds (None before the first), built once per proposal."""
        key = region.actions
        if key not in self.sets:
            self.sets[key] = self._build(region)
        return self.sets[key]

    def _build(self, region: Region) -> _SetGP | None:
        wanted = set(region.actions)
        rows = [
            r
            for r in self.model.history
            if set(r.intervention) == wanted and self.reward in r.readings
        ]
        if not rows:
            return None
        opts = {"dtype": self.dtype, "device": self.device}
        values = torch.tensor([[r.intervention[a] for a in region.actions] for r in rows], **opts)
        y = torch.tensor([r.readings[self.reward] for r in rows], **opts)
        with torch.no_grad():
            prior_mean, prior_std = self.causal_prior(region.embed(values), region.set_actions)
        z = self._scaled(region, values)
        residual = y - prior_mean
        lengthscale, outputscale = self._hyperparameters(z, residual)
        gram = kernel_matrix(z[None], z[None], lengthscale[None], outputscale[None], self.kernel)[0]
        gram = gram + torch.outer(prior_std, prior_std)
        scale = float(gram.diagonal().mean())
        gram = gram + (self.noise_var + _JITTER * scale) * torch.eye(len(y), **opts)
        lower = torch.linalg.cholesky(gram)
        alpha = torch.cholesky_solve(residual.unsqueeze(-1), lower).squeeze(-1)
        return _SetGP(z, prior_std, lengthscale, outputscale, lower, alpha)

    def _hyperparameters(
        self, z: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(d,) lengthscale and () output scale (output units²) of k_θ."""
        n, d = z.shape
        opts = {"dtype": self.dtype, "device": self.device}
        if n < max(self.settings.min_fit_points, 2) or float(residual.std()) == 0.0:
            return torch.full((d,), _PRIOR_LENGTHSCALE, **opts), torch.tensor(
                self.reward_var, **opts
            )
        center, spread = residual.mean(), residual.std()
        fitted = fit_hyperparameters(
            z,
            (residual - center) / spread,
            kernel=self.kernel,
            priors=self.model.spec.model.priors,
            known_noise=max(self.noise_var / float(spread) ** 2, 1e-6),
        )
        outputscale = torch.tensor(fitted.outputscale * float(spread) ** 2, **opts)
        return fitted.lengthscale.to(**opts), outputscale

    def posterior(self, region: Region, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and latent std (b,) of f_I at (b, |I|) do-values; differentiable."""
        prior_mean, prior_std = self.causal_prior(region.embed(values), region.set_actions)
        gp = self.set_gp(region)
        if gp is None:
            prior_var = self.reward_var + prior_std.square()
            return prior_mean, prior_var.clamp_min(_MIN_STD**2).sqrt()
        z = self._scaled(region, values)
        cross = kernel_matrix(
            gp.z[None], z[None], gp.lengthscale[None], gp.outputscale[None], self.kernel
        )[0]
        cross = cross + torch.outer(gp.prior_std, prior_std)  # (n, b)
        mean = prior_mean + cross.mT @ gp.alpha
        v = torch.linalg.solve_triangular(gp.lower, cross, upper=False)
        variance = gp.outputscale + prior_std.square() - v.square().sum(0)
        return mean, variance.clamp_min(_MIN_STD**2).sqrt()

    # ------------------------------------------------------------------ acquisition
    def evaluate(self, region: Region, x: torch.Tensor) -> torch.Tensor:
        """log EI at (b, |I|) do-values; −inf for the empty target set (never proposed)."""
        if not region.actions:
            return x.new_full((x.shape[0],), -math.inf)
        mean, std = self.posterior(region, x[:, : region.dim])
        if not math.isfinite(self.best):  # nothing read yet: the mean orders the points
            return mean
        log_ei = _log_ei_helper((mean - self.best) / std) + std.log()
        # cost-aware mode divides an improvement by a cost: EI itself, not its log
        return log_ei.exp() if self.settings.cost_aware else log_ei

    def mean_value(self, actions: torch.Tensor, set_actions: tuple[str, ...]) -> torch.Tensor:
        raise NotImplementedError("eicbo's acquisition is an improvement (baseline 0)")

    def evaluate_candidates(self, actions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("eicbo needs hard interventions; candidates are soft")

    def diagnostics(self) -> dict[str, Any]:
        return dict(self.info)
