"""Shared output of the benchmarks: a printed table, a JSON file and a progress bar."""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from core.devices import device_name, resolve_device


def machine_info(device: str | None = None) -> dict[str, Any]:
    """What the numbers were measured on; with `device`, where the models lived (`device_info`)."""
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": device_name("cpu"),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info if device is None else {**info, **device_info(device)}


def device_info(device: str) -> dict[str, str]:
    """`device` (`cpu`, `cuda:0`, ...: as `core.devices.resolve_device` reads it) and the
    hardware's name, for every JSON row and table a `--device` benchmark writes."""
    resolved = resolve_device(device)
    return {"device": str(resolved), "device_name": device_name(resolved)}


def write_json(path: Path, payload: Any) -> None:
    """Strict JSON: a float that is not finite (a metric an environment has none of, such as
    the regret of one without an oracle optimum) is written as null."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(payload), indent=2, allow_nan=False, default=_jsonable))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def format_number(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:,.{max(digits - 2, 1)}f}"
    return str(value)


def print_table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], console: Console
) -> None:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(format_number(v) for v in row))
    console.print(table)


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(format_number(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def wide_console() -> Console:
    """A console that does not squeeze tables to 80 columns when output is not a terminal."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )
