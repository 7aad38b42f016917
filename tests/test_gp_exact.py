"""The incremental GP equals gpytorch's ExactGP posterior after any sequence of operations."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import core.blas
import core.gp.rebuild
import core.gp.window
import core.hyperfit
from core.gp import GPConfig, IncrementalGP
from tests.gp_reference import exact_posterior

RTOL = 1e-8


@dataclasses.dataclass
class Shadow:
    """What the model should know, kept independently of it: rows in order, pending points.

    A window keeps each member's last `window` observations.
    """

    lower: torch.Tensor  # (b, d)
    upper: torch.Tensor  # (b, d)
    rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = dataclasses.field(
        default_factory=list
    )  # (x (b, d), y (b,), mask (b,))
    pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(default_factory=dict)
    window: int | None = None

    def observe(self, x, y, mask) -> None:
        self.rows.append((x, y, mask))

    def member_data(self, j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Unit-cube inputs and raw outputs of member j's real rows, and its pending inputs."""
        span = self.upper[j] - self.lower[j]
        keep = -self.window if self.window is not None else None  # each member's last W
        xs = [x[j] for x, _, mask in self.rows if mask[j]][keep:]
        ys = [y[j] for _, y, mask in self.rows if mask[j]][keep:]
        ps = [x[j] for x, mask in self.pending.values() if mask[j]]
        dim = self.lower.shape[1]
        z = (torch.stack(xs) - self.lower[j]) / span if xs else torch.zeros(0, dim)
        zp = (torch.stack(ps) - self.lower[j]) / span if ps else torch.zeros(0, dim)
        return z, torch.stack(ys) if ys else torch.zeros(0), zp


def reference(model: IncrementalGP, shadow: Shadow, j: int, xq: torch.Tensor):
    """Raw-unit posterior of member j by gpytorch with the model's hyperparameters."""
    z, y, zp = shadow.member_data(j)
    mean, scale = model.y_mean[j], model.y_scale[j]
    hyper = {
        "lengthscale": model.lengthscale[j],
        "outputscale": float(model.outputscale[j]),
        "noise": float(model.noise[j] + model.jitter[j]),
        "kernel": model.config.kernel,
    }
    y_std = (y - mean) / scale
    if zp.shape[0]:
        fantasy, _, _ = exact_posterior(z, y_std, zp, **hyper)
        z, y_std = torch.cat([z, zp]), torch.cat([y_std, fantasy])
    zq = (xq - shadow.lower[j]) / (shadow.upper[j] - shadow.lower[j])
    mu, var, cov = exact_posterior(z, y_std, zq, **hyper)
    return mean + scale * mu, scale**2 * var, scale**2 * cov


def assert_matches(model: IncrementalGP, shadow: Shadow, xq: torch.Tensor) -> None:
    post = model.posterior(xq, full_covariance=True)
    for j in range(model.batch):
        mean, var, cov = reference(model, shadow, j, xq[j])
        prior = float(model.outputscale[j] * model.y_scale[j] ** 2)
        for name, ours, theirs, atol in (
            ("mean", post.mean[j], mean, RTOL * prior**0.5),
            ("variance", post.variance[j], var, RTOL * prior),
            ("covariance", post.covariance[j], cov, RTOL * prior),
        ):
            torch.testing.assert_close(
                ours, theirs, rtol=RTOL, atol=atol, msg=lambda m, n=name, j=j: f"{n} of {j}: {m}"
            )


def random_model(draw, batch, dim, window=None, known_noise=True, refit_every=None, misfit_z=None):
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    lower = torch.rand(batch, dim, generator=gen, dtype=torch.float64) * 4 - 2
    upper = lower + 0.5 + torch.rand(batch, dim, generator=gen, dtype=torch.float64) * 3
    noise = [float(v) for v in (10 ** (torch.rand(batch, generator=gen) * 4 - 4)).tolist()]
    config = GPConfig(
        kernel=draw(st.sampled_from(["matern52", "rbf"])),
        noise_variance=noise if known_noise else None,
        refit_every=refit_every,
        misfit_z=misfit_z,
        window=window,
    )
    model = IncrementalGP(torch.stack([lower, upper], dim=-1), config)
    model.set_hyperparameters(
        lengthscale=0.1 + 2 * torch.rand(batch, dim, generator=gen, dtype=torch.float64),
        outputscale=0.2 + 5 * torch.rand(batch, generator=gen, dtype=torch.float64),
        noise=10 ** (torch.rand(batch, generator=gen, dtype=torch.float64) * 4 - 4),
    )
    return model, Shadow(lower, upper, window=window), gen


