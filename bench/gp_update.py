"""`cbo-agent bench gp-update`: the cost of one posterior update, four ways, in one run.

For each size n and batch b (1 and --batch) on the same data and hyperparameters:
  (a) append        this project's row append (`IncrementalGP.learn_one`), O(n²)
  (c) refactor      a full rebuild: kernel matrix and Cholesky of n+1 rows, O(n³) — the
                    alternative an exact GP has; c/a leads the table
  (b) botorch       `SingleTaskGP.condition_on_observations` (caches built beforehand); it goes
                    through gpytorch's QR-based row update, so b/a mostly measures gpytorch
  (d) solve         the O(n²) floor: one triangular solve of size n per member through the same
                    BLAS routine the append calls (`core.blas.solve_lower_in_buffer_`, reading a
                    factor in a buffer with the model's row stride), no kernel row, no writes;
                    on CUDA a bare batched `torch.linalg.solve_triangular` of size n
`--device cpu cuda` measures each size on every device in one run (rows name the device and its
hardware); on CUDA each timed call ends with `torch.cuda.synchronize`, so a time is the work
done, not the work queued. `--no-botorch` skips (b) and its check (n = 20,000 on a GPU).
Before timing BoTorch, its posterior mean *and variance* on the same data and hyperparameters are
checked against ours, with gpytorch held to exact solves (Cholesky at every size, no LOVE
variances, no CG): the comparison is like for like, and the largest relative differences are
reported.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import gpytorch
import torch
from botorch.models import SingleTaskGP
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.means import ZeroMean
from rich.console import Console

from bench.report import (
    device_info,
    machine_info,
    print_table,
    progress_bar,
    wide_console,
    write_json,
)
from core.blas import solve_lower_in_buffer_
from core.devices import resolve_device
from core.gp import GPConfig, IncrementalGP

NOISE = 1e-2
_CPU = torch.device("cpu")


@dataclass
class UpdateTiming:
    """One row of the benchmark's JSON (seconds are medians over repetitions)."""

    n: int
    batch: int
    append_s: float
    botorch_condition_s: float | None  # None: --no-botorch
    refactor_s: float
    triangular_solve_s: float
    bytes_per_node: int
    mean_rel_diff: float | None  # largest |ours − BoTorch exact| / scale over the probe points
    variance_rel_diff: float | None
    device: str = "cpu"
    device_name: str = ""

    @property
    def botorch_over_append(self) -> float:
        if self.botorch_condition_s is None:
            return float("nan")
        return self.botorch_condition_s / self.append_s

    @property
    def refactor_over_append(self) -> float:
        return self.refactor_s / self.append_s

    @property
    def append_over_solve(self) -> float:
        return self.append_s / self.triangular_solve_s


