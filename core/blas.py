"""Triangular solves against a factor stored inside a larger, preallocated buffer.

The incremental GP keeps its Cholesky factor in the top-left n×n block of a (capacity×capacity)
buffer so that appending a row never moves the rows above it. `torch.linalg.solve_triangular`
only accepts contiguous matrices, so it copies such a block first — an O(n²) copy that costs as
much as the solve itself (measured: 3.1 ms instead of 0.3 ms at n = 2000). BLAS's `trsm` takes a
leading dimension and reads the block in place, so on the CPU we call the `?trsm_` routine of the
BLAS that torch itself links (MKL or OpenBLAS). Where that symbol is missing, or on another
device, we fall back to torch on a contiguous copy: correct everywhere, fast where it matters.

`append_rows_` and `set_entries_` serve the GP's append the same way. A torch call costs some
5-10 µs however small its operands, and an append built of a few dozen of them (views of the new
row, a gather, dot products, scatters of a few scalars) spent about as long on those as on its
one O(n²) solve at n = 2000. On the CPU these two work through raw pointers instead — `memcpy`,
`?trsm_`, `?dot_` and scalar stores — with the same torch fallback elsewhere.
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
from collections.abc import Callable, Sequence

import torch

_CHAR = ctypes.c_char
_INT = ctypes.c_int
_SCALARS: dict[torch.dtype, type] = {torch.float64: ctypes.c_double, torch.float32: ctypes.c_float}
_PREFIXES = {torch.float64: "d", torch.float32: "s"}


def _candidate_libraries() -> list[str]:
    torch_dir = os.path.dirname(torch.__file__)
    names = [os.path.join(torch_dir, "lib", "libtorch_cpu.so")]
    names += sorted(glob.glob(os.path.join(torch_dir, "lib", "*blas*.so*")))
    names += sorted(glob.glob(os.path.join(os.path.dirname(torch_dir), "torch.libs", "*blas*.so*")))
    return [name for name in names if os.path.exists(name)]


def _load(symbol: str, restype: type | None, argtypes: list) -> Callable | None:
    for path in _candidate_libraries():
        try:
            fn = getattr(ctypes.CDLL(path), symbol)
        except (OSError, AttributeError):
            continue
        fn.restype = restype
        fn.argtypes = argtypes
        return fn
    return None


def _load_trsm(symbol: str, scalar: type) -> Callable | None:
    return _load(
        symbol,
        None,
        [
            ctypes.POINTER(_CHAR),  # side
            ctypes.POINTER(_CHAR),  # uplo
            ctypes.POINTER(_CHAR),  # transa
            ctypes.POINTER(_CHAR),  # diag
            ctypes.POINTER(_INT),  # m
            ctypes.POINTER(_INT),  # n (right-hand sides)
            ctypes.POINTER(scalar),  # alpha
            ctypes.c_void_p,  # a
            ctypes.POINTER(_INT),  # lda
            ctypes.c_void_p,  # b
            ctypes.POINTER(_INT),  # ldb
        ],
    )


def _load_dot(symbol: str, scalar: type) -> Callable | None:
    # n, x, incx, y, incy; the result comes back as a Python float
    pointer, stride = [ctypes.POINTER(_INT), ctypes.c_void_p], ctypes.POINTER(_INT)
    return _load(symbol, scalar, [*pointer, stride, ctypes.c_void_p, stride])


_TRSM: dict[torch.dtype, tuple[Callable, type]] = {}
_DOT: dict[torch.dtype, Callable] = {}
for _dtype, _scalar in _SCALARS.items():
    _fn = _load_trsm(f"{_PREFIXES[_dtype]}trsm_", _scalar)
    if _fn is not None:
        _TRSM[_dtype] = (_fn, _scalar)
    _fn = _load_dot(f"{_PREFIXES[_dtype]}dot_", _scalar)
    if _fn is not None:
        _DOT[_dtype] = _fn


# The arguments that never change, passed by reference (building them per call cost more than
# the solve itself for small n).
_UPPER_TRANSPOSED = tuple(ctypes.byref(_CHAR(flag)) for flag in (b"L", b"U", b"T", b"N"))
_ONE_RHS = ctypes.byref(_INT(1))
_ALPHA = {dtype: ctypes.byref(scalar(1.0)) for dtype, (_, scalar) in _TRSM.items()}


def _blas_usable(buffer: torch.Tensor, rhs: torch.Tensor) -> bool:
    """Whether `rhs` (k, n), rows contiguous and spaced by its row stride, can go to `?trsm_`."""
    return (
        buffer.device.type == "cpu"
        and rhs.device.type == "cpu"
        and buffer.dtype in _TRSM
        and rhs.dtype == buffer.dtype
        and buffer.stride(1) == 1
        and rhs.stride(1) == 1
        and rhs.stride(0) >= max(rhs.shape[1], 1)
        and not rhs.requires_grad
        and not buffer.requires_grad
    )


def _blas_solve_rows_(buffer: torch.Tensor, n: int, rhs: torch.Tensor) -> None:
    """BLAS call: overwrite each row of `rhs` (k, n) with L⁻¹ row, L the lower n×n block of
    row-major `buffer`."""
    # A row-major buffer read as column-major (lda = row stride) is Lᵀ, an upper factor; solving
    # Lx = b is therefore "upper, transposed" in BLAS terms, and each row of rhs is one
    # column-major right-hand side (ldb = its row stride).
    _TRSM[buffer.dtype][0](
        *_UPPER_TRANSPOSED,
        ctypes.byref(_INT(n)),
        ctypes.byref(_INT(rhs.shape[0])),
        _ALPHA[buffer.dtype],
        buffer.data_ptr(),
        ctypes.byref(_INT(buffer.stride(0))),
        rhs.data_ptr(),
        ctypes.byref(_INT(rhs.stride(0))),
    )


def solve_lower_rows_in_buffer_(buffer: torch.Tensor, n: int, rhs: torch.Tensor) -> None:
    """Overwrite each row r of `rhs` (k, n) with L⁻¹ r, reading L (lower n×n) in place.

    One `?trsm_` with k right-hand sides reads the factor once, where k solves would read it k
    times; the factor is memory-bound, so this is the whole gain of a block append. The rows of
    `rhs` may be rows of `buffer` itself below the factor (the rows being appended): the solve
    reads rows :n and writes only `rhs`.

    Args:
        buffer: (capacity, capacity) tensor, row-major; the lower triangle of its leading n×n
            block is read.
        n: size of the factor.
        rhs: (k, n) tensor whose rows are contiguous (any row stride ≥ n), overwritten.
    """
    if n == 0 or rhs.shape[0] == 0:
        return
    if rhs.shape[1] != n:
        raise ValueError(f"right-hand sides must have {n} columns; got {tuple(rhs.shape)}")
    if _blas_usable(buffer, rhs):
        _blas_solve_rows_(buffer, n, rhs)
        return
    block = buffer[:n, :n]
    rhs.copy_(torch.linalg.solve_triangular(block, rhs.mT, upper=False).mT)


def solve_lower_in_buffer_(buffer: torch.Tensor, n: int, rhs: torch.Tensor) -> None:
    """Overwrite `rhs` (n,) with L⁻¹ rhs, L the lower triangle of `buffer[:n, :n]` read in place.

    Args:
        buffer: (capacity, capacity) tensor, row-major; only the lower triangle of its leading
            n×n block is read.
        n: size of the factor.
        rhs: (n,) right-hand side, overwritten; it may be a row of another buffer (the row
            being appended).
    """
    solve_lower_rows_in_buffer_(buffer, n, rhs.unsqueeze(0))


def _raw_usable(*tensors: torch.Tensor) -> bool:
    """Whether tensors can be worked on through raw pointers (and BLAS) on the CPU."""
    dtype = tensors[0].dtype
    if dtype not in _TRSM or dtype not in _DOT:
        return False
    return all(
        t.is_cpu and t.dtype == dtype and not t.requires_grad and t.is_contiguous() for t in tensors
    )


def append_rows_(
    factor: torch.Tensor,
    vector: torch.Tensor,
    source: torch.Tensor,
    rows: Sequence[int],
    members: Sequence[int],
) -> list[tuple[float, float]]:
    """Give each listed member's factor the off-diagonal part of one new row, in place.

    For member j with n = rows[j]: l = L⁻¹ source[j, :n] is written to factor[j, n, :n], L the
    lower triangle of factor[j, :n, :n] read in place; columns n onwards are left untouched.

    Args:
        factor: (b, capacity, capacity) contiguous buffer of factors.
        vector: (b, capacity) contiguous; the second dot product is taken with its rows.
        source: (b, w) contiguous right-hand sides, w ≥ every listed member's n.
        rows: n per member (indexed by member).
        members: the members to extend.

    Returns:
        (lᵀl, lᵀ vector[j, :n]) per listed member, as Python floats.
    """
    if not _raw_usable(factor, vector, source):
        return _append_rows_torch_(factor, vector, source, rows, members)
    trsm, dot = _TRSM[factor.dtype][0], _DOT[factor.dtype]
    alpha, size = _ALPHA[factor.dtype], factor.element_size()
    capacity = factor.shape[-1]
    f_base, v_base, s_base = factor.data_ptr(), vector.data_ptr(), source.data_ptr()
    s_stride = source.stride(0) if source.dim() == 2 else 0
    lda = ctypes.byref(_INT(capacity))
    out = []
    for j in members:
        n = rows[j]
        if n == 0:
            out.append((0.0, 0.0))
            continue
        if not (0 <= j < factor.shape[0] and n < capacity and n <= source.shape[-1]):
            raise IndexError(f"member {j} with {n} rows does not fit the buffers")
        lower = f_base + j * capacity * capacity * size
        row = lower + n * capacity * size
        ctypes.memmove(row, s_base + j * s_stride * size, n * size)
        count = ctypes.byref(_INT(n))
        trsm(*_UPPER_TRANSPOSED, count, _ONE_RHS, alpha, lower, lda, row, count)
        v_row = v_base + j * capacity * size
        out.append(
            (dot(count, row, _ONE_RHS, row, _ONE_RHS), dot(count, row, _ONE_RHS, v_row, _ONE_RHS))
        )
    return out


def _append_rows_torch_(
    factor: torch.Tensor,
    vector: torch.Tensor,
    source: torch.Tensor,
    rows: Sequence[int],
    members: Sequence[int],
) -> list[tuple[float, float]]:
    """`append_rows_` in torch operations: any device, one synchronization for all members."""
    for j in members:
        n = rows[j]
        new_row = factor[j, n, :n]  # contiguous: the solve writes straight into it
        new_row.copy_(source[j, :n])
        solve_lower_in_buffer_(factor[j], n, new_row)
    if not members:
        return []
    width = max(max(rows[j] for j in members), 1)
    idx = torch.tensor(list(members), device=factor.device)
    at = torch.tensor([rows[j] for j in members], device=factor.device)
    held = torch.arange(width, device=factor.device) < at.unsqueeze(-1)
    gathered = torch.where(held, factor[idx, at, :width], 0.0)  # past n: the identity's 1
    quad = torch.stack(
        (
            torch.linalg.vecdot(gathered, gathered),
            torch.linalg.vecdot(gathered, torch.where(held, vector[idx, :width], 0.0)),
        )
    )
    return list(zip(*quad.tolist(), strict=True))


def set_entries_(*writes: tuple[torch.Tensor, Sequence[int], Sequence[float]]) -> None:
    """For each (tensor, offsets, values): tensor.view(-1)[offsets] = values, a few scalars each.

    On the CPU these are raw stores, one per value; elsewhere one scatter per tensor.
    """
    for tensor, offsets, values in writes:
        if len(offsets) != len(values):
            raise ValueError(f"{len(offsets)} offsets for {len(values)} values")
        if offsets and (min(offsets) < 0 or max(offsets) >= tensor.numel()):
            raise IndexError(f"offsets out of range for a tensor of {tensor.numel()} elements")
    tensors = [tensor for tensor, _, _ in writes]
    if tensors and tensors[0].dtype in _SCALARS and _raw_usable(*tensors):
        scalar, size = _SCALARS[tensors[0].dtype], tensors[0].element_size()
        for tensor, offsets, values in writes:
            base = tensor.data_ptr()
            for offset, value in zip(offsets, values, strict=True):
                scalar.from_address(base + offset * size).value = value
        return
    for tensor, offsets, values in writes:
        index = torch.tensor(list(offsets), dtype=torch.long, device=tensor.device)
        source = torch.tensor(list(values), dtype=tensor.dtype, device=tensor.device)
        tensor.view(-1)[index] = source


def blas_available(dtype: torch.dtype = torch.float64) -> bool:
    """Whether in-place BLAS solves are available for `dtype` on the CPU."""
    return dtype in _TRSM


def _self_test() -> None:
    """Drop a BLAS route that disagrees with torch on a small problem (a wrong ABI, say)."""
    for dtype in list(_TRSM):
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(5, 5, generator=gen, dtype=dtype)
        lower = torch.linalg.cholesky(a @ a.mT + 5 * torch.eye(5, dtype=dtype))
        buffer = torch.zeros(8, 8, dtype=dtype)
        buffer[:5, :5] = lower
        rows = torch.randn(3, 8, generator=gen, dtype=dtype)  # strided right-hand sides
        solved = rows.clone()
        expected = torch.linalg.solve_triangular(lower, rows[:, :5].mT, upper=False).mT
        try:
            _blas_solve_rows_(buffer, 5, solved[:, :5])
        except Exception:  # a foreign BLAS that fails to load or run is simply not used
            solved.fill_(math.nan)
        if not torch.allclose(solved[:, :5], expected, rtol=1e-4, atol=1e-5):
            del _TRSM[dtype]
            _DOT.pop(dtype, None)
            continue
        if dtype in _DOT:  # the whole append route against its torch twin
            factor = torch.eye(8, dtype=dtype).repeat(2, 1, 1)
            factor[:, :5, :5] = lower
            vector = torch.randn(2, 8, generator=gen, dtype=dtype)
            source = torch.randn(2, 6, generator=gen, dtype=dtype)
            twin = factor.clone()
            try:
                ours = append_rows_(factor, vector, source, [5, 5], [0, 1])
            except Exception:
                del _DOT[dtype]
                continue
            theirs = _append_rows_torch_(twin, vector, source, [5, 5], [0, 1])
            same = torch.allclose(factor, twin, rtol=1e-4, atol=1e-5) and torch.allclose(
                torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=1e-5
            )
            if not same:
                del _DOT[dtype]


_self_test()
