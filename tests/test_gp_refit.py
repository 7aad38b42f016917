"""Refits beside the model: a job's result, swapped in with the rows that came meanwhile, is the
exact GP of all the rows under the fitted hyperparameters; a stale result is refused."""

from __future__ import annotations

import pytest
import torch

import core.gp.rebuild
from core.gp import GPConfig, IncrementalGP
from core.gp.refit import factorize_job, fit_job, run_refit
from tests.test_gp_exact import Shadow, assert_matches, draw_point

BOUNDS = torch.tensor([[[0.0, 1.0], [-2.0, 2.0]], [[0.0, 5.0], [0.0, 1.0]]], dtype=torch.float64)


def _model(**config) -> tuple[IncrementalGP, Shadow]:
    settings = {"noise_variance": [None, 0.01], "refit_every": 10, "misfit_z": None}
    settings.update(config)
    model = IncrementalGP(BOUNDS, GPConfig(deferred=True, **settings), dims=[2, 1])
    return model, Shadow(BOUNDS[..., 0], BOUNDS[..., 1], window=config.get("window"))


def _learn(model: IncrementalGP, shadow: Shadow, gen: torch.Generator, count: int) -> None:
    for _ in range(count):
        x = draw_point(gen, shadow)
        x[1, 1] = 0.0  # member 1 has one real input
        y = torch.sin(3 * x[:, 0]) + 0.3 * x[:, 1] + 0.05 * torch.randn(2, generator=gen)
        y = y.to(torch.float64)
        mask = torch.tensor([True, bool(torch.rand(1, generator=gen) < 0.7)])
        model.learn_one(x, y, mask)
        shadow.observe(x, y, mask)


def _queries(gen: torch.Generator, shadow: Shadow) -> torch.Tensor:
    xq = torch.stack([draw_point(gen, shadow) for _ in range(6)], 1)
    xq[1, :, 1] = 0.0
    return xq


def test_deferred_learning_never_fits_but_schedules():
    gen = torch.Generator().manual_seed(1)
    model, shadow = _model()
    before = model.lengthscale.clone()
    _learn(model, shadow, gen, 12)
    assert torch.equal(model.lengthscale, before)  # nothing fit inside learn_one
    assert model.refit_due[0]
    job = model.refit_job()
    assert job is not None and 0 in job.members and job.fit[job.members.index(0)]
    assert not model.refit_due[0]  # reset when copied: the next rows count toward the next
    assert_matches(model, shadow, _queries(gen, shadow))


@pytest.mark.parametrize("late", [0, 1, 9])
def test_install_with_catch_up_equals_exact_gp_of_all_rows(late):
    gen = torch.Generator().manual_seed(7 + late)
    model, shadow = _model()
    _learn(model, shadow, gen, 25)
    point = draw_point(gen, shadow)
    point[1, 1] = 0.0
    pending = model.add_pending(point)  # pending rows survive the swap, at the new posterior
    shadow.pending[pending] = (point, torch.ones(2, dtype=torch.bool))
    job = model.refit_job()
    assert job is not None and any(job.fit)
    before = model.hyperparameters()
    _learn(model, shadow, gen, late)  # rows that arrive while the job runs
    result = run_refit(job)
    report = model.install(result)
    assert sorted(report.rebuilt) == job.members
    assert model.num_observations.tolist() == [
        sum(bool(m[j]) for _, _, m in shadow.rows) for j in range(2)
    ]
    after = model.hyperparameters()
    assert not torch.allclose(before["lengthscale"], after["lengthscale"])  # a fit happened
    # the exact GP (gpytorch, Cholesky) of every row under the installed hyperparameters
    assert_matches(model, shadow, _queries(gen, shadow))


def test_install_equals_from_scratch_model_with_same_hyperparameters():
    gen = torch.Generator().manual_seed(3)
    model, shadow = _model()
    _learn(model, shadow, gen, 30)
    job = model.refit_job()
    _learn(model, shadow, gen, 4)
    model.install(run_refit(job))
    scratch = IncrementalGP(BOUNDS, GPConfig(noise_variance=[None, 0.01]), dims=[2, 1])
    for x, y, mask in shadow.rows:
        scratch.learn_one(x, y, mask, refit=False)
    scratch.load_state(model.state())  # same hyperparameters and standardization, rebuilt
    xq = _queries(gen, shadow)
    ours, theirs = model.posterior(xq), scratch.posterior(xq)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=1e-8, atol=1e-8)


def test_stale_result_is_refused_and_due_again():
    gen = torch.Generator().manual_seed(5)
    model, shadow = _model()
    _learn(model, shadow, gen, 12)
    job = model.refit_job()
    model.set_hyperparameters(outputscale=torch.tensor([2.0, 3.0], dtype=torch.float64))
    report = model.install(run_refit(job))
    assert report.rebuilt == []
    assert torch.equal(model.outputscale, torch.tensor([2.0, 3.0], dtype=torch.float64))
    assert model.refit_due[0]
    assert_matches(model, shadow, _queries(gen, shadow))


