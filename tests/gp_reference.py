"""An exact reference posterior computed by gpytorch's ExactGP, for equivalence tests."""

from __future__ import annotations

import gpytorch
import torch


class _ReferenceGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel: str, dim: int) -> None:
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        if kernel == "matern52":
            base = gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=dim)
        else:
            base = gpytorch.kernels.RBFKernel(ard_num_dims=dim)
        self.covar_module = gpytorch.kernels.ScaleKernel(base)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def exact_posterior(
    z: torch.Tensor,
    y: torch.Tensor,
    zq: torch.Tensor,
    *,
    lengthscale: torch.Tensor,
    outputscale: float,
    noise: float,
    kernel: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Posterior mean, variance and covariance of the latent f by gpytorch, Cholesky only.

    Args:
        z: (n, d) training inputs; y: (n,) targets; zq: (q, d) queries.

    Returns:
        mean (q,), variance (q,), covariance (q, q).
    """
    dim = zq.shape[-1]
    if z.shape[0] == 0:  # gpytorch needs data; the prior is the answer
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        model = _ReferenceGP(None, None, likelihood, kernel, dim).to(zq.dtype)
        model.covar_module.base_kernel.lengthscale = lengthscale
        # a tensor, not a float: gpytorch's setter would round a float through float32
        model.covar_module.outputscale = torch.tensor(outputscale, dtype=zq.dtype)
        cov = model.covar_module(zq).to_dense().detach().to(zq)
        return torch.zeros(zq.shape[0], dtype=zq.dtype), cov.diagonal().clone(), cov
    likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(
        noise=torch.full((z.shape[0],), noise, dtype=z.dtype)
    )
    model = _ReferenceGP(z, y, likelihood, kernel, dim).to(z.dtype)
    model.covar_module.base_kernel.lengthscale = lengthscale.reshape(1, -1)
    model.covar_module.outputscale = torch.tensor(outputscale, dtype=z.dtype)
    model.eval()
    with (
        torch.no_grad(),
        gpytorch.settings.max_cholesky_size(10**9),
        gpytorch.settings.fast_pred_var(False),
        gpytorch.settings.cholesky_jitter(float_value=0.0, double_value=0.0),
    ):
        f = model(zq)
        return f.mean, f.variance, f.covariance_matrix
