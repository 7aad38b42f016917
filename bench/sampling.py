"""`cbo-agent bench sampling`: the cost of joint posterior samples of an array-valued GP.

Paper 002's Fig. 2 / A.3 shape: Matheron's rule against distributional sampling (a Cholesky of
the dense joint posterior covariance of all n_test · t outputs) and against BoTorch's own
posterior (`HigherOrderGP.posterior(X).rsample`, itself Matheron-based), at n = 100 training
points, `samples` (256) joint samples, n_test test points and t outputs.

The model is a higher-order GP with t outputs on an h × w grid (t = 10 is one axis of 10): BoTorch
builds it (default priors' initial hyperparameters, inputs in [0, 1]^5, outputs drawn from the
prior), and the same data kernel and latent factors go into `core.gp.kronecker.KroneckerGP`, so
the three methods sample one posterior. Two sweeps, as the paper's panels: n_test from 5 to 305
at t = 10, and t from 10 to 4,096 at n_test = 5.

Each measurement runs in a child process, so `peak_mb` is that sampling's own growth of
the resident set (ru_maxrss after − before) and a crash or a time-out costs only that row. A
method whose dense matrices would exceed `--memory-cap-mb` is not run (`ok: false`, `reason`
says what it would need): the distributional method needs (n_test·t)² doubles for its
covariance, plus n·t × n_test·t for the cross-covariance. Repeats are interleaved (method order
rotated per repeat); rows give the median and the min..max of the seconds.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

METHODS = ("matheron", "distributional", "botorch")
N_TRAIN = 100
DIM = 5


@dataclass(frozen=True)
class Case:
    method: str
    t: int
    n_test: int
    samples: int
    seed: int


def output_shape(t: int) -> tuple[int, ...]:
    """t outputs as the HOGP's output axes: a square grid when t is a square > 10, else [t]."""
    side = math.isqrt(t)
    return (side, side) if side * side == t and t > 10 else (t,)


def _hogp(t: int, seed: int) -> Any:
    from botorch.models.higher_order_gp import HigherOrderGP

    torch.manual_seed(seed)
    shape = output_shape(t)
    x = torch.rand(N_TRAIN, DIM, dtype=torch.float64)
    y = torch.randn(N_TRAIN, *shape, dtype=torch.float64)
    model = HigherOrderGP(x, y, outcome_transform=None)
    model.eval()
    return model, x, y


