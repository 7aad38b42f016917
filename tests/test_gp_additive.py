"""The additive GP against gpytorch: kernel values, row-appended posterior, BoTorch refits."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from core.gp.additive import (
    AdditiveGP,
    AdditiveHyperparameters,
    GroupIndex,
    additive_kernel,
    gpytorch_additive_kernel,
    negative_log_posterior,
)

GROUPS = [(0, 1), (1, 2, 3), (4,), (5, 6), (0, 6)]  # overlapping, every coordinate covered
D = 7


def _hyper(groups: GroupIndex, seed: int = 0) -> AdditiveHyperparameters:
    g = torch.Generator().manual_seed(seed)
    ls = 0.2 + torch.rand(groups.count, groups.width, generator=g, dtype=torch.float64)
    for i, group in enumerate(groups.groups):
        ls[i, len(group) :] = 1.0
    os = 0.1 + torch.rand(groups.count, generator=g, dtype=torch.float64)
    return AdditiveHyperparameters(ls, os, 0.05)


def _twin(groups: GroupIndex, hyper: AdditiveHyperparameters):
    kernel = gpytorch_additive_kernel(groups.groups).to(torch.float64)
    for i, (part, group) in enumerate(zip(kernel.kernels, groups.groups, strict=True)):
        part.base_kernel.lengthscale = hyper.lengthscale[i, : len(group)]
        part.outputscale = hyper.outputscale[i]
    return kernel


def test_kernel_equals_gpytorch_sum_of_scale_maternkernels():
    groups = GroupIndex.build(GROUPS, D)
    hyper = _hyper(groups)
    g = torch.Generator().manual_seed(1)
    x1 = torch.rand(13, D, generator=g, dtype=torch.float64)
    x2 = torch.rand(9, D, generator=g, dtype=torch.float64)
    ours = additive_kernel(x1, x2, groups, hyper)
    with torch.no_grad():
        theirs = _twin(groups, hyper)(x1, x2).to_dense()
    assert torch.allclose(ours, theirs, atol=1e-8, rtol=0)
    per_group = additive_kernel(x1, x2, groups, hyper, per_group=True)
    assert per_group.shape == (len(GROUPS), 13, 9)
    assert torch.allclose(per_group.sum(0), ours, atol=1e-12)


class _Exact(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_row_appends_match_exact_gpytorch_posterior():
    groups = GroupIndex.build(GROUPS, D)
    hyper = _hyper(groups, seed=3)
    bounds = torch.tensor([[-1.0, 2.0]] * D, dtype=torch.float64)
    gp = AdditiveGP(bounds, GROUPS, refit_every=None)
    g = torch.Generator().manual_seed(4)
    x = -1.0 + 3.0 * torch.rand(40, D, generator=g, dtype=torch.float64)
    y = (
        torch.sin(x[:, 0] * x[:, 1])
        + x[:, 4] ** 2
        + 0.1 * torch.randn(40, generator=g, dtype=torch.float64)
    )
    gp.learn_one(x[0], float(y[0]))  # the first row fixes the standardization
    gp.y_mean, gp.y_scale = 0.3, 1.7
    gp.hyper = hyper
    gp._refactor()
    for i in range(1, 40):
        gp.learn_one(x[i], float(y[i]))
    assert gp.n == 40
    xq = -1.0 + 3.0 * torch.rand(11, D, generator=g, dtype=torch.float64)
    mean, var = gp.posterior(xq)

    z, zq = gp.unit(x), gp.unit(xq)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(torch.float64)
    likelihood.noise = hyper.noise
    ref = _Exact(z, (y - 0.3) / 1.7, likelihood, _twin(groups, hyper)).to(torch.float64)
    ref.eval()
    with torch.no_grad(), gpytorch.settings.fast_computations(False, False, False):
        post = ref(zq)
        ref_mean, ref_var = 0.3 + 1.7 * post.mean, post.variance * 1.7**2
    assert torch.allclose(mean, ref_mean, atol=1e-8, rtol=0)
    assert torch.allclose(var, ref_var, atol=1e-8, rtol=0)

    # the groups' posteriors: means add up to the sum's, each variance is its own group's
    g_mean, g_var = gp.group_posterior(xq)
    assert torch.allclose(g_mean.sum(0) + gp.y_mean, mean, atol=1e-10)
    with torch.no_grad(), gpytorch.settings.fast_computations(False, False, False):
        k = _twin(groups, hyper)
        z_all = torch.cat([z, zq])
        part = k.kernels[2]  # group (4,)
        kxx = part(z, z).to_dense() + hyper.noise * torch.eye(40, dtype=torch.float64)
        full = k(z, z).to_dense() + hyper.noise * torch.eye(40, dtype=torch.float64)
        kqx = part(zq, z).to_dense()
        exact = (
            part(zq, zq).to_dense().diagonal() - (kqx @ torch.linalg.solve(full, kqx.T)).diagonal()
        )
        del kxx, z_all
    assert torch.allclose(g_var[2], exact * 1.7**2, atol=1e-8, rtol=0)


def test_refit_through_botorch_improves_the_likelihood_and_keeps_appends_exact():
    bounds = torch.tensor([[0.0, 1.0]] * D, dtype=torch.float64)
    gp = AdditiveGP(bounds, GROUPS, refit_every=10)
    g = torch.Generator().manual_seed(5)
    x = torch.rand(25, D, generator=g, dtype=torch.float64)
    y = torch.sin(6 * x[:, 0]) + torch.cos(4 * x[:, 5] * x[:, 6])
    for i in range(25):
        gp.learn_one(x[i], float(y[i]))
    before = gp.hyper
    assert not torch.equal(
        before.outputscale, AdditiveHyperparameters.default(gp.groups, torch.float64).outputscale
    )
    # after the last refit (at 20) five rows were appended: the factor equals a fresh one
    appended = gp._chol[: gp.n, : gp.n].clone()
    gp._refactor()
    assert torch.allclose(appended, gp._chol[: gp.n, : gp.n], atol=1e-9)
    mean, _ = gp.posterior(x)
    assert float((mean - y).abs().max()) < 0.3


@pytest.mark.parametrize("groups", [[(0, 1), (3,)], [(0, 9)], [()]])
def test_bad_groups_are_named(groups):
    with pytest.raises(ValueError):
        GroupIndex.build(groups, 4)


def test_fit_objective_equals_botorch_mll_with_gamma_priors():
    from botorch.models import SingleTaskGP
    from botorch.models.utils.gpytorch_modules import get_gaussian_likelihood_with_gamma_prior
    from gpytorch.mlls import ExactMarginalLogLikelihood

    groups = GroupIndex.build(GROUPS, D)
    hyper = _hyper(groups, seed=7)
    g = torch.Generator().manual_seed(8)
    z = torch.rand(15, D, generator=g, dtype=torch.float64)
    y = torch.randn(15, generator=g, dtype=torch.float64)
    covar = gpytorch_additive_kernel(groups.groups, priors=True).to(torch.float64)
    for i, (part, group) in enumerate(zip(covar.kernels, groups.groups, strict=True)):
        part.base_kernel.lengthscale = hyper.lengthscale[i, : len(group)]
        part.outputscale = hyper.outputscale[i]
    likelihood = get_gaussian_likelihood_with_gamma_prior().to(torch.float64)
    model = SingleTaskGP(
        z, y.unsqueeze(-1), covar_module=covar, likelihood=likelihood, outcome_transform=None
    )
    model.likelihood.noise = hyper.noise
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    with gpytorch.settings.fast_computations(False, False, False):
        theirs = -mll(model(z), y).item()
    hyper_t = AdditiveHyperparameters(
        hyper.lengthscale,
        hyper.outputscale,
        torch.tensor(hyper.noise, dtype=torch.float64, requires_grad=True),
    )
    ours = negative_log_posterior(z, y, groups, hyper_t).item()
    # gpytorch adds no jitter; ours adds 1e-8 to the diagonal
    assert ours == pytest.approx(theirs, abs=1e-6)


def test_local_posterior_equals_the_dense_group_posterior_and_its_gradient():
    g = torch.Generator().manual_seed(3)
    bounds = torch.tensor([[0.0, 2.0]] * D, dtype=torch.float64)
    gp = AdditiveGP(bounds, GROUPS, refit_every=None)
    x = 2 * torch.rand(25, D, generator=g, dtype=torch.float64)
    for row in x:
        gp.learn_one(row, float(torch.sin(row.sum())))
    gp.hyper = _hyper(gp.groups)
    gp.fit()
    z = gp.unit(2 * torch.rand(4, D, generator=g, dtype=torch.float64))
    stored = gp._z[: gp.n]
    gram = additive_kernel(stored, stored, gp.groups, gp.hyper)
    gram += gp.hyper.noise * torch.eye(gp.n, dtype=torch.float64)
    cross = additive_kernel(stored, z, gp.groups, gp.hyper, per_group=True)  # (M, n, 4)
    prior = gp.hyper.outputscale.unsqueeze(-1)
    dense_var = prior - (cross * torch.linalg.solve(gram, cross)).sum(1)
    dense_mean = cross.mT @ torch.linalg.solve(gram, (gp._y[: gp.n] - gp.y_mean) / gp.y_scale)
    members = torch.arange(gp.groups.count)
    padded = torch.cat([z, z.new_zeros(4, 1)], -1)
    q = padded[:, gp.groups.index].movedim(0, 1)  # (M, 4, s) each group's own coordinates
    mean, var = gp.local_posterior(members, q, chunk=7)  # tiny slices: the chunking is exact
    torch.testing.assert_close(mean, gp.y_scale * dense_mean, rtol=0, atol=1e-9)
    torch.testing.assert_close(var, gp.y_scale**2 * dense_var, rtol=0, atol=1e-9)
    whole, _ = gp.posterior(2 * z)  # bounds [0, 2]: declared units
    torch.testing.assert_close(mean.sum(0) + gp.y_mean, whole, rtol=0, atol=1e-9)
    # the gradient (the polish's): finite at a stored point, equal to central differences
    for point in (padded[0].clone(), torch.cat([stored[3], stored.new_zeros(1)])):

        def total(p: torch.Tensor) -> torch.Tensor:
            m, v = gp.local_posterior(members, p[gp.groups.index].unsqueeze(1))
            return (m + 2.0 * v.clamp_min(1e-24).sqrt()).sum()

        p = point.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(total(p), p)
        assert torch.isfinite(grad).all()
        if point is not padded[0]:
            continue
        h = 1e-6
        numeric = torch.stack(
            [(total(point + h * e) - total(point - h * e)) / (2 * h) for e in torch.eye(D + 1)]
        )
        torch.testing.assert_close(grad[:D], numeric[:D].to(grad.dtype), rtol=1e-5, atol=1e-7)
