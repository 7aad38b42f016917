"""Triangular solves against a factor stored inside a larger, preallocated buffer.

The incremental GP keeps its Cholesky factor in the top-left n×n block of a (capacity×capacity)
buffer so that appending a row never moves the rows above it. `torch.linalg.solve_triangular`
only accepts contiguous matrices, so it copies such a block first — an O(n²) copy that costs as
much as the solve itself (measured: 3.1 ms instead of 0.3 ms at n = 2000). BLAS's `trsm` takes a
leading dimension and reads the block in place, so on the CPU we call `?trsm` (`?trsv` for a
single right-hand side, which SciPy's OpenBLAS runs 2-3× faster) through SciPy's public BLAS
interface for compiled code, `scipy.linalg.cython_blas`: its functions are exported
as C function pointers (the module's `__pyx_capi__` capsules, each named by its C signature,
which we check before use), and SciPy's wrappers take care of the Fortran calling convention
(the hidden string-length arguments included). SciPy's Python-level `scipy.linalg.blas.dtrsm`
would be the tidier call, but it copies a block with a leading dimension larger than n into a
contiguous array — the very copy this module exists to avoid. Where the capsules are missing or
their signature differs, or on another device, we fall back to torch on a contiguous copy:
correct everywhere, fast where it matters.

`append_rows_` and `set_entries_` serve the GP's append the same way. A torch call costs some
5-10 µs however small its operands, and an append built of a few dozen of them (views of the new
row, a gather, dot products, scatters of a few scalars) spent about as long on those as on its
one O(n²) solve at n = 2000. On the CPU these two work on NumPy views of the same memory
(`Tensor.numpy()`: bounds-checked, sub-microsecond indexing), `cython_blas`'s `?trsv` and
NumPy's dot products, with the torch fallback elsewhere. Nothing is written through a raw
address: BLAS writes only the right-hand side it is given, whose extent is checked first, and
every other store goes through a NumPy view.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

_CHAR_P = ctypes.c_char_p
_INT_P = ctypes.POINTER(ctypes.c_int)
_SCALARS: dict[torch.dtype, type] = {torch.float64: ctypes.c_double, torch.float32: ctypes.c_float}
_PREFIXES = {torch.float64: "d", torch.float32: "s"}

# The C signatures `scipy.linalg.cython_blas` documents, as its capsules spell them (the scalar
# typedef is written out per dtype below).
_TRSM_SIGNATURE = (
    "void (char *, char *, char *, char *, int *, int *, {t} *, {t} *, int *, {t} *, int *)"
)
_TRSV_SIGNATURE = "void (char *, char *, char *, int *, {t} *, int *, {t} *, int *)"


def _capsule_pointer(name: str, signature: str) -> int | None:
    """The C function pointer scipy.linalg.cython_blas exports as `name`, if its signature is
    `signature` (with `{t}` standing for scipy's scalar typedef); None otherwise."""
    try:
        from scipy.linalg import cython_blas
    except ImportError:
        return None
    capsule = getattr(cython_blas, "__pyx_capi__", {}).get(name)
    if capsule is None:
        return None
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    raw_name = get_name(capsule)
    typedef = f"__pyx_t_5scipy_6linalg_11cython_blas_{name[0]}"
    if raw_name is None or raw_name.decode() != signature.format(t=typedef):
        return None
    return get_pointer(capsule, raw_name)


def _load_trsm(dtype: torch.dtype) -> Callable | None:
    scalar = _SCALARS[dtype]
    pointer = _capsule_pointer(f"{_PREFIXES[dtype]}trsm", _TRSM_SIGNATURE)
    if pointer is None:
        return None
    prototype = ctypes.CFUNCTYPE(
        None,
        _CHAR_P,  # side
        _CHAR_P,  # uplo
        _CHAR_P,  # transa
        _CHAR_P,  # diag
        _INT_P,  # m
        _INT_P,  # n (right-hand sides)
        ctypes.POINTER(scalar),  # alpha
        ctypes.c_void_p,  # a
        _INT_P,  # lda
        ctypes.c_void_p,  # b (written)
        _INT_P,  # ldb
    )
    return prototype(pointer)


def _load_trsv(dtype: torch.dtype) -> Callable | None:
    pointer = _capsule_pointer(f"{_PREFIXES[dtype]}trsv", _TRSV_SIGNATURE)
    if pointer is None:
        return None
    prototype = ctypes.CFUNCTYPE(
        None,
        _CHAR_P,  # uplo
        _CHAR_P,  # trans
        _CHAR_P,  # diag
        _INT_P,  # n
        ctypes.c_void_p,  # a
        _INT_P,  # lda
        ctypes.c_void_p,  # x (written)
        _INT_P,  # incx
    )
    return prototype(pointer)


_TRSM: dict[torch.dtype, Callable] = {}
# One right-hand side (an append) goes to ?trsv: SciPy's OpenBLAS runs ?trsm with one column
# 2-3× slower than ?trsv (measured at n = 500-4000; docs/benchmarks.md), MKL's did not.
_TRSV: dict[torch.dtype, Callable] = {}
for _dtype in _SCALARS:
    _fn, _fv = _load_trsm(_dtype), _load_trsv(_dtype)
    if _fn is not None and _fv is not None:
        _TRSM[_dtype], _TRSV[_dtype] = _fn, _fv


def _one_blas_thread() -> list[str]:
    """Run SciPy's BLAS — the library whose `?trsm` the block append calls — on one thread,
    unless OPENBLAS_NUM_THREADS says otherwise; returns the libraries set.

    Why: SciPy's OpenBLAS (pthreads) splits a `?trsm` with two or more right-hand sides over
    its threads, and its threads busy-wait for each other. The service's own threads — the
    event loop, the store/learn worker, the fit process — already hold the cores, so the
    split only waits: on 2 busy cores (load 12) a block solve at n = 1,000 took 21 ms (k = 2)
    to 24 ms (k = 8) with 2 threads against 0.5–0.6 ms with one, and readings queued behind
    those blocks (`cbo-agent bench latency`, docs/benchmarks.md). The solves are memory-bound:
    one thread reads the factor about as fast. NumPy's and torch's BLAS are other libraries
    and keep their settings; what else calls SciPy's BLAS here (scipy.optimize's L-BFGS) works
    on small vectors.
    """
    if "OPENBLAS_NUM_THREADS" in os.environ:  # the operator's choice stands
        return []
    try:
        from scipy.linalg import cython_blas
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return []
    del cython_blas  # imported for its library: loaded, threadpoolctl finds it
    # SciPy's wheels bundle their OpenBLAS in scipy.libs/ (scipy/.libs/ on some platforms);
    # NumPy's, in numpy.libs/, is another library with its own threads, left alone.
    mine = [
        lib
        for lib in ThreadpoolController().lib_controllers
        if lib.user_api == "blas" and _in_scipy(Path(lib.filepath))
    ]
    for lib in mine:
        lib.set_num_threads(1)
    return [lib.filepath for lib in mine]


def _in_scipy(path: Path) -> bool:
    return path.parent.name.startswith("scipy") or path.parent.parent.name == "scipy"


# the libraries `_one_blas_thread` set to one thread (tests read it)
SINGLE_THREADED = _one_blas_thread() if _TRSM else []


# The arguments that never change, passed by reference (building them per call cost more than
# the solve itself for small n). The flags are NUL-terminated one-character strings.
_UPPER_TRANSPOSED = (b"L", b"U", b"T", b"N")
_UPPER_TRANSPOSED_V = _UPPER_TRANSPOSED[1:]  # ?trsv has no side
_ONE = ctypes.byref(ctypes.c_int(1))
_ALPHA = {dtype: ctypes.byref(_SCALARS[dtype](1.0)) for dtype in _TRSM}


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
    if buffer.shape[0] < n or buffer.shape[1] < n or rhs.shape[1] != n:
        raise IndexError(
            f"a {n}×{n} factor does not fit {tuple(buffer.shape)} / {tuple(rhs.shape)}"
        )
    # A row-major buffer read as column-major (lda = row stride) is Lᵀ, an upper factor; solving
    # Lx = b is therefore "upper, transposed" in BLAS terms, and each row of rhs is one
    # column-major right-hand side (ldb = its row stride). BLAS writes rhs's k rows of n and
    # nothing else: rhs is a view, so that extent lies inside its tensor's memory.
    lda = ctypes.byref(ctypes.c_int(buffer.stride(0)))
    count = ctypes.byref(ctypes.c_int(n))
    if rhs.shape[0] == 1:
        _TRSV[buffer.dtype](
            *_UPPER_TRANSPOSED_V, count, buffer.data_ptr(), lda, rhs.data_ptr(), _ONE
        )
        return
    _TRSM[buffer.dtype](
        *_UPPER_TRANSPOSED,
        count,
        ctypes.byref(ctypes.c_int(rhs.shape[0])),
        _ALPHA[buffer.dtype],
        buffer.data_ptr(),
        lda,
        rhs.data_ptr(),
        ctypes.byref(ctypes.c_int(rhs.stride(0))),
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


def solve_lower_transposed_in_buffer_(buffer: torch.Tensor, n: int, rhs: torch.Tensor) -> None:
    """Overwrite `rhs` (n,) with L⁻ᵀ rhs, L the lower triangle of `buffer[:n, :n]` read in place.

    The row-major buffer read as column-major is Lᵀ, an upper factor: "upper, not transposed"
    in BLAS terms (`solve_lower_in_buffer_` is the transposed case).
    """
    if n == 0:
        return
    if rhs.shape != (n,):
        raise ValueError(f"the right-hand side must have shape ({n},); got {tuple(rhs.shape)}")
    if _blas_usable(buffer, rhs.unsqueeze(0)) and buffer.shape[0] >= n and buffer.shape[1] >= n:
        _TRSV[buffer.dtype](
            b"U",
            b"N",
            b"N",
            ctypes.byref(ctypes.c_int(n)),
            buffer.data_ptr(),
            ctypes.byref(ctypes.c_int(buffer.stride(0))),
            rhs.data_ptr(),
            _ONE,
        )
        return
    block = buffer[:n, :n]
    rhs.copy_(torch.linalg.solve_triangular(block.mT, rhs.unsqueeze(-1), upper=True).squeeze(-1))


def _raw_usable(*tensors: torch.Tensor) -> bool:
    """Whether tensors can be worked on through NumPy views (and BLAS) on the CPU."""
    dtype = tensors[0].dtype
    if dtype not in _TRSM:
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
        source: (b, w) contiguous right-hand sides, w ≥ every listed member's n (or (w,), one
            right-hand side shared by every member).
        rows: n per member (indexed by member).
        members: the members to extend.

    Returns:
        (lᵀl, lᵀ vector[j, :n]) per listed member, as Python floats.
    """
    if not _raw_usable(factor, vector, source):
        return _append_rows_torch_(factor, vector, source, rows, members)
    trsv = _TRSV[factor.dtype]
    f, v, s = factor.numpy(), vector.numpy(), source.numpy()  # views of the same memory
    capacity = factor.shape[-1]
    block_bytes = capacity * capacity * factor.element_size()
    f_base = factor.data_ptr()
    lda = ctypes.byref(ctypes.c_int(capacity))
    out = []
    for j in members:
        n = rows[j]
        if n == 0:
            out.append((0.0, 0.0))
            continue
        if not (0 <= j < factor.shape[0] and n < capacity and n <= source.shape[-1]):
            raise IndexError(f"member {j} with {n} rows does not fit the buffers")
        row = f[j, n, :n]
        row[:] = s[j, :n] if s.ndim == 2 else s[:n]
        count = ctypes.byref(ctypes.c_int(n))
        # factor j's block starts j blocks into the buffer; its row n (the new row, inside the
        # same buffer: checked above) is BLAS's right-hand side.
        trsv(*_UPPER_TRANSPOSED_V, count, f_base + j * block_bytes, lda, row.ctypes.data, _ONE)
        out.append((float(np.dot(row, row)), float(np.dot(row, v[j, :n]))))
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

    On the CPU these are stores through a NumPy view, one per value; elsewhere one scatter per
    tensor.
    """
    for tensor, offsets, values in writes:
        if len(offsets) != len(values):
            raise ValueError(f"{len(offsets)} offsets for {len(values)} values")
        if offsets and (min(offsets) < 0 or max(offsets) >= tensor.numel()):
            raise IndexError(f"offsets out of range for a tensor of {tensor.numel()} elements")
    tensors = [tensor for tensor, _, _ in writes]
    if tensors and _raw_usable(*tensors):
        for tensor, offsets, values in writes:
            flat = tensor.numpy().reshape(-1)  # a view: the tensor is contiguous
            with np.errstate(over="ignore"):  # a float64 past float32's range is inf, as in torch
                for offset, value in zip(offsets, values, strict=True):
                    flat[offset] = value
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
        factor = torch.eye(8, dtype=dtype).repeat(2, 1, 1)
        factor[:, :5, :5] = lower
        vector = torch.randn(2, 8, generator=gen, dtype=dtype)
        source = torch.randn(2, 6, generator=gen, dtype=dtype)
        twin = factor.clone()
        try:
            _blas_solve_rows_(buffer, 5, solved[:, :5])
            ours = append_rows_(factor, vector, source, [5, 5], [0, 1])  # the whole append route
        except Exception:  # a BLAS that fails to run is simply not used
            del _TRSM[dtype]
            continue
        theirs = _append_rows_torch_(twin, vector, source, [5, 5], [0, 1])
        same = (
            torch.allclose(solved[:, :5], expected, rtol=1e-4, atol=1e-5)
            and torch.allclose(factor, twin, rtol=1e-4, atol=1e-5)
            and torch.allclose(torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=1e-5)
        )
        if not same:
            del _TRSM[dtype]


_self_test()
