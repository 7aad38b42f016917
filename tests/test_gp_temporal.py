"""The time-aware node GP: its Gram matrix is PSD, with rbf it is the product of the input and
a temporal kernel, and it follows a system that changed where a stationary GP averages; with a
period, the product with gpytorch's periodic kernel, and last period's same phase informs the
present."""

from __future__ import annotations

import math

import gpytorch
import pytest
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


def _gram(model: TemporalGP, x: torch.Tensor, t: torch.Tensor, ls, kernel: str) -> torch.Tensor:
    """The model's prior covariance of (x, t): its own inputs, scaled as it scales them."""
    z = model.gp._scale(model._with_time(x, t)[None])
    one = torch.ones(1, dtype=torch.float64)
    return kernel_matrix(z, z, torch.as_tensor([ls], dtype=torch.float64), one, kernel)[0]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 30),
    seed=st.integers(0, 2**31 - 1),
    kernel=st.sampled_from(["matern52", "rbf"]),
    lengthscales=st.lists(st.floats(1e-3, 10.0), min_size=5, max_size=5),
    span=st.floats(1.0, 1e5),
    period=st.floats(2.0, 500.0),
)
def test_with_a_period_the_gram_matrix_is_psd(n, seed, kernel, lengthscales, span, period):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, dtype=torch.float64, generator=gen)
    rounds = torch.randint(0, int(span), (n,), generator=gen).to(torch.float64)
    model = TemporalGP(BOUNDS, GPConfig(kernel=kernel), time_scale=100.0, period=period)
    gram = _gram(model, x, rounds, lengthscales, kernel)
    assert torch.allclose(gram, gram.T)
    assert float(torch.linalg.eigvalsh(gram).min()) >= -1e-10 * n  # rounding only


