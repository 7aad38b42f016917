"""The Kronecker GP of array nodes (core.gp.kronecker) and Matheron sampling (core.gp.matheron)
against exact dense references."""

from __future__ import annotations

import pytest
import torch

from core.gp.kronecker import KroneckerGP, mode_product
from core.gp.matheron import MatheronSamples


def rbf(lengthscale: float):
    def kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.exp(-0.5 * torch.cdist(a, b) ** 2 / lengthscale**2)

    return kernel


def random_factor(size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(size, 2, generator=g, dtype=torch.float64)
    return b @ b.T + 0.3 * torch.eye(size, dtype=torch.float64)


def problem(n: int = 12, shape: tuple[int, ...] = (3, 4), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64)
    y = torch.randn(n, *shape, generator=g, dtype=torch.float64)
    factors = [random_factor(d, seed + i) for i, d in enumerate(shape)]
    return rbf(0.4), factors, 0.05, x, y


def dense_posterior(gp: KroneckerGP, x_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    kt = gp.factors[0]
    for factor in gp.factors[1:]:
        kt = torch.kron(kt, factor)
    k = torch.kron(gp.kernel(gp.x, gp.x), kt) + gp.noise * torch.eye(gp.n * kt.shape[0])
    cross = torch.kron(gp.kernel(x_test, gp.x), kt)
    mean = cross @ torch.linalg.solve(k, gp.y.reshape(-1))
    cov = torch.kron(gp.kernel(x_test, x_test), kt) - cross @ torch.linalg.solve(k, cross.T)
    return mean.reshape(len(x_test), *gp.shape), torch.diagonal(cov).reshape(len(x_test), *gp.shape)


def test_mode_product_is_the_kronecker_matrix_vector_product() -> None:
    g = torch.Generator().manual_seed(1)
    t = torch.randn(5, 3, 4, generator=g, dtype=torch.float64)
    a = torch.randn(2, 3, generator=g, dtype=torch.float64)
    b = torch.randn(6, 4, generator=g, dtype=torch.float64)
    out = mode_product(t, [a, b])
    reference = (torch.kron(a, b) @ t.reshape(5, -1).T).T.reshape(5, 2, 6)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", [(6,), (3, 4), (2, 3, 2)])
def test_posterior_equals_the_dense_computation(shape: tuple[int, ...]) -> None:
    kernel, factors, noise, x, y = problem(shape=shape)
    gp = KroneckerGP(kernel, factors, noise, x, y)
    x_test = torch.rand(5, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    mean, var = dense_posterior(gp, x_test)
    # two float64 routes through a kernel matrix with condition number ~1e8
    torch.testing.assert_close(gp.posterior_mean(x_test), mean, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(gp.posterior_variance(x_test), var, rtol=1e-6, atol=1e-8)


def test_root_extension_equals_a_refit_with_the_same_hyperparameters() -> None:
    kernel, factors, noise, x, y = problem(n=15)
    grown = KroneckerGP(kernel, factors, noise, x[:5], y[:5])
    for i in range(5, 15):
        grown.learn_one(x[i], y[i])
    fresh = KroneckerGP(kernel, factors, noise, x, y)
    torch.testing.assert_close(grown.root, fresh.root, rtol=0, atol=1e-8)
    x_test = torch.rand(7, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(
        grown.posterior_mean(x_test), fresh.posterior_mean(x_test), rtol=0, atol=1e-8
    )
    torch.testing.assert_close(
        grown.posterior_variance(x_test), fresh.posterior_variance(x_test), rtol=0, atol=1e-8
    )
    # and the root is a root of K_XX: the factors were never touched
    k = kernel(x, x)
    torch.testing.assert_close(grown.root @ grown.root.T, k, rtol=0, atol=1e-7)
    assert all(a is b for a, b in zip(grown.factors, grown.factors, strict=True))


@pytest.mark.parametrize("mode", ["joint", "marginal"])
def test_matheron_std_from_1024_samples_is_within_5_percent_of_the_exact_std(mode: str) -> None:
    kernel, factors, noise, x, y = problem(n=10, shape=(2, 3))
    gp = KroneckerGP(kernel, factors, noise, x, y)
    x_test = torch.cat([x[:2] + 0.01, torch.rand(4, 2, generator=torch.Generator().manual_seed(5))])
    draws = MatheronSamples(gp, 1024, torch.Generator().manual_seed(0))
    samples = getattr(draws, mode)(x_test.double())
    assert samples.shape == (1024, 6, 2, 3)
    mean, var = dense_posterior(gp, x_test.double())
    std = var.sqrt()
    empirical = samples.std(0)
    relative = (empirical - std).abs() / std
    assert float(relative.max()) < 0.05 * 2  # each element: sampling noise of 1024 draws
    assert float(relative.mean()) < 0.05
    # and the sample mean within 4 standard errors
    assert bool(((samples.mean(0) - mean).abs() < 4 * std / 32).all())


def test_joint_samples_have_the_exact_joint_covariance() -> None:
    kernel, factors, noise, x, y = problem(n=8, shape=(3,))
    gp = KroneckerGP(kernel, factors, noise, x, y)
    x_test = torch.rand(2, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    samples = MatheronSamples(gp, 4096, torch.Generator().manual_seed(1)).joint(x_test)
    flat = samples.reshape(4096, -1)
    empirical = torch.cov(flat.T)
    exact = gp.joint_covariance(x_test)
    scale = torch.diagonal(exact).sqrt()
    torch.testing.assert_close(
        empirical / scale[:, None] / scale, exact / scale[:, None] / scale, rtol=0, atol=0.08
    )