@contextmanager
def capped_fits(maxiter: int) -> Iterator[None]:
    """Refits run the project's path (BoTorch's `fit_gpytorch_mll`, its priors, the rebuild),
    with the optimizer stopped after `maxiter` L-BFGS iterations.

    Exactness does not depend on how well the hyperparameters fit, only on the factor being
    rebuilt for whatever values the fit returns; the cap keeps the property tests fast.
    """

    def capped(mll, **kwargs):
        options = {"options": {"maxiter": maxiter}}
        return fit_gpytorch_mll(mll, optimizer_kwargs=options, **kwargs)

    with mock.patch.object(core.hyperfit, "fit_gpytorch_mll", capped):
        yield


def draw_point(gen, shadow: Shadow) -> torch.Tensor:
    u = torch.rand(shadow.lower.shape, generator=gen, dtype=torch.float64)
    return shadow.lower + u * (shadow.upper - shadow.lower)


def draw_output(gen, x: torch.Tensor, offset: float) -> torch.Tensor:
    return (
        offset
        + 3 * torch.sin(3 * x.sum(-1))
        + 0.1 * torch.randn(x.shape[0], generator=gen, dtype=torch.float64)
    )


def learn(model: IncrementalGP, shadow: Shadow, gen, offset: float, mask=None) -> None:
    batch = shadow.lower.shape[0]
    mask = torch.rand(batch, generator=gen) < 0.8 if mask is None else mask
    x = draw_point(gen, shadow)
    y = draw_output(gen, x, offset)
    model.learn_one(x, y, mask)
    shadow.observe(x, y, mask)


def learn_many(model: IncrementalGP, shadow: Shadow, gen, offset: float, m: int) -> None:
    batch = shadow.lower.shape[0]
    xs = torch.stack([draw_point(gen, shadow) for _ in range(m)], dim=1)
    ys = torch.stack([draw_output(gen, xs[:, i], offset) for i in range(m)], dim=1)
    masks = torch.rand(batch, m, generator=gen) < 0.8
    model.learn_many(xs, ys, masks)
    for i in range(m):
        shadow.observe(xs[:, i], ys[:, i], masks[:, i])


def apply(op: str, model: IncrementalGP, shadow: Shadow, gen, offset: float) -> None:
    """One step of a random sequence; the shadow records what the model should know."""
    batch, dim = shadow.lower.shape
    if op == "learn":
        learn(model, shadow, gen, offset)
    elif op == "window":  # enough appends that the window (if any) forgets in steady state
        for _ in range((shadow.window or 8) + 2):
            learn(model, shadow, gen, offset)
    elif op == "pending":
        x = draw_point(gen, shadow)
        mask = torch.rand(batch, generator=gen) < 0.8
        shadow.pending[model.add_pending(x, mask)] = (x, mask)
    elif op in ("resolve", "drop") and shadow.pending:
        handle = next(iter(shadow.pending))
        x, mask = shadow.pending.pop(handle)
        if op == "drop":
            model.drop_pending(handle)
        else:
            y = draw_output(gen, x, offset)
            model.resolve_pending(handle, x, y, mask)
            shadow.observe(x, y, mask)
    elif op == "hyper":
        model.set_hyperparameters(
            lengthscale=0.1 + 2 * torch.rand(batch, dim, generator=gen, dtype=torch.float64)
        )
    elif op == "refit":  # a marginal-likelihood fit of every member with enough data
        model.refit()
    elif op == "many":
        learn_many(model, shadow, gen, offset, 5)


