"""The Kronecker GP of array nodes (core.gp.kronecker) and Matheron sampling (core.gp.matheron)
against exact dense references."""

from __future__ import annotations

import pytest
import torch

from core.gp.kronecker import KroneckerGP, data_product, mode_product
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


def literal_matheron(
    gp: KroneckerGP, samples: int, x_test: torch.Tensor, seed: int
) -> torch.Tensor:
    """Matheron's rule as the paper writes it (the sampler before the eigen-root rewrite):
    Cholesky root of K_XX, roots Q_i Λ_i^½ of the factors, separate draws of the prior on X and
    of the noise, the update through the Kronecker eigen-solve. (S, m, *shape)."""
    g = torch.Generator().manual_seed(seed)
    k = len(gp.shape)
    roots = [e.vectors * e.values.sqrt() for e in gp.factor_eigen]
    shape = (samples, gp.n, *gp.shape)
    z_train = mode_product(torch.randn(shape, generator=g, dtype=torch.float64), roots)
    noise = torch.randn(shape, generator=g, dtype=torch.float64) * gp.noise**0.5
    residual = gp.y - data_product(z_train, gp.root, k) - noise
    weights = mode_product(gp.solve(residual), gp.factors)
    cross = gp.cross(x_test)
    l12 = torch.linalg.solve_triangular(gp.root, cross.T, upper=False).T
    schur = gp.kernel(x_test, x_test) - l12 @ l12.T
    l22 = torch.linalg.cholesky(schur + 1e-8 * torch.eye(len(x_test), dtype=torch.float64))
    z_test = torch.randn(samples, len(x_test), *gp.shape, generator=g, dtype=torch.float64)
    prior = data_product(z_train, l12, k) + data_product(mode_product(z_test, roots), l22, k)
    return prior + data_product(weights, cross, k)


def moments(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    flat = samples.reshape(len(samples), -1)
    return flat.mean(0), torch.cov(flat.T)


@pytest.mark.parametrize("shape", [(4,), (2, 3)])
def test_fast_sampler_has_the_exact_posterior_mean_and_covariance_as_the_literal_rule(
    shape: tuple[int, ...],
) -> None:
    """20,000 joint samples at 3 points: the eigen-root sampler's mean and covariance equal the
    dense posterior's to sampling error, and so do those of the literal rule (same problem)."""
    kernel, factors, noise, x, y = problem(n=9, shape=shape, seed=4)
    gp = KroneckerGP(kernel, factors, noise, x, y)
    x_test = torch.cat([x[:1] + 0.02, torch.rand(2, 2, generator=torch.Generator().manual_seed(8))])
    x_test = x_test.double()
    count = 20_000
    exact_cov = gp.joint_covariance(x_test)
    exact_mean, _ = dense_posterior(gp, x_test)
    scale = torch.diagonal(exact_cov).sqrt()
    fast = MatheronSamples(gp, count, torch.Generator().manual_seed(11)).joint(x_test)
    literal = literal_matheron(gp, count, x_test, seed=12)
    for draws in (fast, literal):
        mean, cov = moments(draws)
        # mean: within 5 standard errors; covariance, in correlation units: within 5/√count·√2
        assert bool(((mean - exact_mean.reshape(-1)).abs() < 5 * scale / count**0.5).all())
        normalized = (cov - exact_cov) / scale[:, None] / scale
        assert float(normalized.abs().max()) < 5 * (2 / count) ** 0.5
        # the standard deviations within 2 %
        assert float((torch.diagonal(cov).sqrt() / scale - 1).abs().max()) < 0.02
    # and the two samplers against each other (two-sample: twice the variance)
    (m1, c1), (m2, c2) = moments(fast), moments(literal)
    assert bool(((m1 - m2).abs() < 5 * (2 / count) ** 0.5 * scale).all())
    assert float(((c1 - c2) / scale[:, None] / scale).abs().max()) < 5 * (4 / count) ** 0.5


def test_fast_marginal_samples_match_the_exact_marginals_at_each_point() -> None:
    kernel, factors, noise, x, y = problem(n=9, shape=(3, 2), seed=6)
    gp = KroneckerGP(kernel, factors, noise, x, y)
    x_test = torch.rand(5, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    count = 20_000
    samples = MatheronSamples(gp, count, torch.Generator().manual_seed(3)).marginal(x_test)
    mean, var = dense_posterior(gp, x_test)
    std = var.sqrt()
    assert bool(((samples.mean(0) - mean).abs() < 5 * std / count**0.5).all())
    assert float((samples.std(0) / std - 1).abs().max()) < 0.03
    # each point's own joint covariance over its outputs is the exact one
    for i in range(len(x_test)):
        _, cov = moments(samples[:, i])
        exact = gp.joint_covariance(x_test[i : i + 1])
        s = torch.diagonal(exact).sqrt()
        assert float(((cov - exact) / s[:, None] / s).abs().max()) < 5 * (2 / count) ** 0.5


def test_paths_are_reused_across_calls_and_depend_only_on_the_generator() -> None:
    """The (S, n, *shape) base paths are drawn once: two calls at one point agree (marginal),
    and a second sampler from the same seed reproduces the samples."""
    kernel, factors, noise, x, y = problem(n=6, shape=(2, 2))
    gp = KroneckerGP(kernel, factors, noise, x, y)
    x_test = torch.rand(3, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    draws = MatheronSamples(gp, 16, torch.Generator().manual_seed(0))
    first = draws.marginal(x_test)
    torch.testing.assert_close(draws.marginal(x_test), first, rtol=0, atol=0)
    torch.testing.assert_close(draws.marginal(x_test[1:2]), first[:, 1:2], rtol=0, atol=1e-12)
    again = MatheronSamples(gp, 16, torch.Generator().manual_seed(0)).marginal(x_test)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
