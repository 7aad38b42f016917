"""Type-II maximum-a-posteriori fit of one GP's hyperparameters, delegated to BoTorch.

The incremental GP evaluates its kernel itself; only here, on the refit schedule, is a gpytorch
model built — with BoTorch's kernel and likelihood constructors, so the priors are BoTorch's — and
fitted by `botorch.fit.fit_gpytorch_mll`. The fitted values are handed back as plain tensors.

Two prior families:
  "gamma"       BoTorch's `get_matern_kernel_with_gamma_prior` / gamma-prior likelihood
                (lengthscale Gamma(3, 6), outputscale Gamma(2, 0.15), noise Gamma(1.1, 0.05));
                the defaults of the BoTorch releases that papers 003 and 004 used.
  "dim_scaled"  BoTorch's current SingleTaskGP default (lengthscale LogNormal(√2 + ½ log d, √3),
                noise LogNormal(-4, 1)); the output scale is left without a prior.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from botorch.exceptions.warnings import OptimizationWarning
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_gamma_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import Likelihood
from gpytorch.means import ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.priors import GammaPrior

from core.kernels import KernelName

PriorName = Literal["gamma", "dim_scaled"]
PRIORS: tuple[str, ...] = ("gamma", "dim_scaled")


@dataclass(frozen=True)
class FittedHyperparameters:
    """Hyperparameters of one GP in standardized output units and unit-cube inputs."""

    lengthscale: torch.Tensor  # (d,)
    outputscale: float
    noise: float
    converged: bool


def make_covar_module(kernel: KernelName, dim: int, priors: PriorName) -> ScaleKernel:
    """A gpytorch ScaleKernel of the named kernel with BoTorch's priors of the named family."""
    if priors == "gamma":
        base_cls = MaternKernel if kernel == "matern52" else RBFKernel
        extra = {"nu": 2.5} if kernel == "matern52" else {}
        base = base_cls(ard_num_dims=dim, lengthscale_prior=GammaPrior(3.0, 6.0), **extra)
        return ScaleKernel(base, outputscale_prior=GammaPrior(2.0, 0.15))
    if priors == "dim_scaled":
        base = get_covar_module_with_dim_scaled_prior(
            ard_num_dims=dim, use_rbf_kernel=(kernel == "rbf")
        )
        return ScaleKernel(base)
    raise ValueError(f"unknown prior family {priors!r}; expected one of {PRIORS}")


def _make_likelihood(priors: PriorName) -> Likelihood:
    if priors == "gamma":
        return get_gaussian_likelihood_with_gamma_prior()
    return get_gaussian_likelihood_with_lognormal_prior()


def build_botorch_model(
    z: torch.Tensor,
    y: torch.Tensor,
    *,
    kernel: KernelName,
    priors: PriorName,
    known_noise: float | None,
) -> SingleTaskGP:
    """A SingleTaskGP on unit-cube inputs and standardized outputs with a zero prior mean.

    Args:
        z: (n, d) inputs scaled to the unit cube.
        y: (n,) standardized outputs.
        known_noise: fixed noise variance (standardized units), or None to learn it.
    """
    train_y = y.unsqueeze(-1)
    common = {
        "covar_module": make_covar_module(kernel, z.shape[-1], priors).to(z),
        "mean_module": ZeroMean(),
        "outcome_transform": None,
        "input_transform": None,
    }
    if known_noise is None:
        return SingleTaskGP(z, train_y, likelihood=_make_likelihood(priors).to(z), **common)
    return SingleTaskGP(z, train_y, train_Yvar=torch.full_like(train_y, known_noise), **common)


def fit_hyperparameters(
    z: torch.Tensor,
    y: torch.Tensor,
    *,
    kernel: KernelName,
    priors: PriorName,
    known_noise: float | None,
    initial: FittedHyperparameters | None = None,
) -> FittedHyperparameters:
    """Maximize the marginal likelihood (times the priors) of one GP.

    Args:
        z: (n, d) unit-cube inputs.
        y: (n,) standardized outputs.
        known_noise: fixed noise variance in standardized units, or None to learn it.
        initial: a warm start (the previous fit), which shortens the optimization.

    Returns:
        The fitted hyperparameters; `converged` is False when the optimizer gave up, in which
        case the values are the best it reached (or `initial` if that scored better).
    """
    model = build_botorch_model(z, y, kernel=kernel, priors=priors, known_noise=known_noise)
    if initial is not None:
        _warm_start(model, initial, learn_noise=known_noise is None)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    converged = True
    # Callers update models under no_grad; the optimizer needs gradients regardless.
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizationWarning)
        try:
            fit_gpytorch_mll(mll)
        except Exception:  # ModelFittingError and linear-algebra failures alike
            converged = False
    covar = model.covar_module
    noise = known_noise if known_noise is not None else float(model.likelihood.noise.item())
    return FittedHyperparameters(
        lengthscale=covar.base_kernel.lengthscale.detach().reshape(-1).clone(),
        outputscale=float(covar.outputscale.item()),
        noise=noise,
        converged=converged,
    )


def _warm_start(model: SingleTaskGP, hp: FittedHyperparameters, *, learn_noise: bool) -> None:
    covar = model.covar_module
    lengthscale = hp.lengthscale.to(covar.base_kernel.lengthscale).reshape(1, -1)
    lower = float(covar.base_kernel.raw_lengthscale_constraint.lower_bound) * 1.01
    covar.base_kernel.lengthscale = lengthscale.clamp_min(lower)
    # tensors, not floats: gpytorch's setters would round a Python float through float32
    opts = {"dtype": lengthscale.dtype, "device": lengthscale.device}
    covar.outputscale = torch.tensor(max(hp.outputscale, 1e-4), **opts)
    if learn_noise:
        floor = float(model.likelihood.noise_covar.raw_noise_constraint.lower_bound) * 1.01
        model.likelihood.noise = torch.tensor(max(hp.noise, floor), **opts)