OPS = st.sampled_from(
    ["learn", "learn", "learn", "window", "pending", "resolve", "drop", "hyper", "refit", "many"]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_sequence_matches_exact_gp(data):
    """Appends, windows, pending points, bulk appends, set and fitted hyperparameters."""
    batch = data.draw(st.integers(1, 3), label="batch")
    dim = data.draw(st.integers(1, 10), label="dim")
    window = data.draw(st.one_of(st.none(), st.integers(1, 40)), label="window")
    known = data.draw(st.booleans(), label="known noise")
    refit_every = data.draw(st.sampled_from([None, None, 30]), label="refit every")
    misfit_z = data.draw(st.sampled_from([None, None, 4.0]), label="misfit z")
    model, shadow, gen = random_model(data.draw, batch, dim, window, known, refit_every, misfit_z)
    offset = data.draw(st.floats(-50, 50), label="output offset")
    with capped_fits(maxiter=2):
        for op in data.draw(st.lists(OPS, min_size=1, max_size=40), label="operations"):
            apply(op, model, shadow, gen, offset)
    xq = torch.stack([draw_point(gen, shadow) for _ in range(4)], dim=1)
    assert_matches(model, shadow, xq)


LONG_OPS = st.sampled_from(["learn"] * 6 + ["pending", "resolve", "drop", "refit"])


@pytest.mark.parametrize("window", [None, 900])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_long_sequences_to_a_thousand_observations_match_exact_gp(window, data):
    """A bulk start, then single steps until member 0 has seen n = 1000 observations."""
    n = 1000
    batch = data.draw(st.integers(1, 3), label="batch")
    dim = data.draw(st.integers(1, 10), label="dim")
    known = data.draw(st.booleans(), label="known noise")
    model, shadow, gen = random_model(data.draw, batch, dim, window, known)
    offset = data.draw(st.floats(-50, 50), label="output offset")
    start = data.draw(st.integers(n - 120, n - 40), label="bulk start")
    ones = torch.ones(batch, dtype=torch.bool)
    xs = torch.stack([draw_point(gen, shadow) for _ in range(start)], dim=1)
    ys = torch.stack([draw_output(gen, xs[:, i], offset) for i in range(start)], dim=1)
    model.learn_many(xs, ys)
    for i in range(start):
        shadow.observe(xs[:, i], ys[:, i], ones)  # every row of the shadow: member 0 learned
    refitted = False
    with capped_fits(maxiter=1):
        while len(shadow.rows) < n:  # member 0 learns at every row, so it has seen n
            op = data.draw(LONG_OPS, label="operation")
            if op == "learn" or (op == "resolve" and shadow.pending):
                mask = torch.rand(batch, generator=gen) < 0.7
                mask[0] = True  # member 0 always learns, the others now and then
                if op == "learn":
                    learn(model, shadow, gen, offset, mask)
                else:
                    handle = next(iter(shadow.pending))
                    x, _ = shadow.pending.pop(handle)
                    y = draw_output(gen, x, offset)
                    model.resolve_pending(handle, x, y, mask)
                    shadow.observe(x, y, mask)
            elif op == "refit":  # one member, once: a fit at n ≈ 1000 costs seconds
                if not refitted:
                    model.refit([data.draw(st.integers(0, batch - 1), label="member")])
                    refitted = True
            else:
                apply(op, model, shadow, gen, offset)
    assert int(model.num_observations[0]) == min(n, window or n)
    xq = torch.stack([draw_point(gen, shadow) for _ in range(4)], dim=1)
    assert_matches(model, shadow, xq)


def test_pending_point_shrinks_variance_and_keeps_mean():
    gen = torch.Generator().manual_seed(3)
    model = IncrementalGP(torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64))
    for _ in range(10):
        x = torch.rand(1, 2, generator=gen, dtype=torch.float64)
        model.learn_one(x, torch.sin(6 * x.sum(-1)), refit=False)
    xq = torch.rand(1, 6, 2, generator=gen, dtype=torch.float64)
    before = model.posterior(xq)
    model.add_pending(xq[:, 0])
    after = model.posterior(xq)
    torch.testing.assert_close(after.mean, before.mean, rtol=1e-10, atol=1e-10)
    assert (after.variance <= before.variance + 1e-12).all()
    assert after.variance[0, 0] < 0.5 * before.variance[0, 0]