def _kronecker(model: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    from core.gp.kronecker import KroneckerGP

    kernel = model.covar_modules[0]
    with torch.no_grad():
        factors = [
            cm(p).to_dense().reshape(p.shape[-2], p.shape[-2])
            for cm, p in zip(model.covar_modules[1:], model.latent_parameters, strict=True)
        ]
        noise = float(model.likelihood.noise.reshape(-1)[0])
    return KroneckerGP(lambda a, b: kernel(a, b).to_dense(), factors, noise, x, y)


def dense_bytes(case: Case) -> int:
    """What the distributional method's dense matrices need (covariance, cross-covariance)."""
    rows = case.n_test * case.t
    return 8 * (2 * rows * rows + N_TRAIN * case.t * rows)


def _sample(case: Case, model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Draw the case's joint samples: (samples, n_test, *shape). Timed: everything after the
    BoTorch model exists (each method's precomputation — eigendecompositions, roots, caches —
    included)."""
    x_test = torch.rand(case.n_test, DIM, dtype=torch.float64)
    generator = torch.Generator().manual_seed(case.seed)
    with torch.no_grad():
        if case.method == "botorch":
            return model.posterior(x_test).rsample(torch.Size([case.samples]))
        gp = _kronecker(model, x, y)
        if case.method == "matheron":
            from core.gp.matheron import MatheronSamples

            return MatheronSamples(gp, case.samples, generator).joint(x_test)
        mean = gp.posterior_mean(x_test).reshape(-1)
        covariance = _dense_covariance(gp, x_test)
        root = torch.linalg.cholesky(covariance + 1e-8 * torch.eye(len(covariance)))
        z = torch.randn(case.samples, len(covariance), generator=generator, dtype=torch.float64)
        return (mean + z @ root.T).reshape(case.samples, case.n_test, *gp.shape)


def _dense_covariance(gp: Any, x_test: torch.Tensor) -> torch.Tensor:
    """(n_test t, n_test t) the joint posterior covariance, dense: the prior minus the
    cross-covariance times K⁻¹ times its transpose (K⁻¹ through the Kronecker eigen-solve)."""
    kt = gp.factors[0]
    for factor in gp.factors[1:]:
        kt = torch.kron(kt, factor)
    cross = torch.kron(gp.cross(x_test), kt)  # (m t, n t)
    solved = gp.solve(cross.reshape(-1, gp.n, *gp.shape)).reshape(len(cross), -1)
    prior = torch.kron(gp.kernel(x_test, x_test), kt)
    return prior - cross @ solved.T


def _child(case: Case, queue: Any) -> None:
    import core.gp.matheron  # noqa: F401  (imported before the clock starts)

    model, x, y = _hogp(case.t, case.seed)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        start = time.perf_counter()
        out = _sample(case, model, x, y)
        seconds = time.perf_counter() - start
        ok = bool(torch.isfinite(out).all())
        reason = "" if ok else "non-finite samples"
    except (MemoryError, RuntimeError) as error:
        seconds, ok, reason = math.nan, False, f"{type(error).__name__}: {str(error)[:200]}"
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put({"seconds": seconds, "ok": ok, "reason": reason, "peak_mb": (after - before) / 1024})


def measure(case: Case, timeout_s: float) -> dict[str, Any]:
    """One measurement in a child process; a time-out or a crash is a row with ok false.

    The children fork from a fork server that imported this module (torch, BoTorch) but never
    ran a parallel torch operation: forking a process whose OpenMP pool has run can deadlock.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["bench.sampling", "botorch.models.higher_order_gp"])
    queue = context.Queue()
    child = context.Process(target=_child, args=(case, queue))
    child.start()
    child.join(timeout_s)
    if child.is_alive():
        child.kill()
        child.join()
        return {"seconds": math.nan, "ok": False, "reason": f"timeout {timeout_s:g} s"}
    if queue.empty():
        return {"seconds": math.nan, "ok": False, "reason": f"child died ({child.exitcode})"}
    return queue.get()


def grid(n_tests: Sequence[int], ts: Sequence[int]) -> list[tuple[int, int]]:
    """(t, n_test) pairs: n_test swept at the smallest t, t swept at the smallest n_test."""
    pairs = [(min(ts), m) for m in n_tests] + [(t, min(n_tests)) for t in ts]
    return list(dict.fromkeys(pairs))


def run(
    n_tests: Sequence[int],
    ts: Sequence[int],
    samples: int,
    reps: int,
    memory_cap_mb: float,
    timeout_s: float,
    json_path: Path | None,
    methods: Sequence[str] = METHODS,
) -> list[dict[str, Any]]:
    """Measure every (method, t, n_test) of the grid `reps` times, interleaved; print a table."""
    rows = []
    for t, n_test in grid(n_tests, ts):
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
        skipped: dict[str, str] = {}
        for method in methods:
            need = dense_bytes(Case(method, t, n_test, samples, 0)) / 2**20
            if method == "distributional" and need > memory_cap_mb:
                skipped[method] = f"not run: needs {need:,.0f} MB > cap {memory_cap_mb:,.0f} MB"
        for rep in range(reps):
            order = list(methods[rep % len(methods) :]) + list(methods[: rep % len(methods)])
            for method in order:
                if method in skipped or (runs[method] and not runs[method][-1]["ok"]):
                    continue  # a failed method is not retried at this size
                runs[method].append(measure(Case(method, t, n_test, samples, rep), timeout_s))
        for method in methods:
            rows.append(_row(method, t, n_test, samples, runs[method], skipped.get(method)))
            _print(rows[-1])
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(rows, indent=1))
    return rows


def _row(
    method: str, t: int, n_test: int, samples: int, runs: list[dict[str, Any]], skip: str | None
) -> dict[str, Any]:
    good = [r for r in runs if r["ok"]]
    row: dict[str, Any] = {
        "method": method,
        "t": t,
        "n_test": n_test,
        "n": N_TRAIN,
        "samples": samples,
        "repeats": len(good),
        "ok": bool(good) and len(good) == len(runs),
    }
    if good:
        seconds = [r["seconds"] for r in good]
        row.update(
            seconds=statistics.median(seconds),
            seconds_min=min(seconds),
            seconds_max=max(seconds),
            peak_mb=statistics.median(r["peak_mb"] for r in good),
        )
    else:
        row.update(seconds=None, peak_mb=None)
    failed = [r["reason"] for r in runs if not r["ok"]]
    if skip or failed:
        row["reason"] = skip or failed[0]
    return row


def _print(row: dict[str, Any]) -> None:
    if row["seconds"] is None:
        cell = row.get("reason", "failed")
    else:
        cell = (
            f"{row['seconds']:.3f} s ({row['seconds_min']:.3f}..{row['seconds_max']:.3f}, "
            f"{row['repeats']} runs)  peak {row['peak_mb']:.0f} MB"
        )
    print(f"{row['method']:>15}  t={row['t']:>5}  n_test={row['n_test']:>4}  {cell}", flush=True)
