"""The incremental GP and an MCBO rollout give the same numbers on every device and route.

Each test runs once per route: `cpu` (the BLAS append), `cpu-device-route` (the append CUDA
takes, `core.gp.append.append_rows_on_device`, run on the CPU) and `cuda` (marked `cuda`,
skipped where no CUDA device is usable). Every run is checked against gpytorch's exact
posterior (`tests.test_gp_exact`'s shadow of what the model should know) or, on CUDA, against
the CPU run of the same sequence — so the CPU runs of these very bodies show they can fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from core.gp import GPConfig, IncrementalGP
from core.gp.append import append_rows_on_device, device_route
from core.network import NetworkModel
from policies._optimize import Deadline
from policies.registry import make_policy
from tests.test_gp_exact import (
    Shadow,
    apply,
    assert_matches,
    capped_fits,
    draw_output,
    draw_point,
)
from tests.test_policies_helpers import FAST, chain_spec, random_intervention, truth

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available here")
ROUTES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cpu-device-route", id="cpu-device-route"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, CUDA]),
]
# A CUDA run against the CPU run: the same float64 algebra in another order (cuBLAS/cuSOLVER
# against OpenBLAS/LAPACK), and L-BFGS refits that may take another step on the way.
CUDA_RTOL = 1e-6


@contextlib.contextmanager
def on_route(route: str) -> Iterator[torch.device]:
    """The device of `route`, with the device route forced for `cpu-device-route`."""
    if route == "cpu-device-route":
        with device_route():
            yield torch.device("cpu")
    else:
        yield torch.device(route)


def _model(
    device: torch.device, window: int | None
) -> tuple[IncrementalGP, Shadow, torch.Generator]:
    gen = torch.Generator().manual_seed(20)
    batch, dim = 3, 4
    lower = torch.rand(batch, dim, generator=gen, dtype=torch.float64) * 4 - 2
    upper = lower + 0.5 + torch.rand(batch, dim, generator=gen, dtype=torch.float64) * 3
    config = GPConfig(
        noise_variance=[1e-2, 1e-3, None], refit_every=30, misfit_z=3.0, window=window
    )
    model = IncrementalGP(torch.stack([lower, upper], dim=-1).to(device), config)
    model.set_hyperparameters(
        lengthscale=0.2 + torch.rand(batch, dim, generator=gen, dtype=torch.float64),
        outputscale=0.5 + torch.rand(batch, generator=gen, dtype=torch.float64),
        noise=torch.tensor([1e-2, 1e-3, 1e-2], dtype=torch.float64),
    )
    return model, Shadow(lower, upper, window=window), gen


def _learn_block(model: IncrementalGP, shadow: Shadow, gen: torch.Generator, k: int) -> None:
    xs = torch.stack([draw_point(gen, shadow) for _ in range(k)], dim=1)
    ys = torch.stack([draw_output(gen, xs[:, i], 2.0) for i in range(k)], dim=1)
    masks = torch.rand(xs.shape[0], k, generator=gen) < 0.8
    model.learn_block(xs, ys, masks)
    for i in range(k):
        shadow.observe(xs[:, i], ys[:, i], masks[:, i])


# Every verb of the model in one sequence: appends with masks, blocks, pending points held
# across appends and resolved or dropped, new hyperparameters, refits due by count and by
# misfit, bulk appends; with a window, the O(n²) forgetting of the oldest row.
SEQUENCE = [
    "many",
    *["learn"] * 6,
    "block",
    "pending",
    "learn",
    "pending",
    "block",
    "resolve",
    "learn",
    "drop",
    "hyper",
    "window",
    "refit",
    "pending",
    *["learn"] * 4,
    "block",
    "resolve",
    "window",
    "pending",
    "learn",
]


def _play(route: str, window: int | None) -> tuple[IncrementalGP, Shadow, torch.Tensor]:
    with on_route(route) as device:
        model, shadow, gen = _model(device, window)
        with capped_fits(maxiter=2):
            for op in SEQUENCE:
                if op == "block":
                    _learn_block(model, shadow, gen, 4)
                else:
                    apply(op, model, shadow, gen, 2.0)
        xq = torch.stack([draw_point(gen, shadow) for _ in range(5)], dim=1)
    return model, shadow, xq


@pytest.mark.parametrize("window", [None, 12])
@pytest.mark.parametrize("route", ROUTES)
def test_every_verb_matches_the_exact_gp_on_each_route(route, window):
    model, shadow, xq = _play(route, window)
    assert model.num_observations.sum() > 0 and model.num_pending == 1
    if model.device.type == "cpu":
        assert_matches(model, shadow, xq)  # gpytorch's exact posterior, rtol 1e-8
        return
    reference, _, _ = _play("cpu", window)
    ours = model.posterior(xq.to(model.device), full_covariance=True)
    theirs = reference.posterior(xq, full_covariance=True)
    for name in ("mean", "variance", "covariance"):
        torch.testing.assert_close(
            getattr(ours, name).cpu(), getattr(theirs, name), rtol=CUDA_RTOL, atol=1e-9
        )
    torch.testing.assert_close(
        model.lengthscale.cpu(), reference.lengthscale, rtol=CUDA_RTOL, atol=0
    )


@pytest.mark.parametrize("route", ROUTES)
def test_the_append_reads_each_surprise_and_breakdown_like_the_blas_route(route):
    """Surprises (the misfit schedule's input) and the rebuild after a broken pivot: near
    duplicates at an output scale of 1e10 and no noise lose the pivot² in cancellation
    (tests/test_gp_block.py's recipe), on every route."""
    reports = {}
    for name in ("cpu", route):
        with on_route(name) as device:
            bounds = torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64).expand(2, 2, 2)
            config = GPConfig(
                noise_variance=0.0, refit_every=None, misfit_z=None, drift_tolerance=1e9
            )
            model = IncrementalGP(bounds.to(device), config)
            model.set_hyperparameters(lengthscale=torch.full((2, 2), 5.0), outputscale=1e10)
            surprises = []
            for i in range(9):
                x = torch.full((2, 2), 0.5, dtype=torch.float64) + (1e-3 * i if i < 5 else 1e-9 * i)
                y = torch.tensor([0.1 * i, 0.2 * i], dtype=torch.float64)
                mask = [True, i % 2 == 0]
                surprises.append(model.learn_one(x, y, mask).surprise.cpu())
            reports[name] = (torch.stack(surprises), model.jitter.cpu(), model.num_rows.cpu())
    ours, theirs = reports[route], reports["cpu"]
    assert theirs[1][0] > 0, "the near duplicates must break a pivot down (jitter added)"
    # Rows 3-7 are near duplicates: their surprises are rounding noise on any route, and so is
    # which of them breaks down (with no noise, a pivot² below zero by rounding). On one CPU the
    # two routes broke down at the same row; on another the device route's pivots stayed
    # positive. What holds on every route: the well-conditioned rows agree, every row is kept,
    # and a route that broke down was rebuilt with the same first jitter step.
    torch.testing.assert_close(
        ours[0][:3], theirs[0][:3], rtol=CUDA_RTOL, atol=1e-9, equal_nan=True
    )
    assert torch.equal(ours[2], theirs[2])
    for member in range(2):
        if ours[1][member] > 0 and theirs[1][member] > 0:
            assert ours[1][member] == theirs[1][member]


def _two_members(device: torch.device, noise: float | None) -> IncrementalGP:
    bounds = torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64).expand(2, 2, 2)
    config = GPConfig(noise_variance=noise, refit_every=None, misfit_z=None, drift_tolerance=1e9)
    model = IncrementalGP(bounds.to(device), config)
    model.set_hyperparameters(lengthscale=torch.full((2, 2), 0.5), outputscale=1.0)
    return model


