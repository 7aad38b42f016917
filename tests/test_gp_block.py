"""Block appends (`IncrementalGP.learn_block`, `NetworkModel.observe_many`) equal row appends.

A block of k rows per member is one pass over each member's factor instead of k; the model it
leaves must be the one the sequential appends leave, with the window/drift/refit schedule run
once at the end of the block, and the exact GP of the data it holds.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import core.blas
import core.gp.model
from agent.experiment import RoundStatus
from core.gp import GPConfig, IncrementalGP, LearnReport
from core.network import NetworkModel
from tests.test_agent_join import ack, chain_spec, reading, world
from tests.test_gp_exact import (
    assert_matches,
    capped_fits,
    draw_output,
    draw_point,
    learn,
    random_model,
)

RTOL = 1e-10


def sequential(
    model: IncrementalGP, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, *, refit: bool
) -> LearnReport:
    """What `learn_block` promises to equal: `learn_one(refit=False)` row by row, then the
    window/drift/refit schedule once (the window and drift held off until then)."""
    config = model.config
    model.config = dataclasses.replace(config, window=None, drift_tolerance=math.inf)
    try:
        for i in range(x.shape[1]):
            model.learn_one(x[:, i], y[:, i], mask[:, i], refit=False)
    finally:
        model.config = config
    with model._pending_detached():
        return model._after_new_data(refit)


def draw_block(gen, shadow, offset: float, k: int, batch: int):
    x = torch.stack([draw_point(gen, shadow) for _ in range(k)], dim=1)  # (b, k, d)
    y = torch.stack([draw_output(gen, x[:, i], offset) for i in range(k)], dim=1)  # (b, k)
    mask = torch.rand(batch, k, generator=gen) < 0.75
    return x, y, mask


def assert_same_posterior(ours: IncrementalGP, theirs: IncrementalGP, xq: torch.Tensor) -> None:
    a = ours.posterior(xq, full_covariance=True)
    b = theirs.posterior(xq, full_covariance=True)
    prior = float((theirs.outputscale * theirs.y_scale**2).max())
    for name, mine, ref, atol in (
        ("mean", a.mean, b.mean, RTOL * prior**0.5),
        ("variance", a.variance, b.variance, RTOL * prior),
        ("covariance", a.covariance, b.covariance, RTOL * prior),
    ):
        torch.testing.assert_close(
            mine, ref, rtol=RTOL, atol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


def start_model(data, *, known: bool, window=None, refit_every=None, misfit_z=None):
    batch = data.draw(st.integers(1, 3), label="batch")
    dim = data.draw(st.integers(1, 4), label="dim")
    model, shadow, gen = random_model(
        data.draw, batch, dim, window, known, refit_every=refit_every, misfit_z=misfit_z
    )
    offset = data.draw(st.floats(-20, 20), label="output offset")
    for _ in range(data.draw(st.integers(0, 40), label="n0")):
        learn(model, shadow, gen, offset)
    return model, shadow, gen, offset, batch


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_block_equals_sequential_appends(data):
    """Random blocks (k = 1..6, random masks), pending points, both kernels, both noises."""
    window = data.draw(st.sampled_from([None, None, 25]), label="window")
    refit_every = data.draw(st.sampled_from([None, None, 7]), label="refit every")
    misfit_z = data.draw(st.sampled_from([None, 2.0]), label="misfit z")
    known = data.draw(st.booleans(), label="known noise")
    with capped_fits(maxiter=2):
        model, shadow, gen, offset, batch = start_model(
            data, known=known, window=window, refit_every=refit_every, misfit_z=misfit_z
        )
        twin = copy.deepcopy(model)
        for _ in range(data.draw(st.integers(1, 4), label="blocks")):
            if data.draw(st.booleans(), label="pending"):
                x, mask = draw_point(gen, shadow), torch.rand(batch, generator=gen) < 0.8
                assert model.add_pending(x, mask) == twin.add_pending(x, mask)
            k = data.draw(st.integers(1, 6), label="k")
            x, y, mask = draw_block(gen, shadow, offset, k, batch)
            refit = data.draw(st.booleans(), label="refit")
            ours = model.learn_block(x, y, mask, refit=refit)
            theirs = sequential(twin, x, y, mask, refit=refit)
            assert (ours.refit, ours.rebuilt, ours.forgotten) == (
                theirs.refit,
                theirs.rebuilt,
                theirs.forgotten,
            )
            assert ours.surprise.shape == (batch,)
            assert torch.isnan(ours.surprise[~mask.any(1)]).all()
            ours, theirs = model._buffers, twin._buffers
            assert ours.real == theirs.real and ours.rows == theirs.rows
    assert torch.equal(model.y_mean, twin.y_mean) and torch.equal(model.y_scale, twin.y_scale)
    xq = torch.stack([draw_point(gen, shadow) for _ in range(5)], dim=1)
    assert_same_posterior(model, twin, xq)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_block_matches_exact_gp(data):
    """After blocks (and pending points, a window), the gpytorch ExactGP posterior to 1e-8."""
    window = data.draw(st.sampled_from([None, 20]), label="window")
    model, shadow, gen, offset, batch = start_model(
        data, known=data.draw(st.booleans(), label="known noise"), window=window
    )
    for _ in range(data.draw(st.integers(1, 5), label="blocks")):
        if data.draw(st.booleans(), label="pending"):
            x, mask = draw_point(gen, shadow), torch.rand(batch, generator=gen) < 0.8
            shadow.pending[model.add_pending(x, mask)] = (x, mask)
        x, y, mask = draw_block(gen, shadow, offset, data.draw(st.integers(1, 6)), batch)
        model.learn_block(x, y, mask)
        for i in range(x.shape[1]):
            shadow.observe(x[:, i], y[:, i], mask[:, i])
    assert_matches(model, shadow, torch.stack([draw_point(gen, shadow) for _ in range(4)], 1))


@pytest.mark.parametrize("block_rows", [1, 3, 64])
def test_a_block_longer_than_block_rows_is_split_and_still_equals_appends(monkeypatch, block_rows):
    """A backlog's block (k = 10 here) is appended BLOCK_ROWS rows at a time, members learning
    different rows in each part; the model equals the row-by-row appends all the same."""
    monkeypatch.setattr(core.gp.model, "BLOCK_ROWS", block_rows)
    model = IncrementalGP(
        torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64).expand(3, 2, 2),
        GPConfig(
            noise_variance=[0.01, None, 0.1], refit_every=None, misfit_z=None, drift_tolerance=1e9
        ),
    )
    gen = torch.Generator().manual_seed(11)
    for _ in range(5):
        x, y = torch.rand(3, 2, generator=gen, dtype=torch.float64), torch.randn(3, generator=gen)
        model.learn_one(x, y.double())
    twin = copy.deepcopy(model)
    x = torch.rand(3, 10, 2, generator=gen, dtype=torch.float64)
    y = torch.randn(3, 10, generator=gen).double()
    mask = torch.rand(3, 10, generator=gen) < 0.6
    mask[2] = False
    mask[2, 9] = True  # a member whose one row is in the last part
    ours = model.learn_block(x, y, mask, refit=False)
    single = [twin.learn_one(x[:, i], y[:, i], mask[:, i], refit=False).surprise for i in range(10)]
    assert model._buffers.rows == twin._buffers.rows == [5 + int(m.sum()) for m in mask]
    expected = torch.stack(single).nan_to_num(-math.inf).max(0).values
    torch.testing.assert_close(ours.surprise, expected, rtol=1e-10, atol=1e-12)
    assert_same_posterior(model, twin, torch.rand(3, 4, 2, generator=gen, dtype=torch.float64))


def test_block_surprise_is_each_members_largest():
    model = IncrementalGP(
        torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64).expand(3, 2, 2),
        GPConfig(noise_variance=0.01, refit_every=None, misfit_z=None, drift_tolerance=1e9),
    )
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(3)
    x, y = torch.rand(3, 4, 2, generator=gen, dtype=torch.float64), torch.randn(3, 4, generator=gen)
    mask = torch.tensor([[True] * 4, [False, True, False, True], [False] * 4])
    report = model.learn_block(x, y.double(), mask)
    single = [twin.learn_one(x[:, i], y[:, i].double(), mask[:, i]).surprise for i in range(4)]
    expected = torch.stack(single).nan_to_num(-1.0).max(0).values
    torch.testing.assert_close(report.surprise[:2], expected[:2], rtol=1e-12, atol=0)
    assert math.isnan(float(report.surprise[2]))


def test_torch_fallback_equals_blas():
    """Without raw pointers or BLAS (another device), torch does the block's solve."""
    gen = torch.Generator().manual_seed(5)
    bounds = torch.tensor([[-1.0, 2.0]] * 3, dtype=torch.float64).expand(2, 3, 2)
    config = GPConfig(noise_variance=[0.01, None], refit_every=None, misfit_z=None)
    model = IncrementalGP(bounds, config)
    xs, ys = torch.rand(2, 30, 3, generator=gen, dtype=torch.float64), torch.randn(2, 30)
    model.learn_many(xs, ys.double())
    twin = copy.deepcopy(model)
    x, y = torch.rand(2, 5, 3, generator=gen, dtype=torch.float64), torch.randn(2, 5).double()
    mask = torch.rand(2, 5, generator=gen) < 0.7
    model.learn_block(x, y, mask)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core.blas, "_raw_usable", lambda *tensors: False)
        patch.setattr(core.blas, "_blas_usable", lambda buffer, rhs: False)
        twin.learn_block(x, y, mask)
    assert_same_posterior(model, twin, torch.rand(2, 6, 3, generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_breakdown_falls_back_to_appends(dtype):
    """Duplicate inputs with a tiny noise: the block is not numerically positive definite, the
    member's rows go through the appends (jitter, rebuild) and stay finite and equal to them."""
    model = IncrementalGP(
        torch.tensor([[0.0, 1.0]] * 2, dtype=dtype),
        GPConfig(noise_variance=0.0, refit_every=None, misfit_z=None, drift_tolerance=1e9),
    )
    # An output scale of 1e10 (float64) or 1e3 (float32) puts the noise floor below the
    # rounding of k(x, x): a duplicate's pivot² is lost in cancellation.
    outputscale = 1e10 if dtype == torch.float64 else 1e3
    model.set_hyperparameters(lengthscale=torch.full((1, 2), 5.0), outputscale=outputscale)
    # Earlier rows that need no jitter: jitter an earlier append added reaches the block's
    # diagonal too (as it must) and makes the float32 duplicates below positive definite.
    start, step = (0.5, 1e-3) if dtype == torch.float64 else (0.1, 0.2)
    x = torch.full((1, 2), start, dtype=dtype)
    for i in range(5):
        model.learn_one(x + step * i, torch.tensor([0.1 * i], dtype=dtype))
    assert float(model.jitter[0]) == 0.0
    twin = copy.deepcopy(model)
    block = (x + 1e-9 * torch.arange(6, dtype=dtype).reshape(6, 1)).unsqueeze(0)  # (1, 6, 2)
    y = (1.0 + 1e-7 * torch.arange(6, dtype=dtype)).unsqueeze(0)
    calls = []
    original = model._append
    model._append = lambda *args: calls.append(args) or original(*args)
    model.learn_block(block, y)
    del model._append
    assert len(calls) == 6  # the whole block went row by row
    sequential(twin, block, y, torch.ones(1, 6, dtype=torch.bool), refit=True)
    assert float(model.jitter[0]) > 0 and torch.equal(model.jitter, twin.jitter)
    xq = torch.rand(1, 8, 2, dtype=dtype)
    post, ref = model.posterior(xq), twin.posterior(xq)
    assert torch.isfinite(post.mean).all() and torch.isfinite(post.variance).all()
    torch.testing.assert_close(post.mean, ref.mean, rtol=RTOL, atol=0)
    torch.testing.assert_close(post.variance, ref.variance, rtol=RTOL, atol=0)


def test_block_errors_raise_value_error_and_learn_nothing():
    model = IncrementalGP(torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64).expand(2, 2, 2))
    x, y = torch.rand(2, 3, 2, dtype=torch.float64), torch.rand(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="x must have shape"):
        model.learn_block(x[:, 0], y)  # (b, d): not a block
    with pytest.raises(ValueError, match="x must have shape"):
        model.learn_block(x[..., :1], y)
    with pytest.raises(ValueError, match="y must have shape"):
        model.learn_block(x, y[:, :2])
    with pytest.raises(ValueError, match="mask must be"):
        model.learn_block(x, y, torch.ones(2, 2, dtype=torch.bool))
    bad_x, bad_y = x.clone(), y.clone()
    bad_x[1, 2, 0], bad_y[0, 1] = math.nan, math.inf
    with pytest.raises(ValueError, match="x holds NaN"):
        model.learn_block(bad_x, y)
    with pytest.raises(ValueError, match="y holds NaN"):
        model.learn_block(x, bad_y)
    assert model.num_observations.tolist() == [0, 0]
    mask = torch.tensor([[True, False, True], [True, True, False]])
    model.learn_block(bad_x, bad_y, mask)  # NaN only where nothing is learned: fine
    assert model.num_observations.tolist() == [2, 2]


# ---------------------------------------------------------------------- the network model


def node_posteriors(model: NetworkModel, seed: int) -> list[torch.Tensor]:
    """Each node's posterior mean and std at a few random inputs (the same for a given seed)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for node in model.order:
        inputs = torch.rand(5, model.inputs[node].width, generator=gen, dtype=torch.float64)
        out += list(model.node_posterior(node, inputs))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_observe_many_equals_sequential_observe(data):
    """Readings of several rounds, split into pieces, batched: rows complete at any point."""
    intervention = data.draw(st.sampled_from(["soft", "hard"]), label="intervention")
    spec = chain_spec(intervention)
    ours, theirs = NetworkModel(spec), NetworkModel(spec)
    if data.draw(st.booleans(), label="flat model"):
        ours.flat_model(), theirs.flat_model()
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    pieces: list[tuple[int, dict[str, float]]] = []
    for _ in range(data.draw(st.integers(1, 8), label="rounds")):
        action = {"u": float(torch.rand(1, generator=gen)) * 2 - 1}
        if intervention == "hard" and data.draw(st.booleans()):
            action = {}
        number = ours.start_round(action)
        assert theirs.start_round(action) == number
        a = float(torch.rand(1, generator=gen))
        values = {"A": a, "B": a + action.get("u", 0.0), "C": 2 * a + 0.1}
        nodes = data.draw(st.permutations(sorted(values)))
        cuts = sorted(data.draw(st.sets(st.integers(1, 2), max_size=2)))
        for start, stop in zip([0, *cuts], [*cuts, 3], strict=True):
            pieces.append((number, {n: values[n] for n in nodes[start:stop]}))
    pieces = data.draw(st.permutations(pieces), label="arrival order")
    cuts = sorted(data.draw(st.sets(st.integers(1, len(pieces)), max_size=4), label="batches"))
    for start, stop in zip([0, *cuts], [*cuts, len(pieces)], strict=True):
        batch = pieces[start:stop]
        if not batch:
            continue
        ours.observe_many(batch)
        for number, readings in batch:
            theirs.observe(number, readings)
    assert ours.gp.num_observations.tolist() == theirs.gp.num_observations.tolist()
    for j in range(len(ours.order)):  # the same rows, in the same order
        (z, y), (z_ref, y_ref) = ours.gp.member_data(j), theirs.gp.member_data(j)
        assert torch.equal(z, z_ref)
        # y is stored as mean + scale·ỹ under the standardization of the moment: a drift
        # mid-batch in one model only changes its last bits
        torch.testing.assert_close(y, y_ref, rtol=1e-14, atol=1e-14)
    assert [r.learned for r in ours.history] == [r.learned for r in theirs.history]
    assert [r.readings for r in ours.history] == [r.readings for r in theirs.history]
    # Drift may have fired mid-batch for the rounds taught one by one, at the batch's end for
    # the block: the same data under the same standardization give the same posterior.
    ours.gp.restandardize(), theirs.gp.restandardize()
    for mine, ref in zip(node_posteriors(ours, 7), node_posteriors(theirs, 7), strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-9, atol=1e-12)
    if ours._flat is not None:  # learned round by round, in the same order
        assert [r.in_flat for r in ours.history] == [r.in_flat for r in theirs.history]
        assert torch.equal(ours._flat.member_data(0)[0], theirs._flat.member_data(0)[0])
        xq = torch.rand(1, 4, ours.flat_dim, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(
            ours.flat_model().posterior(xq).mean, theirs.flat_model().posterior(xq).mean
        )


def test_observe_many_merges_the_report_and_learns_rounds_before_a_bad_reading():
    model = NetworkModel(chain_spec())
    first, second = model.start_round({"u": 0.1}), model.start_round({"u": -0.3})
    report = model.observe_many(
        [(first, {"A": 0.2, "B": 0.4}), (second, {"A": 0.5}), (first, {"C": 0.7})]
    )
    assert model.gp.num_observations.tolist() == [2, 1, 1]
    assert report.surprise.shape == (3,) and torch.isfinite(report.surprise).all()
    assert model.history[first].learned == {"A", "B", "C"}
    with pytest.raises(ValueError, match="not finite"):
        model.observe_many([(second, {"B": 0.1}), (second, {"C": math.nan})])
    assert model.gp.num_observations.tolist() == [2, 2, 1]  # B of the second round learned
    with pytest.raises(KeyError, match="unknown node"):
        model.observe_many([(second, {"Z": 0.0})])


# ---------------------------------------------------------------------- the agent


def test_a_batch_of_rounds_teaches_once_and_closes_each_round():
    exp, _, _, truth = world(3, seed=11)  # pipelined: each round starts as a pending point
    for r in range(3):
        exp.on_ack(ack(exp, r))
    calls = []
    observe_many = exp.model.observe_many
    exp.model.observe_many = lambda batch, **kw: calls.append(batch) or observe_many(batch, **kw)
    batch = [
        reading(exp, r, n, truth[(r, n)], 10 * r + i) for r in range(3) for i, n in enumerate("ABC")
    ]
    assert {v.outcome for v in exp.on_readings(batch)} == {"accepted"}
    assert len(calls) == 1 and [number for number, _ in calls[0]] == [0, 1, 2]
    assert exp.model.gp.num_observations.tolist() == [3, 3, 3]
    assert exp.model.gp.num_pending == 0
    assert all(exp.rounds[r].status is RoundStatus.CLOSED for r in range(3))
    assert exp.regret.last_reward_round == 2


def test_a_failed_block_falls_back_to_teaching_round_by_round():
    exp, _, _, truth = world(2, seed=12)
    for r in range(2):
        exp.on_ack(ack(exp, r))

    def broken(batch, **kw):
        raise RuntimeError("block failed")

    exp.model.observe_many = broken
    batch = [
        reading(exp, r, n, truth[(r, n)], 10 * r + i) for r in range(2) for i, n in enumerate("ABC")
    ]
    exp.on_readings(batch)
    assert exp.model.gp.num_observations.tolist() == [2, 2, 2]  # taught one round at a time
    assert all(exp.rounds[r].status is RoundStatus.CLOSED for r in range(2))
