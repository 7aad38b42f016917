"""core.blas: the in-place solves through scipy.linalg.cython_blas equal torch's, exactly enough.

The reference is `torch.linalg.solve_triangular` on a contiguous copy of the factor; the BLAS
route reads the factor inside a larger buffer and writes strided right-hand sides in place.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import core.blas
from core.blas import (
    append_rows_,
    blas_available,
    set_entries_,
    solve_lower_in_buffer_,
    solve_lower_rows_in_buffer_,
    solve_lower_transposed_in_buffer_,
)

DTYPES = [torch.float64, torch.float32]
TOLERANCE = {torch.float64: (1e-10, 1e-12), torch.float32: (1e-4, 1e-5)}


def _factor(n: int, capacity: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """(capacity, capacity) buffer whose leading n×n block is a well-conditioned Cholesky factor,
    with garbage above the diagonal and past n (which the solve must not read)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    lower = torch.linalg.cholesky(a @ a.mT / n + torch.eye(n, dtype=torch.float64))
    buffer = torch.randn(capacity, capacity, generator=gen, dtype=torch.float64) * 1e3
    buffer[:n, :n] = lower + torch.triu(buffer[:n, :n], 1)
    return buffer.to(dtype)


def test_the_stable_interface_is_the_one_in_use():
    """With SciPy installed, both dtypes go through cython_blas (not the torch fallback)."""
    assert blas_available(torch.float64) and blas_available(torch.float32)


def test_a_capsule_with_another_signature_is_refused():
    assert core.blas._capsule_pointer("dtrsm", "void (int *)") is None
    assert core.blas._capsule_pointer("no_such_routine", core.blas._TRSM_SIGNATURE) is None


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 40),
    extra=st.integers(1, 9),
    k=st.integers(1, 5),
    pad=st.integers(0, 7),
    seed=st.integers(0, 2**16),
)
def test_rows_solve_equals_torch(dtype, n, extra, k, pad, seed):
    buffer = _factor(n, n + extra, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    storage = torch.randn(k, n + pad, generator=gen, dtype=dtype)  # rows spaced by n + pad
    rhs = storage[:, :n]
    expected = torch.linalg.solve_triangular(
        torch.tril(buffer[:n, :n]).contiguous(), rhs.mT.contiguous(), upper=False
    ).mT
    tail = storage[:, n:].clone()
    solve_lower_rows_in_buffer_(buffer, n, rhs)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(rhs, expected, rtol=rtol, atol=atol)
    assert torch.equal(storage[:, n:], tail)  # nothing past each row's n entries is written


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_below_the_factor_in_the_same_buffer(dtype):
    """The rows being appended may live in the buffer itself, below the factor."""
    n, k = 30, 4
    buffer = _factor(n, n + k + 2, dtype, 3)
    reference = buffer.clone()
    rhs = buffer[n : n + k, :n]
    expected = torch.linalg.solve_triangular(
        torch.tril(reference[:n, :n]), reference[n : n + k, :n].mT, upper=False
    ).mT
    solve_lower_rows_in_buffer_(buffer, n, rhs)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(buffer[n : n + k, :n], expected, rtol=rtol, atol=atol)
    assert torch.equal(buffer[:n], reference[:n])  # the factor is untouched
    assert torch.equal(buffer[n : n + k, n:], reference[n : n + k, n:])


def test_single_solve_equals_torch_at_a_large_size():
    n = 600
    buffer = _factor(n, n + 50, torch.float64, 7)
    rhs = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = torch.linalg.solve_triangular(
        torch.tril(buffer[:n, :n]), rhs.unsqueeze(-1), upper=False
    ).squeeze(-1)
    solve_lower_in_buffer_(buffer, n, rhs)
    torch.testing.assert_close(rhs, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_append_rows_equals_the_torch_route(dtype):
    gen = torch.Generator().manual_seed(5)
    capacity, rows = 24, [10, 0, 17]
    factor = torch.eye(capacity, dtype=dtype).repeat(3, 1, 1)
    for j, n in enumerate(rows):
        factor[j] = _factor(max(n, 1), capacity, dtype, j)
    vector = torch.randn(3, capacity, generator=gen, dtype=dtype)
    source = torch.randn(3, 20, generator=gen, dtype=dtype)
    twin = factor.clone()
    ours = append_rows_(factor, vector, source, rows, [0, 1, 2])
    theirs = core.blas._append_rows_torch_(twin, vector, source, rows, [0, 1, 2])
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(factor, twin, rtol=rtol, atol=atol)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=rtol, atol=atol)


def test_append_rows_refuses_a_row_past_the_buffer():
    factor = torch.eye(8, dtype=torch.float64).repeat(2, 1, 1)
    vector = torch.zeros(2, 8, dtype=torch.float64)
    source = torch.ones(2, 8, dtype=torch.float64)
    with pytest.raises(IndexError):
        append_rows_(factor, vector, source, [8, 8], [0])


def test_set_entries_writes_only_the_named_offsets():
    a = torch.zeros(3, 4, dtype=torch.float64)
    b = torch.zeros(5, dtype=torch.float64)
    set_entries_((a, [0, 11], [1.5, -2.0]), (b, [4], [3.0]))
    expected_a = torch.zeros(12, dtype=torch.float64)
    expected_a[0], expected_a[11] = 1.5, -2.0
    assert torch.equal(a.view(-1), expected_a)
    assert b.tolist() == [0.0, 0.0, 0.0, 0.0, 3.0]
    with pytest.raises(IndexError):
        set_entries_((b, [5], [1.0]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 300])
def test_one_right_hand_side_goes_through_trsv_and_equals_torch(dtype, n):
    buffer = _factor(n, n + 3, dtype, n)
    rhs = buffer[n + 1, :n]  # a row of the buffer below the factor, as in an append
    expected = torch.linalg.solve_triangular(
        torch.tril(buffer[:n, :n]), rhs.clone().unsqueeze(-1), upper=False
    ).squeeze(-1)
    assert dtype in core.blas._TRSV
    solve_lower_in_buffer_(buffer, n, rhs)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(buffer[n + 1, :n], expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 7])