@pytest.mark.parametrize("late", [1, 3, 14])
def test_window_forgetting_meanwhile_forgets_again_without_a_rebuild(late, monkeypatch):
    """Rows the window forgot while the job ran are removed again on install, one O(n²) update
    each, and the rows that came are appended: the exact GP of the window, no O(n³) rebuild."""
    gen = torch.Generator().manual_seed(9 + late)
    model, shadow = _model(window=15)
    _learn(model, shadow, gen, 15)
    job = model.refit_job()
    _learn(model, shadow, gen, late)  # the window forgets the job's oldest rows
    result = run_refit(job)
    assert model.late_rows(job) == late
    monkeypatch.setattr(model, "_rebuild", _no_rebuild)
    model.install(result)
    assert torch.equal(model.outputscale[job.members], result.outputscale)
    assert_matches(model, shadow, _queries(gen, shadow))


def test_window_forgetting_every_snapshot_row_rebuilds():
    gen = torch.Generator().manual_seed(4)
    model, shadow = _model(window=6)
    _learn(model, shadow, gen, 8)
    job = model.refit_job()
    _learn(model, shadow, gen, 9)  # more than the window: nothing of the snapshot is left
    model.install(run_refit(job))
    assert_matches(model, shadow, _queries(gen, shadow))


@pytest.mark.parametrize("window", [None, 20])
def test_factorizing_a_refreshed_copy_leaves_only_the_last_rows_to_install(window, monkeypatch):
    """The agent's way: fit on the job's rows, factorize over the rows held when the fit is
    back (`refresh_job`), then install: the exact GP of every row, one member at a time."""
    gen = torch.Generator().manual_seed(11)
    model, shadow = _model(window=window)
    _learn(model, shadow, gen, 20)
    job = model.refit_job()
    assert job is not None and len(job.members) == 2
    for part in job.split():
        fit = fit_job(part)
        _learn(model, shadow, gen, 7)  # rows (and, with the window, drops) during the fit
        fresh = model.refresh_job(part)
        assert fresh is not None and model.late_rows(fresh) == 0
        result = factorize_job(fresh, fit)
        _learn(model, shadow, gen, 2)  # rows during the factorization
        assert model.late_rows(fresh) == 2
        monkeypatch.setattr(model, "_rebuild", _no_rebuild)
        report = model.install(result)
        monkeypatch.undo()
        assert report.rebuilt == part.members
        assert torch.equal(model.lengthscale[part.members], fit.lengthscale)
        assert_matches(model, shadow, _queries(gen, shadow))


def test_a_refresh_of_a_stale_job_is_refused_and_due_again():
    gen = torch.Generator().manual_seed(6)
    model, shadow = _model()
    _learn(model, shadow, gen, 12)
    job = model.refit_job()
    model.rebuild()  # a change the copy cannot follow
    assert model.refresh_job(job) is None
    assert model.refit_due[0]


def _no_rebuild(members):
    raise AssertionError(f"an O(n³) rebuild of {members} on install")


def test_drift_waits_for_a_job_in_deferred_mode():
    model, _ = _model(refit_every=None)
    x = torch.tensor([[0.5, 0.0], [2.0, 0.0]], dtype=torch.float64)
    model.learn_one(x, torch.tensor([0.0, 0.0], dtype=torch.float64))
    model.learn_one(x * 0.5, torch.tensor([0.1, 0.1], dtype=torch.float64))
    version = model._buffers.version
    model.learn_one(x * 0.2, torch.tensor([50.0, 50.0], dtype=torch.float64))  # drifted
    assert model._buffers.version == version + 1  # only the append: no rebuild
    job = model.refit_job()
    assert job is not None and job.fit == [False, False]
    model.install(run_refit(job))
    assert float(model.y_mean[0]) == pytest.approx(50.1 / 3)


def test_jitter_raised_by_a_rebuild_reaches_the_appends(monkeypatch):
    """A rebuild that needs jitter must leave the append's cached diagonal with that jitter."""
    gen = torch.Generator().manual_seed(2)
    model, shadow = _model(refit_every=None)
    _learn(model, shadow, gen, 8)
    real_cholesky = torch.linalg.cholesky_ex
    calls = []

    def first_fails(matrix, **kwargs):
        lower, info = real_cholesky(matrix, **kwargs)
        calls.append(1)
        return lower, (info + 1 if len(calls) == 1 else info)

    monkeypatch.setattr(core.gp.rebuild.torch.linalg, "cholesky_ex", first_fails)
    model.rebuild()
    monkeypatch.undo()
    assert (model.jitter > 0).all()
    diag = (model.outputscale + model.noise + model.jitter).tolist()
    assert model._scalars.diag == pytest.approx(diag, rel=1e-15)
    _learn(model, shadow, gen, 3)  # appends with the jitter the factor holds: still exact
    assert_matches(model, shadow, _queries(gen, shadow))