def test_refit_fits_hyperparameters_and_stays_exact():
    gen = torch.Generator().manual_seed(11)
    bounds = torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64)
    model = IncrementalGP(bounds, GPConfig(noise_variance=None, refit_every=20, misfit_z=None))
    shadow = Shadow(bounds[None, :, 0], bounds[None, :, 1])
    initial = model.lengthscale.clone()
    refits = []
    for _ in range(40):
        x = draw_point(gen, shadow)
        y = torch.sin(8 * x[:, 0]) + 0.01 * torch.randn(1, generator=gen, dtype=torch.float64)
        refits += model.learn_one(x, y).refit
        shadow.observe(x, y, torch.ones(1, dtype=torch.bool))
    assert refits == [0, 0]  # at 20 and at 40 observations
    assert not torch.allclose(model.lengthscale, initial)
    # x0 matters, x1 does not: the fit should see that
    assert model.lengthscale[0, 0] < model.lengthscale[0, 1]
    assert_matches(model, shadow, torch.stack([draw_point(gen, shadow) for _ in range(5)], 1))


def test_misfit_triggers_refit():
    model = IncrementalGP(
        torch.tensor([[0.0, 1.0]], dtype=torch.float64),
        GPConfig(noise_variance=1e-4, refit_every=None, misfit_z=4.0),
    )
    for i in range(6):
        report = model.learn_one(torch.tensor([[i / 10]]), torch.tensor([0.01 * i]))
    assert report.refit == []
    report = model.learn_one(torch.tensor([[0.55]]), torch.tensor([50.0]))
    assert report.surprise[0] > 4.0
    assert report.refit == [0]


def test_output_drift_restandardizes_and_stays_exact():
    gen = torch.Generator().manual_seed(5)
    bounds = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    model = IncrementalGP(bounds, GPConfig(noise_variance=0.01, refit_every=None, misfit_z=None))
    shadow = Shadow(bounds[None, :, 0], bounds[None, :, 1])
    ys = []
    for t in range(60):
        x = draw_point(gen, shadow)
        y = (1 + t) ** 2 * torch.sin(5 * x[:, 0])  # the output scale grows 3600-fold
        model.learn_one(x, y)
        shadow.observe(x, y, torch.ones(1, dtype=torch.bool))
        ys.append(float(y))
        # the frozen standardization follows the data within the drift tolerance
        data_std = torch.tensor(ys).std(unbiased=False)
        if t >= 2:
            assert 1 / 1.5 <= float(model.y_scale[0] / data_std) <= 1.5
    assert_matches(model, shadow, torch.stack([draw_point(gen, shadow) for _ in range(5)], 1))


def test_window_forgets_oldest_rows():
    bounds = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    model = IncrementalGP(bounds, GPConfig(noise_variance=0.01, window=5, refit_every=None))
    for t in range(12):
        report = model.learn_one(torch.tensor([[t / 12]]), torch.tensor([float(t)]))
    assert report.forgotten == 1
    assert model.num_rows.tolist() == [5]
    assert int(model.num_observations[0]) == 5