def _median_seconds(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    """Median wall time of `fn`; on CUDA each call waits for the work it queued."""
    wait = torch.cuda.synchronize if device.type == "cuda" else lambda _device: None
    times = []
    wait(device)
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        wait(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _build_model(x: torch.Tensor, y: torch.Tensor, reserve: int) -> IncrementalGP:
    batch, _, dim = x.shape
    bounds = torch.tensor([[0.0, 1.0]] * dim, dtype=x.dtype, device=x.device)
    bounds = bounds.expand(batch, dim, 2)
    model = IncrementalGP(bounds, GPConfig(noise_variance=NOISE, refit_every=None, misfit_z=None))
    model.set_hyperparameters(
        lengthscale=torch.full((batch, dim), 0.3, dtype=x.dtype),
        outputscale=torch.ones(batch, dtype=x.dtype),
    )
    model.reserve(reserve)
    model.learn_many(x, y, refit=False)
    return model


@dataclass(frozen=True)
class _Fitted:
    """What the BoTorch twin copies from our model: hyperparameters and standardization."""

    lengthscale: torch.Tensor  # (b, d)
    outputscale: torch.Tensor  # (b,)
    noise: torch.Tensor  # (b,) standardized units
    y_mean: torch.Tensor  # (b,)
    y_scale: torch.Tensor  # (b,)

    @classmethod
    def of(cls, model: IncrementalGP) -> _Fitted:
        return cls(
            model.lengthscale.clone(),
            model.outputscale.clone(),
            model.noise.clone(),
            model.y_mean.clone(),
            model.y_scale.clone(),
        )


def _botorch_twin(fitted: _Fitted, x: torch.Tensor, y: torch.Tensor) -> SingleTaskGP:
    """A SingleTaskGP with the same data, standardization and hyperparameters as our model."""
    batch, _, dim = x.shape
    batch_shape = torch.Size([batch]) if batch > 1 else torch.Size()
    covar = ScaleKernel(
        MaternKernel(nu=2.5, ard_num_dims=dim, batch_shape=batch_shape), batch_shape=batch_shape
    ).to(x)
    covar.base_kernel.lengthscale = fitted.lengthscale.reshape(covar.base_kernel.lengthscale.shape)
    covar.outputscale = fitted.outputscale.reshape(covar.outputscale.shape)
    y_std = ((y - fitted.y_mean[:, None]) / fitted.y_scale[:, None]).unsqueeze(-1)
    noise = fitted.noise[:, None, None].expand_as(y_std)
    twin = SingleTaskGP(
        _unbatch(x),
        _unbatch(y_std),
        _unbatch(noise),
        covar_module=covar,
        mean_module=ZeroMean(batch_shape=batch_shape),
        outcome_transform=None,
        input_transform=None,
    )
    twin.eval()
    return twin


def _unbatch(t: torch.Tensor) -> torch.Tensor:
    """BoTorch models a single GP without a batch dimension."""
    return t[0] if t.shape[0] == 1 else t


def _standardized_moments(
    model: IncrementalGP, probe: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, q) posterior mean and variance of the latent function, in standardized units."""
    post = model.posterior(probe)
    scale = model.y_scale[:, None]
    return (post.mean - model.y_mean[:, None]) / scale, post.variance / scale**2


def _exact_gpytorch() -> contextlib.ExitStack:
    """gpytorch held to exact solves: Cholesky at every size, no LOVE, no CG."""
    stack = contextlib.ExitStack()
    stack.enter_context(gpytorch.settings.fast_pred_var(False))
    stack.enter_context(
        gpytorch.settings.fast_computations(
            covar_root_decomposition=False, log_prob=False, solves=False
        )
    )
    stack.enter_context(gpytorch.settings.max_cholesky_size(10**9))
    return stack


def measure(
    n: int,
    batch: int,
    dim: int,
    reps: int,
    slow_reps: int,
    seed: int,
    device: str = "cpu",
    botorch: bool = True,
) -> UpdateTiming:
    """Time the four updates at one size, on `device` (the same data on every device).

    Our model and BoTorch's are built one after the other (the first freed before the second:
    at n = 4000 and a batch of 8, BoTorch alone needs ~10 GB). Before BoTorch is timed, its
    posterior mean on the same data is checked against ours: the comparison is like for like.
    """
    gen = torch.Generator().manual_seed(seed)
    total = n + reps + 1
    x = torch.rand(batch, total, dim, generator=gen, dtype=torch.float64)
    y = torch.sin(6 * x).sum(-1) + 0.1 * torch.randn(
        batch, total, generator=gen, dtype=torch.float64
    )
    probe = torch.rand(batch, 5, dim, generator=gen, dtype=torch.float64)
    where = resolve_device(device)
    x, y, probe = x.to(where), y.to(where), probe.to(where)

    ours = _time_ours(x, y, n, probe, reps, slow_reps)
    gc.collect()  # our model is gone before BoTorch's is built
    botorch_s = mean_diff = var_diff = None
    if botorch:
        botorch_s, mean_diff, var_diff = _time_botorch(ours, x, y, n, probe, slow_reps)
    gc.collect()
    solve_s = _floor_seconds(n, batch, ours.capacity, reps, gen, where)
    if where.type == "cuda":
        torch.cuda.empty_cache()
    return UpdateTiming(
        n,
        batch,
        ours.append_s,
        botorch_s,
        ours.refactor_s,
        solve_s,
        ours.bytes_per_node,
        mean_diff,
        var_diff,
        **device_info(device),
    )


def _floor_seconds(
    n: int,
    batch: int,
    capacity: int,
    reps: int,
    gen: torch.Generator,
    device: torch.device = _CPU,
) -> float:
    """One size-n triangular solve per member through the append's BLAS routine, in a buffer
    laid out as the model's (b, capacity, capacity); the right-hand side is restored first,
    as the append copies its kernel row in (O(n), beside the O(n²) solve). On CUDA: one bare
    batched `torch.linalg.solve_triangular` of (b, n, n) contiguous factors, the issue's
    yardstick for the append."""
    if device.type != "cpu":
        lower = torch.linalg.cholesky(
            torch.eye(n, dtype=torch.float64) + 0.1 * torch.ones(n, n, dtype=torch.float64)
        ).to(device)
        factors = lower.expand(batch, n, n).contiguous()
        rhs = torch.randn(batch, n, 1, generator=gen, dtype=torch.float64).to(device)
        return _median_seconds(
            lambda: torch.linalg.solve_triangular(factors, rhs, upper=False), reps, device
        )
    lower = torch.linalg.cholesky(
        torch.eye(n, dtype=torch.float64) + 0.1 * torch.ones(n, n, dtype=torch.float64)
    )
    buffer = torch.eye(capacity, dtype=torch.float64).expand(batch, capacity, capacity).clone()
    buffer[:, :n, :n] = lower
    source = torch.randn(batch, n, generator=gen, dtype=torch.float64)
    rhs = source.clone()

    def solve() -> None:
        rhs.copy_(source)
        for j in range(batch):
            solve_lower_in_buffer_(buffer[j], n, rhs[j])

    return _median_seconds(solve, reps, device)


@dataclass(frozen=True)
class _OurTimings:
    fitted: _Fitted
    probe_mean: torch.Tensor  # (b, 5) standardized posterior mean on the first n rows
    probe_variance: torch.Tensor  # (b, 5) standardized posterior variance, same
    append_s: float
    refactor_s: float
    bytes_per_node: int
    capacity: int  # rows the model's buffers hold per member (the factor's row stride)


def _time_ours(
    x: torch.Tensor, y: torch.Tensor, n: int, probe: torch.Tensor, reps: int, slow_reps: int
) -> _OurTimings:
    model = _build_model(x[:, :n], y[:, :n], reserve=x.shape[1])
    fitted = _Fitted.of(model)
    probe_mean, probe_variance = _standardized_moments(model, probe)
    cursor = iter(range(n, x.shape[1]))

    def append() -> None:
        i = next(cursor)
        model.learn_one(x[:, i], y[:, i], refit=False)

    append_s = _median_seconds(append, reps, x.device)
    refactor_s = _median_seconds(model.rebuild, slow_reps, x.device)
    per_node = model.memory_bytes() // x.shape[0]
    capacity = model._buffers.capacity
    return _OurTimings(fitted, probe_mean, probe_variance, append_s, refactor_s, per_node, capacity)


def _time_botorch(
    ours: _OurTimings,
    x: torch.Tensor,
    y: torch.Tensor,
    n: int,
    probe: torch.Tensor,
    slow_reps: int,
) -> tuple[float, float, float]:
    """BoTorch's update time, after its exact posterior is checked against ours; returns it
    with the largest relative differences of the mean and of the variance."""
    batch = x.shape[0]
    twin = _botorch_twin(ours.fitted, x[:, :n], y[:, :n])
    with _exact_gpytorch():
        post = twin.posterior(_unbatch(probe))  # also builds its caches
        mean, variance = post.mean.reshape(batch, 5), post.variance.reshape(batch, 5)
    mean_diff = float(
        ((ours.probe_mean - mean).abs() / ours.fitted.outputscale.sqrt()[:, None]).max()
    )
    var_diff = float(
        ((ours.probe_variance - variance).abs() / variance.abs().clamp_min(1e-12)).max()
    )
    if mean_diff > 1e-6 or var_diff > 1e-6:
        raise AssertionError(
            f"our model and BoTorch's exact posterior disagree on the same data: mean "
            f"{ours.probe_mean} vs {mean}, variance {ours.probe_variance} vs {variance}"
        )
    x_new, y_new = _unbatch(x[:, n : n + 1]), _unbatch(y[:, n : n + 1, None])
    noise = torch.full_like(y_new, float(ours.fitted.noise[0]))
    seconds = _median_seconds(
        lambda: twin.condition_on_observations(x_new, y_new, noise=noise), slow_reps, x.device
    )
    return seconds, mean_diff, var_diff


def plot(rows: Sequence[UpdateTiming], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({row.batch for row in rows})
    devices = list(dict.fromkeys(row.device for row in rows))
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4.5), squeeze=False)
    series = [
        ("append_s", "append (this project)"),
        ("botorch_condition_s", "BoTorch condition_on_observations"),
        ("refactor_s", "full Cholesky refactorization"),
        ("triangular_solve_s", "O(n²) floor: the append's BLAS triangular solve"),
    ]
    for ax, batch in zip(axes[0], batches, strict=True):
        for device in devices:
            chosen = sorted(
                (r for r in rows if r.batch == batch and r.device == device), key=lambda r: r.n
            )
            for field, label in series:
                points = [(r.n, getattr(r, field)) for r in chosen if getattr(r, field)]
                if points:
                    tag = f"{label} [{device}]" if len(devices) > 1 else label
                    ax.loglog(*zip(*points, strict=True), "o-", label=tag)
        ax.set_title(f"one posterior update, batch of {batch} GP{'s' if batch > 1 else ''}")
        ax.set_xlabel("observations n")
        ax.set_ylabel("seconds (median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(
    sizes: Sequence[int],
    dim: int,
    batch: int,
    json_path: Path | None,
    plot_path: Path | None,
    reps: int = 25,
    slow_reps: int = 3,
    console: Console | None = None,
    devices: Sequence[str] = ("cpu",),
    botorch: bool = True,
) -> list[UpdateTiming]:
    """Measure every size for a single GP and for a batch, on every device (the same data);
    print, save JSON and a plot."""
    console = console or wide_console()
    batches = sorted({1, batch})
    rows: list[UpdateTiming] = []
    with progress_bar(console) as progress:
        total = len(sizes) * len(batches) * len(devices)
        task = progress.add_task("gp-update", total=total)
        for b in batches:
            for n in sizes:
                for device in devices:
                    progress.update(task, description=f"gp-update n={n} batch={b} {device}")
                    seed = n + 7919 * b
                    rows.append(measure(n, b, dim, reps, slow_reps, seed, device, botorch))
                    progress.advance(task)
    names = "; ".join(dict.fromkeys(f"{r.device} = {r.device_name}" for r in rows))
    print_table(
        f"One posterior update (dim {dim}, float64, median milliseconds; {names})",
        [
            "device",
            "n",
            "batch",
            "c/a refactor/append",
            "a/d append/floor",
            "b/a botorch/append",
            "a append",
            "c refactor",
            "d floor",
            "b botorch",
            "max rel diff mean/var",
            "MiB/node",
        ],
        [
            (
                r.device,
                r.n,
                r.batch,
                r.refactor_over_append,
                r.append_over_solve,
                r.botorch_over_append,
                1e3 * r.append_s,
                1e3 * r.refactor_s,
                1e3 * r.triangular_solve_s,
                float("nan") if r.botorch_condition_s is None else 1e3 * r.botorch_condition_s,
                "—"
                if r.mean_rel_diff is None
                else f"{r.mean_rel_diff:.0e}/{r.variance_rel_diff:.0e}",
                r.bytes_per_node / 2**20,
            )
            for r in rows
        ],
        console,
    )
    if json_path is not None:
        write_json(
            json_path,
            {
                "machine": machine_info(),
                "dim": dim,
                "devices": [device_info(d) for d in devices],
                "rows": [asdict(r) for r in rows],
            },
        )
        console.print(f"results: {json_path}")
    if plot_path is not None:
        plot(rows, plot_path)
        console.print(f"plot: {plot_path}")
    return rows
