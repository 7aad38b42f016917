"""The bounded GP: exact below its capacity, flat past it, the least informative row removed,
refits on the kept rows, and a restart that rebuilds the same state."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import structlog
import torch

from core.gp import GPConfig, IncrementalGP
from core.gp.bounded import BoundedGP, make_gp, remove_row
from core.gp.refit import run_refit
from core.spec import ModelSpec

B, D = 3, 2
BOUNDS = torch.tensor([[0.0, 1.0]] * D, dtype=torch.float64).expand(B, D, 2)


def stream(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, B, D, dtype=torch.float64, generator=gen)
    y = torch.sin(4 * x).sum(-1) + 0.05 * torch.randn(n, B, dtype=torch.float64, generator=gen)
    return x, y


def quiet(**settings) -> GPConfig:
    return GPConfig(refit_every=None, misfit_z=None, **settings)


def exact_on_kept(gp: IncrementalGP, member: int) -> IncrementalGP:
    """An exact GP of member's kept rows with its hyperparameters and standardization."""
    z, y = gp.member_data(member)
    exact = IncrementalGP(BOUNDS[:1], quiet(noise_variance=float(gp.noise[member])))
    exact.learn_many(z[None], y[None], refit=False)
    exact.lengthscale[0] = gp.lengthscale[member]
    exact.outputscale[0] = gp.outputscale[member]
    exact.y_mean[0], exact.y_scale[0] = gp.y_mean[member], gp.y_scale[member]
    exact._known_noise[0] = gp.noise[member] * gp.y_scale[member] ** 2
    exact.rebuild()
    return exact


def test_below_capacity_it_is_the_exact_gp():
    x, y = stream(40)
    config = dict(refit_every=None, misfit_z=None)
    bounded = BoundedGP(BOUNDS, GPConfig(capacity=40, budget=20, **config))
    exact = IncrementalGP(BOUNDS, GPConfig(**config))
    bounded.learn_many(x[:10].transpose(0, 1), y[:10].T)
    exact.learn_many(x[:10].transpose(0, 1), y[:10].T)
    for t in range(10, 25):
        bounded.learn_one(x[t], y[t])
        exact.learn_one(x[t], y[t])
        if t == 15:
            bounded.refit()
            exact.refit()
    bounded.learn_block(x[25:].transpose(0, 1), y[25:].T)
    exact.learn_block(x[25:].transpose(0, 1), y[25:].T)
    assert bounded.switched == [False] * B
    query = torch.rand(B, 7, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got, want = bounded.posterior(query), exact.posterior(query)
    torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=1e-8)
    torch.testing.assert_close(got.variance, want.variance, rtol=0, atol=1e-8)


def test_past_capacity_memory_is_flat_and_the_factor_exact_for_the_kept_rows():
    x, y = stream(300)
    gp = BoundedGP(BOUNDS, quiet(capacity=24, budget=12))
    sizes = []
    with structlog.testing.capture_logs() as logs:
        for t in range(300):
            gp.learn_one(x[t], y[t])
            if t >= 40:
                sizes.append(gp.memory_bytes())
    assert [entry["member"] for entry in logs if entry["event"] == "gp.bounded"] == [0, 1, 2]
    assert len(set(sizes)) == 1  # not one byte more from reading 40 to 300
    assert gp.num_observations.tolist() == [12] * B
    assert gp.seen == [300] * B
    query = torch.rand(B, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for j in range(B):
        want = exact_on_kept(gp, j).posterior(query[j : j + 1])
        got = gp.posterior(query[j : j + 1], members=[j])
        torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=1e-9)
        torch.testing.assert_close(got.variance, want.variance, rtol=0, atol=1e-9)


def test_each_removal_drops_the_row_of_largest_loo_precision():
    """Brute force: diag((K + σ²I)⁻¹) of the rows before each removal picks the row removed."""
    x, y = stream(60, seed=3)
    gp = BoundedGP(BOUNDS[:1], quiet(capacity=15, noise_variance=1e-2))
    for t in range(15):
        gp.learn_one(x[t, :1], y[t, :1])
    for t in range(15, 60):
        z_before, y_before = gp.member_data(0)
        n = z_before.shape[0]
        gp.learn_one(x[t, :1], y[t, :1])
        rows = torch.cat((z_before, gp._scale(x[t, :1])))
        assert gp.num_observations.tolist() == [n]  # one in, one out
        full = IncrementalGP(BOUNDS[:1], quiet(noise_variance=1e-2))
        full.learn_many(rows[None], torch.cat((y_before, y[t, :1]))[None], refit=False)
        full.y_mean[:], full.y_scale[:] = gp.y_mean, gp.y_scale  # the same noise in its units
        full.rebuild()
        l_full = full._buffers.factor[0, : n + 1, : n + 1]
        drop = int(torch.argmax(torch.cholesky_inverse(l_full).diagonal()))
        kept = torch.cat((rows[:drop], rows[drop + 1 :]))
        torch.testing.assert_close(gp.member_data(0)[0], kept, rtol=0, atol=0)


