"""`cbo-agent bench trsm`: the GP's in-place triangular solve beside torch's, per size.

The incremental GP solves L x = b with L the leading n×n block of a larger buffer and b a row
of the same buffer (`core.blas.solve_lower_in_buffer_`, through `scipy.linalg.cython_blas`'s
`dtrsm`). torch's `solve_triangular` takes contiguous operands only, so its side of the
comparison pays the copy of the block, as the GP would. Both sides solve the same system,
`reps` interleaved repeats of `calls` solves each; the table gives the median time per solve
over the repeats, with the fastest and slowest repeat, and the largest difference between the
two answers (they must agree).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench.report import machine_info, print_table, wide_console, write_json
from core.blas import blas_available, solve_lower_in_buffer_

SCHEMA = "cbo-agent/bench-trsm"


@dataclass
class TrsmRow:
    """Seconds per solve at one size: median over repeats, and the spread of the repeats."""

    n: int
    in_place_s: float
    in_place_min_s: float
    in_place_max_s: float
    torch_s: float
    torch_min_s: float
    torch_max_s: float
    speedup: float
    max_abs_diff: float


def _problem(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A (n + 64)² buffer whose leading block is a well-conditioned factor, and a right side."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    buffer = torch.zeros(n + 64, n + 64, dtype=torch.float64)
    buffer[:n, :n] = torch.linalg.cholesky(a @ a.mT / n + torch.eye(n, dtype=torch.float64))
    return buffer, torch.randn(n, generator=gen, dtype=torch.float64)


def _time(solve: Callable[[], None], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        solve()
    return (time.perf_counter() - started) / calls


def measure(n: int, reps: int, calls: int) -> TrsmRow:
    buffer, b = _problem(n, n)
    row = buffer[n, :n]  # the row being appended: inside the buffer, below the factor

    def in_place() -> None:
        row.copy_(b)
        solve_lower_in_buffer_(buffer, n, row)

    def with_torch() -> torch.Tensor:
        block = buffer[:n, :n].contiguous()  # what solve_triangular needs
        return torch.linalg.solve_triangular(block, b.unsqueeze(-1), upper=False).squeeze(-1)

    in_place()
    diff = float((row - with_torch()).abs().max())
    ours, theirs = [], []
    for _ in range(reps):  # interleaved: a drift in the machine's load hits both sides
        ours.append(_time(in_place, calls))
        theirs.append(_time(with_torch, calls))
    mine, other = statistics.median(ours), statistics.median(theirs)
    return TrsmRow(
        n, mine, min(ours), max(ours), other, min(theirs), max(theirs), other / mine, diff
    )


def run(sizes: Sequence[int], reps: int, json_path: Path | None) -> list[TrsmRow]:
    if not blas_available(torch.float64):
        raise RuntimeError("no in-place BLAS route (scipy.linalg.cython_blas) on this machine")
    rows = [measure(n, reps, max(3, 2_000_000 // (n * n))) for n in sizes]
    print_table(
        "Triangular solve of one appended row (seconds per solve; median over repeats)",
        ["n", "in place", "min", "max", "torch (copy + solve)", "min", "max", "speedup", "|Δ|"],
        (
            [
                r.n,
                r.in_place_s,
                r.in_place_min_s,
                r.in_place_max_s,
                r.torch_s,
                r.torch_min_s,
                r.torch_max_s,
                r.speedup,
                r.max_abs_diff,
            ]
            for r in rows
        ),
        wide_console(),
    )
    if json_path is not None:
        payload = {"schema": SCHEMA, "machine": machine_info(), "reps": reps}
        write_json(json_path, {**payload, "rows": [asdict(r) for r in rows]})
    return rows
