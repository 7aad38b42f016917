"""GPPosterior samples itself: joint draws with the posterior's moments, reproducible draws."""

from __future__ import annotations

import doctest

import pytest
import torch

import core.gp.posterior
from core.gp import GPConfig, GPPosterior, IncrementalGP


@pytest.fixture
def model() -> IncrementalGP:
    gen = torch.Generator().manual_seed(5)
    bounds = torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64).expand(2, 2, 2)
    model = IncrementalGP(bounds, GPConfig(noise_variance=0.01, refit_every=None))
    x = torch.rand(2, 8, 2, generator=gen, dtype=torch.float64)
    model.learn_many(x, torch.sin(3 * x.sum(-1)))
    return model


def test_the_docstring_example_runs():
    assert doctest.testmod(core.gp.posterior).failed == 0


def test_base_samples_give_common_random_numbers(model):
    """The same standard normals give the same paths; each path is mean + R ε, R Rᵀ ≈ Σ."""
    post = model.posterior(torch.rand(2, 4, 2, dtype=torch.float64), full_covariance=True)
    base = torch.randn(3, 2, 4, dtype=torch.float64)
    paths = post.rsample(3, base)
    assert paths.shape == (3, 2, 4)
    assert torch.equal(paths, post.rsample(3, base.clone()))
    unit = torch.eye(4, dtype=torch.float64).expand(2, 4, 4).permute(2, 0, 1)  # ε = e_i
    root = (post.rsample(4, unit) - post.mean).permute(1, 2, 0)  # (b, q, q): column i is R e_i
    torch.testing.assert_close(root @ root.mT, post.covariance, atol=1e-7, rtol=1e-6)


def test_a_generator_makes_draws_reproducible_and_one_member_drops_the_batch(model):
    xq = torch.rand(4, 2, dtype=torch.float64)
    post = model.posterior(xq, members=1, full_covariance=True)
    first = post.rsample(5, generator=torch.Generator().manual_seed(3))
    again = post.rsample(5, generator=torch.Generator().manual_seed(3))
    assert first.shape == (5, 4) and torch.equal(first, again)


def test_rsample_says_what_it_needs(model):
    xq = torch.rand(2, 3, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="full_covariance=True"):
        model.posterior(xq).rsample(2)
    post = model.posterior(xq, full_covariance=True)
    with pytest.raises(ValueError, match=r"base_samples must have shape \(2, 2, 3\)"):
        post.rsample(2, torch.zeros(2, 3))
    assert isinstance(post, GPPosterior)