def test_remove_row_is_the_factor_without_that_row():
    gen = np.random.default_rng(0)
    a = gen.normal(size=(9, 9))
    k = torch.tensor(a @ a.T + 9 * np.eye(9))
    for i in (0, 4, 8):
        factor = torch.linalg.cholesky(k).clone()
        assert remove_row(factor, 9, i)
        keep = [r for r in range(9) if r != i]
        want = torch.linalg.cholesky(k[keep][:, keep])
        torch.testing.assert_close(factor[:8, :8], want, rtol=0, atol=1e-12)


def test_refits_run_beside_on_the_kept_rows_only():
    x, y = stream(80, seed=4)
    gp = BoundedGP(BOUNDS, GPConfig(capacity=20, budget=16, refit_every=5, deferred=True))
    for t in range(60):
        gp.learn_one(x[t], y[t])
    job = gp.refit_job()
    assert job is not None and max(z.shape[0] for z in job.z) <= 20
    result = run_refit(job)
    for t in range(60, 64):  # rows come and go while the job runs
        gp.learn_one(x[t], y[t])
    report = gp.install(result)
    assert report.refit == [0, 1, 2]
    assert gp.num_observations.tolist() == [16] * B
    torch.testing.assert_close(gp.lengthscale, result.lengthscale)
    query = torch.rand(B, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    for j in range(B):
        want = exact_on_kept(gp, j).posterior(query[j : j + 1])
        got = gp.posterior(query[j : j + 1], members=[j])
        torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=1e-8)


