"""The time-aware node GP: its Gram matrix is PSD, with rbf it is the product of the input and
a temporal kernel, and it follows a system that changed where a stationary GP averages."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.gp import GPConfig, IncrementalGP
from core.gp.temporal import TemporalGP
from core.kernels import kernel_matrix

BOUNDS = torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 30),
    seed=st.integers(0, 2**31 - 1),
    kernel=st.sampled_from(["matern52", "rbf"]),
    lengthscales=st.lists(st.floats(1e-3, 10.0), min_size=3, max_size=3),
    span=st.floats(1.0, 1e5),
)
def test_the_spatio_temporal_gram_matrix_is_psd(n, seed, kernel, lengthscales, span):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, dtype=torch.float64, generator=gen)
    rounds = torch.randint(0, int(span), (n, 1), generator=gen).to(torch.float64)
    model = TemporalGP(BOUNDS, GPConfig(kernel=kernel), time_scale=100.0)
    z = model.gp._scale(model._with_time(x, rounds[:, 0])[None])
    gram = kernel_matrix(
        z,
        z,
        torch.tensor([lengthscales], dtype=torch.float64),
        torch.ones(1, dtype=torch.float64),
        kernel,
    )[0]
    assert torch.allclose(gram, gram.T)
    smallest = float(torch.linalg.eigvalsh(gram).min())
    assert smallest >= -1e-10 * n  # rounding only


def test_with_rbf_the_kernel_is_the_input_kernel_times_a_temporal_one():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, 6, 2, dtype=torch.float64, generator=gen)
    t = torch.tensor([[[0.0], [3.0], [40.0], [41.0], [200.0], [7.0]]], dtype=torch.float64)
    ls = torch.tensor([[0.3, 0.7, 0.25]], dtype=torch.float64)  # the last: 25 rounds at scale 100
    one = torch.ones(1, dtype=torch.float64)
    joint = kernel_matrix(
        torch.cat((x, t / 100.0), -1), torch.cat((x, t / 100.0), -1), ls, one, "rbf"
    )
    spatial = kernel_matrix(x, x, ls[:, :2], one, "rbf")
    temporal = torch.exp(-((t - t.mT) ** 2) / (2 * 25.0**2))
    torch.testing.assert_close(joint, spatial * temporal, rtol=1e-12, atol=1e-12)


def test_it_follows_a_system_that_changed():
    """y = +1 everywhere for 60 rounds, then −1: at the present the temporal GP says −1."""
    gen = torch.Generator().manual_seed(1)
    config = GPConfig(noise_variance=0.01, refit_every=None, misfit_z=None)
    temporal = TemporalGP(BOUNDS, config, time_scale=20.0)
    stationary = IncrementalGP(BOUNDS, config)
    for t in range(120):
        x = torch.rand(1, 2, dtype=torch.float64, generator=gen)
        y = torch.tensor([1.0 if t < 60 else -1.0], dtype=torch.float64)
        temporal.learn_one(x, y, t)
        stationary.learn_one(x, y)
    temporal.gp.refit()
    stationary.refit()
    query = torch.rand(1, 20, 2, dtype=torch.float64, generator=gen)
    now = temporal.posterior(query, 120).mean
    assert (now - -1.0).abs().max() < 0.2
    assert (stationary.posterior(query).mean - -1.0).abs().max() > 0.5
    assert float(temporal.time_lengthscale[0]) < 60  # it learned that the past stops informing
