"""The model of one array node: a `KroneckerGP` whose hyperparameters BoTorch fits.

Inputs are the node's soft actions, scaled to [0, 1] by their bounds; outputs are the node's
array (d_2, ..., d_k), centred by their per-element mean and divided by one global scale (one
scale keeps the noise the same for every output, which the Kronecker eigen-solve needs). Two
kinds (`FieldModelKind`):

- `hogp`: BoTorch's `HigherOrderGP` (Zhe et al.; paper 002 §D.5): K_XX ⊗ K_2 ⊗ ... ⊗ K_k, each
  K_i a kernel of learned latent vectors; BoTorch's default priors (dimension-scaled lengthscale,
  log-normal noise).
- `icm`: BoTorch's `KroneckerMultiTaskGP` (Bonilla et al.): K_XX ⊗ K_T over the t = Π d_i
  outputs flattened, with its LKJ prior on K_T and a single noise level (no per-task noise).

Learning (`learn_one`, on the ingest path) only extends the root of K_XX: O(n²), the
hyperparameters, the output factors and the standardization stay fixed, so the posterior equals
that of a refit from scratch with the same hyperparameters. `refit` optimizes the marginal
likelihood (seconds) and is called off the ingest path — by the array policies, in the
policy's worker thread, when `refit_due` (every `refit_every` observations, as the node GPs).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import structlog
import torch

from core.gp.kronecker import KroneckerGP
from core.gp.matheron import MatheronSamples

__all__ = ["FieldModel", "FieldModelKind", "FieldRefitJob", "FieldRefitResult", "FieldSamples"]

FieldModelKind = Literal["hogp", "icm"]
_MIN_SCALE = 1e-9
_log = structlog.get_logger(__name__)


class FieldModel:
    """An array node's GP over its inputs.

    Args:
        bounds: (d, 2) the inputs' declared bounds (for scaling to [0, 1]).
        shape: the node's array shape.
        kind: `hogp` or `icm`.
        refit_every: refit after this many new observations (None: only the first fit).
        fit_steps: Adam steps of a refit.
    """

    def __init__(
        self,
        bounds: torch.Tensor,
        shape: tuple[int, ...],
        kind: FieldModelKind = "hogp",
        refit_every: int | None = 5,
        fit_steps: int = 50,
    ) -> None:
        self.bounds = bounds.to(torch.float64)
        self.shape = tuple(shape)
        self.kind: FieldModelKind = kind
        self.refit_every = refit_every
        self.fit_steps = fit_steps
        self.x = torch.zeros(0, len(bounds), dtype=torch.float64)  # raw inputs
        self.y = torch.zeros(0, *self.shape, dtype=torch.float64)  # raw outputs
        self.gp: KroneckerGP | None = None
        self.mean = torch.zeros(self.shape, dtype=torch.float64)
        self.scale = 1.0
        self.since_fit = 0
        self.fits = 0
        self.job_out = False  # a refit job was handed out and not installed yet

    # ------------------------------------------------------------------ data
    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d) declared units -> [0, 1]."""
        low, high = self.bounds[:, 0].to(x), self.bounds[:, 1].to(x)
        return (x - low) / (high - low)

    def learn_one(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One observation: x (d,) declared units, y (*shape). O(n²) root extension when a
        fitted model exists; the first observations only wait for the first `refit`."""
        y = y.to(torch.float64).reshape(self.shape)
        if not bool(torch.isfinite(y).all()):
            raise ValueError("an array reading holds non-finite values")
        x = x.to(torch.float64).reshape(-1)
        self.x = torch.cat([self.x, x[None]])
        self.y = torch.cat([self.y, y[None]])
        self.since_fit += 1
        if self.gp is not None:
            self.gp.learn_one(self.normalize(x), self._engine((y - self.mean) / self.scale))

    def _engine(self, y: torch.Tensor) -> torch.Tensor:
        """(..., *shape) -> the KroneckerGP's layout: flattened for the ICM's one factor."""
        if self.kind == "icm":
            return y.reshape(*y.shape[: y.dim() - len(self.shape)], -1)
        return y

    def _unengine(self, y: torch.Tensor) -> torch.Tensor:
        return y.reshape(
            *y.shape[: y.dim() - (1 if self.kind == "icm" else len(self.shape))], *self.shape
        )

    @property
    def refit_due(self) -> bool:
        """No fitted model yet (and data to fit), or `refit_every` observations since the fit."""
        if self.n == 0:
            return False
        if self.gp is None:
            return True
        return self.refit_every is not None and self.since_fit >= self.refit_every

    # ------------------------------------------------------------------ fitting
    def refit(self) -> None:
        """Fit the hyperparameters by BoTorch on all observations and rebuild the posterior,
        here and now (`refit_job` + `install` do the same beside the caller)."""
        if self.n == 0:
            raise ValueError("no observations to fit")
        self.install(self._job().run())

    def refit_job(self) -> FieldRefitJob | None:
        """A copy of what a due refit needs, to run elsewhere (`FieldRefitJob.run`), or None
        when none is due or one is already out (until its result is installed)."""
        if not self.refit_due or self.job_out:
            return None
        self.job_out = True
        return self._job()

    def _job(self) -> FieldRefitJob:
        return FieldRefitJob(
            self.kind, self.shape, self.bounds, self.x.clone(), self.y.clone(), self.fit_steps
        )

    def install(self, result: FieldRefitResult) -> None:
        """Use a refit's hyperparameters and standardization on all observations, those that
        arrived while it ran included (one O(n³) rebuild)."""
        self.mean, self.scale = result.mean, result.scale
        x, y = self.normalize(self.x), (self.y - self.mean) / self.scale
        self.gp = KroneckerGP(result.kernel, result.factors, result.noise, x, self._engine(y))
        self.since_fit = self.n - result.n
        self.fits += 1
        self.job_out = False

    def set_hyperparameters(
        self, kernel: object, factors: list[torch.Tensor], noise: float, scale: float = 1.0
    ) -> None:
        """Use given hyperparameters instead of a fit (tests, benchmarks): the mean is the data's
        per-element mean."""
        self.mean = self.y.mean(0) if self.n else torch.zeros(self.shape, dtype=torch.float64)
        self.scale = scale
        x, y = self.normalize(self.x), (self.y - self.mean) / self.scale
        self.gp = KroneckerGP(kernel, factors, noise, x, self._engine(y))  # type: ignore[arg-type]
        self.since_fit = 0

    # ------------------------------------------------------------------ prediction
    def samples(self, count: int, generator: torch.Generator) -> FieldSamples:
        """`count` posterior sample paths on fixed base samples (Matheron's rule)."""
        if self.gp is None:
            raise RuntimeError("the field model has not been fitted (call refit)")
        return FieldSamples(self, MatheronSamples(self.gp, count, generator))

    def posterior_mean(self, x: torch.Tensor) -> torch.Tensor:
        """(b, *shape) the posterior mean at x (b, d), declared units."""
        if self.gp is None:
            raise RuntimeError("the field model has not been fitted (call refit)")
        mean = self.gp.posterior_mean(self.normalize(x.to(torch.float64)))
        return self.mean + self.scale * self._unengine(mean)


@dataclass(frozen=True)
class FieldRefitResult:
    """Fitted hyperparameters of a field model, from `n` observations."""

    kernel: Any
    factors: list[torch.Tensor]
    noise: float
    mean: torch.Tensor  # (*shape) the prior mean, output units
    scale: float
    n: int
    seconds: float


@dataclass(frozen=True)
class FieldRefitJob:
    """A field model's refit on a copy of its data: runs in any thread, touches nothing else."""

    kind: FieldModelKind
    shape: tuple[int, ...]
    bounds: torch.Tensor
    x: torch.Tensor  # (n, d) raw inputs
    y: torch.Tensor  # (n, *shape) raw outputs
    fit_steps: int

    def run(self) -> FieldRefitResult:
        started = time.perf_counter()
        n = len(self.x)
        mean = self.y.mean(0)
        spread = float((self.y - mean).std()) if n > 1 else 0.0
        scale = spread if math.isfinite(spread) and spread > _MIN_SCALE else 1.0
        low, high = self.bounds[:, 0], self.bounds[:, 1]
        x = (self.x - low) / (high - low)
        y = (self.y - mean) / scale
        if self.kind == "hogp":
            kernel, factors, noise, offset = _fit_hogp(x, y, self.fit_steps)
        else:
            kernel, factors, noise, offset = _fit_icm(x, y, self.fit_steps)
        mean = mean + scale * offset
        return FieldRefitResult(
            kernel, factors, noise, mean, scale, n, time.perf_counter() - started
        )


class FieldSamples:
    """Posterior sample paths of a `FieldModel` in the node's units."""

    def __init__(self, model: FieldModel, draws: MatheronSamples) -> None:
        self.model = model
        self.draws = draws

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(S, b, *shape) samples at each of b inputs x (b, d) on its own; differentiable."""
        z = self.draws.marginal(self.model.normalize(x.to(torch.float64)))
        return self.model.mean + self.model.scale * self.model._unengine(z)

    @property
    def terms(self) -> int:
        """K = n + 2: the number of rows of `basis` (the prior mean, n data terms, the test
        term)."""
        return self.model.n + 2

    def coefficients(self, x: torch.Tensor) -> torch.Tensor:
        """(b, K) γ(x) = [1, B(x), r(x)] at inputs x (b, d): the samples are
        f_s(x) = Σ_k γ_k(x) basis[s, k] (`__call__`, exactly, up to rounding); differentiable."""
        gamma = self.draws.coefficients(self.model.normalize(x.to(torch.float64)))
        return torch.cat([gamma.new_ones(len(gamma), 1), gamma], dim=-1)

    def basis(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """(s, K, *shape) for samples [start, stop), node units: row 0 the prior mean, rows
        1..K−1 the scaled Matheron terms (`MatheronSamples.basis`)."""
        terms = self.model.scale * self.model._unengine(self.draws.basis(start, stop))
        mean = self.model.mean.expand(len(terms), 1, *self.model.shape)
        return torch.cat([mean, terms], dim=1)


def _fit_hogp(
    x: torch.Tensor, y: torch.Tensor, steps: int
) -> tuple[object, list[torch.Tensor], float, torch.Tensor]:
    from botorch.models.higher_order_gp import HigherOrderGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    model = HigherOrderGP(x, y, outcome_transform=None)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    _fit(mll, steps)
    model.eval()
    data_kernel = model.covar_modules[0]
    with torch.no_grad():
        factors = [
            cm(p).to_dense().detach().reshape(p.shape[-2], p.shape[-2])
            for cm, p in zip(model.covar_modules[1:], model.latent_parameters, strict=True)
        ]
        noise = float(model.likelihood.noise.reshape(-1)[0])
    return _dense(data_kernel), factors, noise, torch.zeros(y.shape[1:], dtype=torch.float64)


def _fit_icm(
    x: torch.Tensor, y: torch.Tensor, steps: int
) -> tuple[object, list[torch.Tensor], float, torch.Tensor]:
    from botorch.models.multitask import KroneckerMultiTaskGP
    from gpytorch.constraints import GreaterThan
    from gpytorch.likelihoods import MultitaskGaussianLikelihood
    from gpytorch.mlls import ExactMarginalLogLikelihood
    from gpytorch.priors import LogNormalPrior

    shape = y.shape[1:]
    flat = y.reshape(len(y), -1)
    prior = LogNormalPrior(loc=-4.0, scale=1.0)
    likelihood = MultitaskGaussianLikelihood(
        num_tasks=flat.shape[-1],
        noise_prior=prior,
        noise_constraint=GreaterThan(1e-6, transform=None, initial_value=prior.mode),
        rank=0,
        has_task_noise=False,  # one σ² for every output: the eigen-solve's constant diagonal
    )
    model = KroneckerMultiTaskGP(x, flat, likelihood=likelihood, outcome_transform=None)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    _fit(mll, steps)
    model.eval()
    with torch.no_grad():
        task = model.covar_module.task_covar_module.covar_matrix.to_dense().detach()
        noise = float(model.likelihood.noise.reshape(-1)[0])
        offset = model.mean_module(x[:1]).reshape(shape).detach()
    return _dense(model.covar_module.data_covar_module), [task], noise, offset


def _fit(mll: Any, steps: int) -> None:
    """Maximize the marginal likelihood with the model's priors: one L-BFGS-B run of at most
    `steps` iterations within the parameters' bounds (BoTorch's `fit_gpytorch_mll_scipy`;
    `fit_gpytorch_mll` would retry from random restarts, seconds to minutes more)."""
    import warnings

    import gpytorch
    from botorch.optim.fit import fit_gpytorch_mll_scipy

    mll.train()
    # gpytorch's fast log_prob: the Kronecker-plus-diagonal operator's own inv_quad_logdet
    # (eigendecompositions of the factors). Off, as this gpytorch has it by default, the MLL
    # densifies the (n·t)² covariance: 13 GB at n = 5 for the Brusselator's 2 × 64 × 64.
    fast = gpytorch.settings.fast_computations(log_prob=True)
    with warnings.catch_warnings(), fast:
        warnings.simplefilter("ignore")  # jitter and optimizer notices
        try:
            fit_gpytorch_mll_scipy(mll, options={"maxiter": steps})
        except Exception as error:  # the hyperparameters reached still give a valid posterior
            _log.warning("field_model.fit_failed", error=f"{type(error).__name__}: {error}")
    mll.eval()


def _dense(module: object):
    """The gpytorch kernel as a function of two input batches, dense, without gradients to
    its hyperparameters (frozen between refits)."""
    for parameter in module.parameters():  # type: ignore[attr-defined]
        parameter.requires_grad_(False)

    def kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return module(a, b).to_dense()  # type: ignore[operator]

    return kernel