class RebuildCounter:
    """Counts the O(n³) refactorizations (and the O(n²) window removals) of every model."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rebuilt: list[list[int]] = []
        self.forgot: list[list[int]] = []
        rebuild, forget = core.gp.rebuild.refactorize_chunk, core.gp.window.forget_oldest

        def counted_rebuild(buffers, members, *hyperparameters):
            self.rebuilt.append(list(members))
            return rebuild(buffers, members, *hyperparameters)

        def counted_forget(buffers, members, *standardization):
            self.forgot.append(list(members))
            return forget(buffers, members, *standardization)

        monkeypatch.setattr(core.gp.rebuild, "refactorize_chunk", counted_rebuild)
        monkeypatch.setattr(core.gp.window, "forget_oldest", counted_forget)


def windowed_model(batch: int, dim: int, window: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    bounds = torch.tensor([[0.0, 1.0]] * dim, dtype=torch.float64).expand(batch, dim, 2)
    config = GPConfig(
        noise_variance=[10.0 ** -(1 + j) for j in range(batch)],
        refit_every=None,
        misfit_z=None,
        window=window,
    )
    model = IncrementalGP(bounds, config)
    model.set_hyperparameters(lengthscale=torch.full((batch, dim), 0.3, dtype=torch.float64))
    return model, Shadow(bounds[..., 0], bounds[..., 1], window=window), gen


def test_window_forgets_in_steady_state_without_any_rebuild(monkeypatch):
    """Once the window is full every append removes the oldest row in O(n²): no refactorization
    happens, members with different row counts and a pending point included, and the posterior
    stays exact on the retained data."""
    batch, dim, window = 3, 3, 60
    model, shadow, gen = windowed_model(batch, dim, window, seed=21)
    learn_many(model, shadow, gen, 2.0, 2 * window)  # full: the factor built once
    assert model.num_observations.tolist() == [window] * batch
    pending = draw_point(gen, shadow)  # held through every append below
    shadow.pending[model.add_pending(pending)] = (pending, torch.ones(batch, dtype=torch.bool))
    counter = RebuildCounter(monkeypatch)
    forgotten = 0
    for _ in range(300):
        mask = torch.rand(batch, generator=gen) < 0.8
        x = draw_point(gen, shadow)
        y = draw_output(gen, x, 2.0)
        report = model.learn_one(x, y, mask)
        shadow.observe(x, y, mask)
        assert report.rebuilt == []
        forgotten += report.forgotten
    assert counter.rebuilt == []
    assert len(counter.forgot) >= 290 and forgotten >= 0.7 * 300 * batch
    assert model.num_observations.tolist() == [window] * batch
    assert_matches(model, shadow, torch.stack([draw_point(gen, shadow) for _ in range(5)], 1))


def test_window_rebuilds_a_member_whose_removal_is_not_finite(monkeypatch):
    """A removal gone non-finite (forced here) leaves that member to a rebuild, the rest not."""
    model, shadow, gen = windowed_model(batch=3, dim=2, window=12, seed=4)
    learn_many(model, shadow, gen, 1.0, 20)
    solve, forget = core.gp.window.solve_lower_in_buffer_, core.gp.window.forget_oldest
    poisoned = []  # the first solve of a removal, member 0's, returns NaN

    def poisoned_solve(buffer, n, rhs):
        solve(buffer, n, rhs)
        if poisoned == [True]:
            rhs.fill_(math.nan)
            poisoned.append(True)

    def poisoned_forget(buffers, members, *standardization):
        poisoned[:] = [True]
        try:
            return forget(buffers, members, *standardization)
        finally:
            poisoned.clear()

    monkeypatch.setattr(core.gp.window, "solve_lower_in_buffer_", poisoned_solve)
    monkeypatch.setattr(core.gp.window, "forget_oldest", poisoned_forget)
    assert model.num_observations.tolist() == [12] * 3  # full: the next append forgets
    x = draw_point(gen, shadow)
    y = draw_output(gen, x, 1.0)
    report = model.learn_one(x, y)
    shadow.observe(x, y, torch.ones(3, dtype=torch.bool))
    assert report.forgotten == 3
    assert report.rebuilt == [0]  # member 0 rebuilt, members 1 and 2 updated in O(n²)
    assert torch.isfinite(model._buffers.factor).all()
    assert_matches(model, shadow, torch.stack([draw_point(gen, shadow) for _ in range(5)], 1))


def test_torch_fallback_matches_exact_gp(monkeypatch):
    """Where raw pointers and BLAS cannot be used (another device), torch does the same work."""
    monkeypatch.setattr(core.blas, "_raw_usable", lambda *tensors: False)
    monkeypatch.setattr(core.blas, "_blas_usable", lambda buffer, rhs: False)
    model, shadow, gen = windowed_model(batch=3, dim=2, window=15, seed=8)
    for step in range(40):
        learn(model, shadow, gen, 0.5)
        if step % 9 == 0:
            x, mask = draw_point(gen, shadow), torch.rand(3, generator=gen) < 0.8
            shadow.pending[model.add_pending(x, mask)] = (x, mask)
    assert model.num_observations.max() == 15
    assert_matches(model, shadow, torch.stack([draw_point(gen, shadow) for _ in range(5)], 1))


def test_noiseless_duplicates_never_produce_nan():
    model = IncrementalGP(
        torch.tensor([[0.0, 1.0]] * 3, dtype=torch.float32),
        GPConfig(noise_variance=0.0, refit_every=None, misfit_z=None),
    )
    model.set_hyperparameters(lengthscale=torch.full((1, 3), 5.0))
    x = torch.full((1, 3), 0.5)
    for i in range(200):
        model.learn_one(x + 1e-7 * (i % 3), torch.tensor([1.0 + 1e-7 * i]))
    post = model.posterior(torch.rand(1, 8, 3))
    assert torch.isfinite(post.mean).all() and torch.isfinite(post.variance).all()
    assert (post.variance >= 0).all()


def test_posterior_is_differentiable_in_the_query():
    model = IncrementalGP(torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64))
    x, y = torch.rand(1, 8, 2, dtype=torch.float64), torch.rand(1, 8, dtype=torch.float64)
    model.learn_many(x, y)
    xq = torch.rand(1, 3, 2, dtype=torch.float64, requires_grad=True)
    post = model.posterior(xq)
    (post.mean.sum() + post.stddev.sum()).backward()
    assert xq.grad is not None and torch.isfinite(xq.grad).all()


def test_joint_samples_have_the_posterior_moments():
    model = IncrementalGP(torch.tensor([[0.0, 1.0]], dtype=torch.float64))
    x, y = torch.rand(1, 6, 1, dtype=torch.float64), torch.rand(1, 6, dtype=torch.float64)
    model.learn_many(x, y)
    xq = torch.linspace(0, 1, 4, dtype=torch.float64).reshape(1, 4, 1)
    gen = torch.Generator().manual_seed(0)
    post = model.posterior(xq, full_covariance=True)
    samples = post.rsample(40000, generator=gen)
    assert samples.shape == (40000, 1, 4)
    torch.testing.assert_close(samples.mean(0), post.mean, atol=0.02, rtol=0)
    centred = samples[:, 0] - samples[:, 0].mean(0)
    cov = centred.T @ centred / (samples.shape[0] - 1)
    torch.testing.assert_close(cov, post.covariance[0], atol=0.02, rtol=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available here")
def test_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(1)
    bounds = torch.tensor([[0.0, 1.0]] * 3, dtype=torch.float64).expand(2, 3, 2)
    xs, ys = torch.rand(50, 2, 3, generator=gen), torch.rand(50, 2, generator=gen)
    xq = torch.rand(2, 4, 3, generator=gen)
    posts = []
    for device in ("cpu", "cuda"):
        model = IncrementalGP(bounds.to(device), GPConfig(noise_variance=0.01, refit_every=None))
        for x, y in zip(xs, ys, strict=True):
            model.learn_one(x.to(device, torch.float64), y.to(device, torch.float64))
        posts.append(model.posterior(xq.to(device)).mean.cpu())
    torch.testing.assert_close(posts[0], posts[1], rtol=1e-9, atol=1e-9)


def test_state_round_trip_reproduces_the_posterior_after_replay():
    gen = torch.Generator().manual_seed(9)
    bounds = torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64).expand(2, 2, 2)
    config = GPConfig(noise_variance=[0.01, None], refit_every=7, misfit_z=3.0)
    live, replay = IncrementalGP(bounds, config), IncrementalGP(bounds, config)
    data = []
    with capped_fits(maxiter=5):  # what is fitted does not matter here, only that it is restored
        for t in range(30):
            x = torch.rand(2, 2, generator=gen, dtype=torch.float64)
            y = torch.sin(4 * x.sum(-1)) * (1 + t)  # drifting scale: restandardizations happen
            live.learn_one(x, y)
            data.append((x, y))
    for x, y in data:  # the recovery replays the log without refits, then restores the state
        replay.learn_one(x, y, refit=False)
    replay.load_state(live.state())
    xq = torch.rand(2, 6, 2, generator=gen, dtype=torch.float64)
    ours, theirs = replay.posterior(xq), live.posterior(xq)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=1e-9, atol=1e-9)
    assert replay.refit_due.tolist() == live.refit_due.tolist()