def test_transposed_solve_equals_torch(dtype, offset):
    """L⁻ᵀ b, L read in place — from a trailing block too (a view starting inside the buffer),
    as the bounded GP's removal solves it; garbage above the diagonal and past n is not read."""
    n = 120
    buffer = _factor(n + offset, n + offset + 9, dtype, 3)
    block = buffer[offset:, offset:]
    rhs = torch.randn(n, dtype=dtype, generator=torch.Generator().manual_seed(2))
    expected = torch.linalg.solve_triangular(
        torch.tril(block[:n, :n]).mT, rhs.unsqueeze(-1), upper=True
    ).squeeze(-1)
    solve_lower_transposed_in_buffer_(block, n, rhs)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(rhs, expected, rtol=rtol, atol=atol)


def test_scipys_blas_runs_the_block_solve_on_one_thread_unless_told(monkeypatch):
    """SciPy's OpenBLAS, whose ?trsm the block append calls, is set to one thread when
    core.blas loads: its threads busy-wait, and on cores the service's threads hold a two-row
    solve at n = 1,000 took 21 ms instead of 0.5 ms. NumPy's BLAS, another library, keeps its
    threads; an operator's OPENBLAS_NUM_THREADS is left as it is."""
    import os

    import threadpoolctl

    if not blas_available(torch.float64):
        pytest.skip("no SciPy BLAS capsules here: the torch fallback has no such threads")
    if "OPENBLAS_NUM_THREADS" in os.environ:
        pytest.skip("OPENBLAS_NUM_THREADS is set for this run: core.blas leaves it")
    libraries = {i["filepath"]: i for i in threadpoolctl.threadpool_info()}
    assert core.blas.SINGLE_THREADED, "SciPy's BLAS library was not found"
    assert all(libraries[path]["num_threads"] == 1 for path in core.blas.SINGLE_THREADED)
    assert not any("numpy" in path for path in core.blas.SINGLE_THREADED)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert core.blas._one_blas_thread() == []