def _rows() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Six (x, y) rows for both members, then row 2's input again with another output."""
    xs = torch.stack([torch.linspace(0.1, 0.9, 6), torch.linspace(0.8, 0.2, 6)], dim=-1)
    xs = xs.to(torch.float64).unsqueeze(0).expand(2, 6, 2)
    ys = torch.sin(6 * xs).sum(-1) * torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    rows = [(xs[:, i], ys[:, i]) for i in range(6)]
    return [*rows, (xs[:, 2], ys[:, 2] + 0.05)]


@pytest.mark.parametrize("route", ROUTES)
def test_a_pivot_far_below_zero_is_caught_and_rebuilt_on_every_route(route):
    """A factor that no longer matches its kernel matrix — member 0's halved, as accumulated
    rounding would leave it, only further — makes the next pivot² of a repeated input about
    1.01 − 4·0.99 < 0: a breakdown by construction, not by rounding, which every route must
    flag. Member 0 is rebuilt from its rows (with jitter) and then equals an uncorrupted model
    whose noise includes that jitter; member 1 is left alone."""
    rows = _rows()
    with on_route(route) as device:
        model = _two_members(device, noise=1e-2)
        for x, y in rows[:6]:
            model.learn_one(x.to(device), y.to(device))
        model._buffers.factor[0, :6, :6] *= 0.5  # L·Lᵀ = (K + σ²I)/4 for member 0
        x, y = rows[6]
        report = model.learn_one(x.to(device), y.to(device))
        jitter = model.jitter.cpu()
        assert jitter[0] > 0 and jitter[1] == 0, "member 0 broke down, member 1 did not"
        assert torch.isfinite(report.surprise[1].cpu())
        assert model.num_rows.cpu().tolist() == [7, 7]

        clean = _two_members(device, noise=None)
        clean.set_hyperparameters(noise=(model.noise + model.jitter).cpu())
        for x, y in rows:
            clean.learn_one(x.to(device), y.to(device))
        probe = torch.rand(2, 5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        ours = model.posterior(probe.to(device))
        theirs = clean.posterior(probe.to(device))
    rtol = 1e-8 if route != "cuda" else CUDA_RTOL
    for name in ("mean", "variance"):
        torch.testing.assert_close(
            getattr(ours, name).cpu(), getattr(theirs, name).cpu(), rtol=rtol, atol=1e-10
        )


@pytest.mark.cuda
@CUDA
def test_the_cuda_append_never_synchronizes_with_the_host():
    """`append_rows_on_device` queues its work: no `.item()`, no D2H copy, no pageable H2D."""
    bounds = torch.tensor([[0.0, 1.0]] * 3, dtype=torch.float64).expand(4, 3, 2).cuda()
    model = IncrementalGP(bounds, GPConfig(noise_variance=1e-2, refit_every=None, misfit_z=None))
    model.learn_many(
        torch.rand(4, 40, 3, dtype=torch.float64), torch.rand(4, 40, dtype=torch.float64)
    )
    model.reserve(64)
    buffers = model._buffers
    z = torch.rand(4, 3, dtype=torch.float64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        surprise, broken = append_rows_on_device(
            buffers,
            z,
            [0.1, 0.2, 0.3, 0.4],
            [0, 1, 3],
            model.lengthscale,
            model.outputscale,
            model.config.kernel,
            model._scalars,
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert surprise.device.type == "cuda" and not broken.any()


@pytest.mark.parametrize("route", ROUTES)
def test_an_mcbo_rollout_with_1024_samples_matches_the_cpu(route):
    """MCBO's hallucinated reward (constant η, 1,024 QMC noise draws) at fixed actions."""
    spec = chain_spec(noise=0.2, nodes=4)
    values = {}
    for name in dict.fromkeys(("cpu", route)):
        with on_route(name) as device:
            model = NetworkModel(spec, device=device)
            generator = torch.Generator().manual_seed(0)
            for _ in range(6):
                intervention = random_intervention(spec, generator)
                model.learn(intervention, truth(spec, intervention))
            policy = make_policy("mcbo", spec, {**FAST["mcbo"], "mc_samples": 1024})
            problem = policy.problem(model, 0, Deadline(60.0))
            assert problem.eps.shape[0] == 1024
            actions = torch.rand(
                16, len(spec.action_names), generator=generator, dtype=torch.float64
            )
            eta = (
                2
                * torch.rand(
                    16, len(problem.eta_nodes(())), generator=generator, dtype=torch.float64
                )
                - 1
            )
            reward = problem.optimistic_reward(actions.to(device), eta.to(device), (), 1.5)
            values[name] = reward.cpu()
    assert values["cpu"].std() > 1e-3  # the reward moves with the actions
    torch.testing.assert_close(values[route], values["cpu"], rtol=CUDA_RTOL, atol=1e-9)