def test_resume_and_replay_rebuild_the_same_bounded_state():
    """The live model refits now and then (each changes what the budget keeps); a new model
    resumed from the state after the last refit and fed every reading again ends the same."""
    x, y = stream(150, seed=5)
    config = GPConfig(capacity=20, budget=14, refit_every=None, misfit_z=None)
    live = BoundedGP(BOUNDS, config)
    for t in range(150):
        live.learn_one(x[t], y[t])
        if t in (30, 70, 110):
            live.refit()
            state = live.state()
    replay = BoundedGP(BOUNDS, config)
    replay.resume(state)
    for t in range(150):
        replay.learn_one(x[t], y[t], refit=False)
    assert replay.seen == live.seen
    for j in range(B):
        for got, want in zip(replay.member_data(j), live.member_data(j), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    query = torch.rand(B, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(replay.posterior(query).mean, live.posterior(query).mean)
    fresh = BoundedGP(BOUNDS, config)  # without the state: chosen with other hyperparameters
    for t in range(150):
        fresh.learn_one(x[t], y[t], refit=False)
    fresh.load_state(state)
    assert any(not torch.equal(fresh.member_data(j)[0], live.member_data(j)[0]) for j in range(B))


def test_settings_are_checked():
    assert isinstance(make_gp(BOUNDS, GPConfig(capacity=10)), BoundedGP)
    assert type(make_gp(BOUNDS, GPConfig())) is IncrementalGP
    with pytest.raises(ValueError, match="exclude"):
        GPConfig(capacity=10, window=5)
    with pytest.raises(ValueError, match="budget"):
        GPConfig(capacity=10, budget=11)
    with pytest.raises(ValueError, match="budget"):
        GPConfig(budget=4)
    with pytest.raises(ValueError, match="exclude"):
        ModelSpec(capacity=10, window=5)
    with pytest.raises(ValueError, match="budget"):
        ModelSpec(capacity=10, budget=12)
    assert ModelSpec(capacity=10, budget=4).budget == 4


def test_blocks_are_learned_as_blocks_below_capacity_and_row_by_row_past_it():
    x, y = stream(30, seed=8)
    config = quiet(capacity=12, budget=8)
    blocks, rows = BoundedGP(BOUNDS, config), BoundedGP(BOUNDS, config)
    for start in range(0, 30, 5):  # blocks of 5 rows: within capacity, across it, past it
        blocks.learn_block(x[start : start + 5].transpose(0, 1), y[start : start + 5].T)
        for t in range(start, start + 5):
            rows.learn_one(x[t], y[t])
    assert blocks.seen == rows.seen == [30] * B
    for j in range(B):
        for got, want in zip(blocks.member_data(j), rows.member_data(j), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_an_install_keeps_the_live_rows_and_brings_the_diagonal_from_beside_the_loop():
    """A refit copied, then readings (appends and least-informative removals) learned while it
    ran: the install replays them, so the rows are the live ones, in order, and the factor and
    diag((K + σ²I)⁻¹) are those of a rebuild under the new values — with no O(m³) on the caller
    (the diagonal comes with the result)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(60, 2, generator=gen, dtype=torch.float64)
    y = torch.sin(5 * x[:, 0]) + 0.1 * torch.randn(60, generator=gen, dtype=torch.float64)
    config = GPConfig(
        noise_variance=0.01, capacity=20, budget=15, refit_every=None, misfit_z=None, deferred=True
    )
    gp = make_gp(torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64), config)
    for i in range(30):
        gp.learn_one(x[i : i + 1], y[i : i + 1])
    gp._refit_due[0] = True
    job = gp.refit_job()
    result = run_refit(job)
    assert job.marks is not None and result.qdiag is not None
    for i in range(30, 36):
        gp.learn_one(x[i : i + 1], y[i : i + 1])
    live_z, live_y = gp.member_data(0)
    fresh = []
    gp._fresh_qdiag = lambda j, f=gp._fresh_qdiag: fresh.append(j) or f(j)  # count O(m³) passes
    report = gp.install(result)
    assert report.refit == [0] and fresh == []
    z, values = gp.member_data(0)
    assert torch.equal(z, live_z) and torch.equal(values, live_y)
    reference = copy.deepcopy(gp)
    reference.rebuild()
    q = torch.rand(1, 7, 2, generator=gen, dtype=torch.float64)
    ours, theirs = gp.posterior(q), reference.posterior(q)
    assert torch.allclose(ours.mean, theirs.mean, atol=1e-10)
    assert torch.allclose(ours.variance, theirs.variance, atol=1e-10)
    del gp._fresh_qdiag
    assert torch.allclose(gp._qdiag[0], gp._fresh_qdiag(0), rtol=1e-10)


def test_the_exact_pass_over_the_diagonal_runs_beside_the_caller_with_deferred_refits():
    """Every `budget` removals diag((K + σ²I)⁻¹) is computed exactly again (O(m³)). With
    deferred refits the learn never does it: the member goes out in the next refit job,
    refactorized under the values it holds (no fit, same standardization), and the install
    brings the exact diagonal and replays the rows learned meanwhile. A caller that runs no
    job gets it on its own thread after STALE_PASSES budgets."""
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(200, 1, 2, generator=gen, dtype=torch.float64)
    y = torch.sin(5 * x[..., 0]) + 0.1 * torch.randn(200, 1, generator=gen, dtype=torch.float64)
    config = GPConfig(  # a wide drift tolerance: no restandardization job in the way
        noise_variance=0.01,
        capacity=20,
        budget=15,
        refit_every=None,
        misfit_z=None,
        deferred=True,
        drift_tolerance=10.0,
    )
    gp = make_gp(torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64), config)
    fresh = []
    exact_pass = gp._fresh_qdiag
    gp._fresh_qdiag = lambda j: fresh.append(j) or exact_pass(j)  # count O(m³) passes
    t = 0
    while not gp._refresh_due[0]:
        gp.learn_one(x[t], y[t])
        t += 1
    assert fresh == [0]  # the switch's first removal only (no diagonal kept before)
    assert gp._removals[0] == 16  # the 16th removal found the pass due (and used the kept one)
    before = gp.hyperparameters(), gp.y_mean.clone(), gp.y_scale.clone()
    job = gp.refit_job()
    assert job.members == [0] and job.fit == [False] and job.keep == [True]
    assert not gp._refresh_due[0]
    result = run_refit(job)
    for _ in range(5):  # rows come and go while the job runs
        gp.learn_one(x[t], y[t])
        t += 1
    live_z, live_y = gp.member_data(0)
    report = gp.install(result)
    assert report.rebuilt == [0] and report.refit == [] and fresh == [0]
    assert not gp._refresh_due[0] and gp._removals[0] == 5
    for want, got in zip(before[0].values(), gp.hyperparameters().values(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(gp.y_mean, before[1], rtol=0, atol=0)
    torch.testing.assert_close(gp.y_scale, before[2], rtol=0, atol=0)
    z, values = gp.member_data(0)
    assert torch.equal(z, live_z) and torch.equal(values, live_y)
    n = int(gp.num_observations[0])
    inverse = torch.linalg.inv(gp._buffers.factor[0, :n, :n])
    torch.testing.assert_close(gp._qdiag[0], inverse.square().sum(0), rtol=1e-10, atol=0)
    # no job run: the pass is due from 15 removals on, and done here at 4 budgets (60)
    fresh.clear()
    installed_at = t
    while not fresh:
        gp.learn_one(x[t], y[t])
        t += 1
    assert gp._refresh_due[0] and gp._removals[0] == 1  # 5 + 55 kept, the next a fresh one
    assert t - installed_at == 56 and len(fresh) == 1
