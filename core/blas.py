"""Triangular solves against a factor stored inside a larger, preallocated buffer.

The incremental GP keeps its Cholesky factor in the top-left n×n block of a (capacity×capacity)
buffer so that appending a row never moves the rows above it. `torch.linalg.solve_triangular`
only accepts contiguous matrices, so it copies such a block first — an O(n²) copy that costs as
much as the solve itself (measured: 3.1 ms instead of 0.3 ms at n = 2000). BLAS's `trsm` takes a
leading dimension and reads the block in place, so on the CPU we call the `?trsm_` routine of the
BLAS that torch itself links (MKL or OpenBLAS). Where that symbol is missing, or on another
device, we fall back to torch on a contiguous copy: correct everywhere, fast where it matters.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable

import torch

_CHAR = ctypes.c_char
_INT = ctypes.c_int


def _candidate_libraries() -> list[str]:
    torch_dir = os.path.dirname(torch.__file__)
    names = [os.path.join(torch_dir, "lib", "libtorch_cpu.so")]
    names += sorted(glob.glob(os.path.join(torch_dir, "lib", "*blas*.so*")))
    names += sorted(glob.glob(os.path.join(os.path.dirname(torch_dir), "torch.libs", "*blas*.so*")))
    return [name for name in names if os.path.exists(name)]


def _load_trsm(symbol: str, scalar: type) -> Callable | None:
    for path in _candidate_libraries():
        try:
            fn = getattr(ctypes.CDLL(path), symbol)
        except (OSError, AttributeError):
            continue
        fn.restype = None
        fn.argtypes = [
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
        ]
        return fn
    return None


_TRSM: dict[torch.dtype, tuple[Callable, type]] = {}
for _dtype, _symbol, _scalar in (
    (torch.float64, "dtrsm_", ctypes.c_double),
    (torch.float32, "strsm_", ctypes.c_float),
):
    _fn = _load_trsm(_symbol, _scalar)
    if _fn is not None:
        _TRSM[_dtype] = (_fn, _scalar)


# The arguments that never change, passed by reference (building them per call cost more than
# the solve itself for small n).
_UPPER_TRANSPOSED = tuple(ctypes.byref(_CHAR(flag)) for flag in (b"L", b"U", b"T", b"N"))
_ONE_RHS = ctypes.byref(_INT(1))
_ALPHA = {dtype: ctypes.byref(scalar(1.0)) for dtype, (_, scalar) in _TRSM.items()}


def _blas_solve_lower_(buffer: torch.Tensor, n: int, rhs: torch.Tensor) -> None:
    """BLAS call: overwrite `rhs` with L⁻¹ rhs, L the lower n×n block of row-major `buffer`."""
    fn = _TRSM[buffer.dtype][0]
    # A row-major buffer read as column-major (lda = row stride) is Lᵀ, an upper factor; solving
    # Lx = b is therefore "upper, transposed" in BLAS terms.
    fn(
        *_UPPER_TRANSPOSED,
        ctypes.byref(_INT(n)),
        _ONE_RHS,
        _ALPHA[buffer.dtype],
        buffer.data_ptr(),
        ctypes.byref(_INT(buffer.stride(0))),
        rhs.data_ptr(),
        ctypes.byref(_INT(max(n, 1))),
    )


def _blas_usable(buffer: torch.Tensor, rhs: torch.Tensor) -> bool:
    return (
        buffer.device.type == "cpu"
        and buffer.dtype in _TRSM
        and rhs.dtype == buffer.dtype
        and buffer.stride(1) == 1
        and rhs.is_contiguous()
        and not rhs.requires_grad
        and not buffer.requires_grad
    )


def solve_lower_in_buffer_(buffer: torch.Tensor, n: int, rhs: torch.Tensor) -> None:
    """Overwrite `rhs` (n,) with L⁻¹ rhs, L the lower triangle of `buffer[:n, :n]` read in place.

    Args:
        buffer: (capacity, capacity) tensor, row-major; only the lower triangle of its leading
            n×n block is read.
        n: size of the factor.
        rhs: (n,) contiguous right-hand side, overwritten; it may be a row of another buffer
            (the row being appended).
    """
    if n == 0:
        return
    if _blas_usable(buffer, rhs):
        _blas_solve_lower_(buffer, n, rhs)
        return
    block = buffer[:n, :n]
    rhs.copy_(torch.linalg.solve_triangular(block, rhs.unsqueeze(-1), upper=False).squeeze(-1))


def blas_available(dtype: torch.dtype = torch.float64) -> bool:
    """Whether in-place BLAS solves are available for `dtype` on the CPU."""
    return dtype in _TRSM


def _self_test() -> None:
    """Drop the BLAS route if it disagrees with torch on a small problem (a wrong ABI, say)."""
    for dtype in list(_TRSM):
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(5, 5, generator=gen, dtype=dtype)
        lower = torch.linalg.cholesky(a @ a.mT + 5 * torch.eye(5, dtype=dtype))
        buffer = torch.zeros(8, 8, dtype=dtype)
        buffer[:5, :5] = lower
        rhs = torch.randn(5, generator=gen, dtype=dtype)
        x = rhs.clone()
        try:
            _blas_solve_lower_(buffer, 5, x)
        except Exception:  # a foreign BLAS that fails to load or run is simply not used
            del _TRSM[dtype]
            continue
        expected = torch.linalg.solve_triangular(lower, rhs.unsqueeze(-1), upper=False)
        if not torch.allclose(x, expected.squeeze(-1), rtol=1e-4, atol=1e-5):
            del _TRSM[dtype]


_self_test()