def test_with_rbf_and_a_period_the_kernel_is_gpytorchs_product_with_a_periodic_kernel():
    """k_x · exp(−Δt²/2ℓ_t²) · PeriodicKernel(P, 4ℓ_p²) (gpytorch divides sin² by its
    lengthscale, not its square): gpytorch's own modules, to 1e-8, at rounds up to the
    thousands (the phase is taken from t mod P)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 2, dtype=torch.float64, generator=gen)
    t = torch.randint(0, 3000, (40,), generator=gen).to(torch.float64)
    t[:4] = torch.tensor([0.0, 52.0, 26.0, 1040.0])  # a whole period apart, half of one
    ls_x, ls_tau, ls_p, scale, period = [0.3, 0.7], 0.4, 0.35, 52.0, 52.0
    model = TemporalGP(BOUNDS, GPConfig(kernel="rbf"), time_scale=scale, period=period)
    ours = _gram(model, x, t, [*ls_x, ls_tau, ls_p, ls_p], "rbf")

    spatial = gpytorch.kernels.RBFKernel(ard_num_dims=2).double()
    spatial.lengthscale = torch.tensor(ls_x, dtype=torch.float64)
    decay = gpytorch.kernels.RBFKernel().double()
    decay.lengthscale = torch.tensor(ls_tau * scale, dtype=torch.float64)
    periodic = gpytorch.kernels.PeriodicKernel().double()
    periodic.period_length = torch.tensor(period, dtype=torch.float64)
    periodic.lengthscale = torch.tensor(4.0 * ls_p**2, dtype=torch.float64)
    with torch.no_grad():
        reference = (
            spatial(x).to_dense() * decay(t[:, None]).to_dense() * periodic(t[:, None]).to_dense()
        )
    torch.testing.assert_close(ours, reference, rtol=0.0, atol=1e-8)
    # a whole period apart, the periodic factor is 1; half a period apart, its least
    with torch.no_grad():
        factor = periodic(t[:3, None]).to_dense()
    assert float(factor[0, 1]) == pytest.approx(1.0)
    assert float(factor[0, 2]) == pytest.approx(math.exp(-1.0 / (2.0 * ls_p**2)))


def test_with_matern_the_period_joins_the_joint_distance():
    """Matérn-5/2 of √(r_x² + (Δt/ℓ_t)² + 4 sin²(πΔt/P)/(2ℓ_p)²): gpytorch's Matérn of that
    distance (equal ℓ_c = ℓ_s), to 1e-8."""
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(30, 2, dtype=torch.float64, generator=gen)
    t = torch.randint(0, 500, (30,), generator=gen).to(torch.float64)
    ls = [0.3, 0.7, 0.4, 0.35, 0.35]
    model = TemporalGP(BOUNDS, GPConfig(kernel="matern52"), time_scale=52.0, period=52.0)
    ours = _gram(model, x, t, ls, "matern52")
    dx = ((x[:, None] - x[None]) / torch.tensor(ls[:2], dtype=torch.float64)).pow(2).sum(-1)
    dt = t[:, None] - t[None]
    r2 = dx + (dt / (ls[2] * 52.0)) ** 2 + torch.sin(torch.pi * dt / 52.0) ** 2 / ls[3] ** 2
    matern = gpytorch.kernels.MaternKernel(nu=2.5).double()
    matern.lengthscale = torch.tensor(1.0, dtype=torch.float64)
    # gpytorch's Matérn of a 1-d input whose distances are r: the first row of a feature
    # map is not needed, so evaluate its formula through the kernel on (0, r) pairs
    r = r2.clamp_min(0).sqrt().reshape(-1, 1)
    with torch.no_grad():
        reference = matern(torch.zeros(1, 1, dtype=torch.float64), r).to_dense()
    torch.testing.assert_close(ours, reference.reshape(30, 30), rtol=0.0, atol=1e-8)


def test_with_a_period_rank_one_appends_equal_a_refactor():
    gen = torch.Generator().manual_seed(2)
    config = GPConfig(noise_variance=0.01, refit_every=None, misfit_z=None)
    model = TemporalGP(BOUNDS, config, time_scale=52.0, period=52.0)
    model.gp.set_hyperparameters(
        lengthscale=torch.tensor([[0.3, 0.5, 0.8, 0.4, 0.6]], dtype=torch.float64),
        outputscale=torch.tensor([1.3], dtype=torch.float64),
    )
    for t in range(0, 600, 5):
        x = torch.rand(1, 2, dtype=torch.float64, generator=gen)
        y = torch.sin(6.0 * x[:, 0]) + torch.cos(2 * torch.pi * torch.tensor([t / 52.0]))
        model.learn_one(x, y, t)
    query = torch.rand(1, 25, 2, dtype=torch.float64, generator=gen)
    appended = model.posterior(query, 600, full_covariance=True)
    model.gp.rebuild()
    refactored = model.posterior(query, 600, full_covariance=True)
    torch.testing.assert_close(appended.mean, refactored.mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(appended.covariance, refactored.covariance, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("period", [None, 52.0])
def test_last_years_same_season_informs_this_one(period):
    """y = +1 in a 13-round 'holiday' of every 52, −1 otherwise, x ignored; two years learned.
    Asked about the third year's holiday, only the periodic model says +1."""
    gen = torch.Generator().manual_seed(3)
    config = GPConfig(noise_variance=0.01, refit_every=None, misfit_z=None)
    model = TemporalGP(BOUNDS, config, time_scale=52.0, period=period)

    def y_at(t: int) -> float:
        return 1.0 if t % 52 in range(26, 39) else -1.0

    for t in range(104):
        x = torch.rand(1, 2, dtype=torch.float64, generator=gen)
        model.learn_one(x, torch.tensor([y_at(t)], dtype=torch.float64), t)
    model.gp.refit()
    query = torch.rand(1, 10, 2, dtype=torch.float64, generator=gen)
    holiday, term = model.posterior(query, 104 + 30).mean, model.posterior(query, 104 + 5).mean
    if period is None:  # the decay alone: a holiday half a year ahead looks like the recent term
        assert float(holiday.max()) < 0.0
    else:
        assert float(holiday.min()) > 0.5 and float(term.max()) < -0.5
        assert float(model.time_lengthscale[0]) > 52  # it remembers a year back
