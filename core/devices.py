"""Where the GPs live: one reading of a device name for the service and the benchmarks.

`CBO_DEVICE` (agent config `device`), `NetworkModel(device=...)` and every benchmark's
`--device` go through `resolve_device`, so a CUDA device that is absent fails the same way
everywhere: one line naming it (`DeviceError`), before any model is built — not a traceback
from the first tensor put there. `device_name` says what the numbers were measured on.
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

import torch

from core.errors import DeviceError

__all__ = ["available_devices", "device_name", "resolve_device"]


def resolve_device(device: torch.device | str) -> torch.device:
    """The torch device of `device` (`cpu`, `cuda`, `cuda:N`), checked to be usable here.

    `cuda` means the current CUDA device (index 0 unless torch was told otherwise); it is
    returned with its index, so that a model, a benchmark row and a log name the same card.

    Raises:
        DeviceError: not `cpu` or `cuda[:N]`, CUDA not available, or no device N.
    """
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(f"device {str(device)!r}: expected cpu, cuda or cuda:N") from None
    if parsed.type == "cpu":
        return torch.device("cpu")
    if parsed.type != "cuda":
        raise DeviceError(f"device {str(device)!r}: expected cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        built = "this torch has no CUDA" if torch.version.cuda is None else "no CUDA device found"
        raise DeviceError(f"device {str(device)!r}: CUDA is not available ({built}), use cpu")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if parsed.index is None else parsed.index
    if index >= count:
        raise DeviceError(f"device {str(device)!r}: only {count} CUDA device(s), cuda:0..")
    return torch.device("cuda", index)


def device_name(device: torch.device | str) -> str:
    """The hardware behind `device`: the GPU's name, or the CPU's model name."""
    parsed = torch.device(device)
    if parsed.type == "cuda":
        return torch.cuda.get_device_name(parsed)
    return _cpu_model()


@cache
def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def available_devices() -> list[str]:
    """`cpu`, then `cuda` where a CUDA device is usable: what a test parametrizes over."""
    return ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
