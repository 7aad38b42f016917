"""Argument checks of the incremental GP: each names the argument and what is wrong with it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "check_bounds",
    "check_dims",
    "check_inputs",
    "check_mask",
    "check_observations",
    "check_outputs",
    "check_queries",
    "check_state",
    "member_index",
    "parse_noise",
    "positive",
]


def check_bounds(bounds: torch.Tensor | Sequence) -> torch.Tensor:
    """(b, d, 2) finite bounds, upper above lower, from (b, d, 2) or (d, 2); float64 if integer."""
    bounds = torch.as_tensor(bounds)
    if not bounds.is_floating_point():
        bounds = bounds.to(torch.float64)
    if bounds.dim() == 2:
        bounds = bounds.unsqueeze(0)
    if bounds.dim() != 3 or bounds.shape[-1] != 2 or bounds.shape[1] < 1:
        raise ValueError(f"bounds must have shape (b, d, 2) or (d, 2); got {tuple(bounds.shape)}")
    if not torch.isfinite(bounds).all():
        raise ValueError("bounds must be finite")
    if not (bounds[..., 1] > bounds[..., 0]).all():
        raise ValueError("every upper bound must exceed its lower bound")
    return bounds


def check_dims(dims: Sequence[int] | None, batch: int, dim: int) -> torch.Tensor:
    """(b,) long: each member's number of real input dimensions, d for all by default."""
    if dims is None:
        return torch.full((batch,), dim, dtype=torch.long)
    dims_t = torch.as_tensor(list(dims), dtype=torch.long)
    if dims_t.shape != (batch,) or (dims_t < 0).any() or (dims_t > dim).any():
        raise ValueError(f"dims must hold {batch} integers in [0, {dim}]; got {list(dims)}")
    return dims_t


def parse_noise(
    noise: float | Sequence[float | None] | None,
    batch: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """(b,) known noise per member in output units; NaN marks a learned noise."""
    values = [noise] * batch if noise is None or isinstance(noise, int | float) else noise
    values = list(values)
    if len(values) != batch:
        raise ValueError(f"noise_variance needs {batch} entries; got {len(values)}")
    out = []
    for j, value in enumerate(values):
        if value is None:
            out.append(math.nan)
        elif not math.isfinite(float(value)) or float(value) < 0:
            raise ValueError(f"noise_variance[{j}] must be finite and >= 0; got {value}")
        else:
            out.append(float(value))
    return torch.tensor(out, dtype=dtype, device=device)


def positive(
    name: str,
    value: torch.Tensor,
    shape: tuple[int, ...],
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """`value` broadcast to `shape` (a copy), finite and positive."""
    value = torch.as_tensor(value, dtype=dtype, device=device)
    value = value.expand(shape).clone() if value.dim() < len(shape) else value
    if value.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {tuple(value.shape)}")
    if not (torch.isfinite(value).all() and (value > 0).all()):
        raise ValueError(f"{name} must be finite and positive")
    return value


def check_mask(
    mask: torch.Tensor | Sequence[bool] | None, shape: tuple, device: torch.device
) -> torch.Tensor:
    """A bool mask of `shape`, all True when None."""
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    mask_t = torch.as_tensor(mask, device=device)
    if mask_t.dtype != torch.bool or mask_t.shape != shape:
        raise ValueError(
            f"mask must be a bool tensor of shape {shape}; got {mask_t.dtype} {tuple(mask_t.shape)}"
        )
    return mask_t


def check_observations(
    x: torch.Tensor,
    y: torch.Tensor,
    lead: tuple[int, ...],
    mask: torch.Tensor | None,
    dim: int,
    device: torch.device,
) -> None:
    """Shapes (*lead, d) and lead, and finite values wherever `mask` (None: everywhere) is True."""
    expected = (*lead, dim)
    if x.shape != expected:
        raise ValueError(f"x must have shape {expected} (batch, ..., dim); got {tuple(x.shape)}")
    if y.shape != lead:
        raise ValueError(f"y must have shape {lead}; got {tuple(y.shape)}")
    # Two sums settle the usual case in two tensor calls: their total is finite only if
    # every value is. Otherwise (a bad value, one where the mask is False, or an overflow of
    # good values) the checks below look closer and say where.
    if math.isfinite(float(x.sum()) + float(y.sum())):
        return
    mask = check_mask(mask, lead, device)
    check_inputs(x, lead, mask, dim)
    check_outputs(y, lead, mask)


def check_inputs(x: torch.Tensor, lead: tuple[int, ...], mask: torch.Tensor, dim: int) -> None:
    """Shape (*lead, d), finite where `mask` (shape lead) is True."""
    expected = (*lead, dim)
    if x.shape != expected:
        raise ValueError(f"x must have shape {expected} (batch, ..., dim); got {tuple(x.shape)}")
    bad = ~torch.isfinite(x).all(-1) & mask
    if bad.any():
        where = bad.nonzero()[0].tolist()
        raise ValueError(f"x holds NaN or infinity at index {where} (batch member first)")


def check_outputs(y: torch.Tensor, lead: tuple[int, ...], mask: torch.Tensor) -> None:
    """Shape lead, finite where `mask` is True."""
    if y.shape != lead:
        raise ValueError(f"y must have shape {lead}; got {tuple(y.shape)}")
    bad = ~torch.isfinite(y) & mask
    if bad.any():
        raise ValueError(f"y holds NaN or infinity at index {bad.nonzero()[0].tolist()}")


def check_queries(
    x: torch.Tensor,
    count: int,
    dim: int,
    single: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """(count, q, d) finite queries in `dtype`; with `single`, (q, d) is accepted too."""
    x = torch.as_tensor(x, device=device)
    if x.dtype != dtype:
        x = x.to(dtype)
    if single and x.dim() == 2:
        x = x.unsqueeze(0)
    if x.dim() != 3 or x.shape[0] != count or x.shape[-1] != dim:
        expected = f"({count}, q, {dim})"
        raise ValueError(f"x must have shape {expected} for these members; got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError("query points hold NaN or infinity")
    return x


def member_index(
    members: Sequence[int] | int | None, batch: int, every: torch.Tensor
) -> torch.Tensor:
    """(b',) long index of the chosen members; `every` (arange(b)) itself when None."""
    if members is None:
        return every
    chosen = [members] if isinstance(members, int) else list(members)
    if any(not 0 <= int(j) < batch for j in chosen):
        raise IndexError(f"members {chosen} out of range for a batch of {batch}")
    return torch.tensor(chosen, dtype=torch.long, device=every.device)


STATE_FIELDS = (
    "lengthscale",
    "outputscale",
    "learned_noise",
    "jitter",
    "y_mean",
    "y_scale",
    "since_refit",
    "refit_due",
)


def check_state(state: dict[str, torch.Tensor], batch: int, dim: int) -> None:
    """Every field of `IncrementalGP.state()`, lengthscale (b, d), the others (b,)."""
    for name in STATE_FIELDS:
        shape = (batch, dim) if name == "lengthscale" else (batch,)
        if name not in state:
            raise ValueError(f"state lacks {name!r}")
        if tuple(state[name].shape) != shape:
            raise ValueError(
                f"state {name!r} has shape {tuple(state[name].shape)}, expected {shape}"
            )
