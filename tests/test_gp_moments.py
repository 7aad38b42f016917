"""RunningMoments, the streaming estimator behind drift detection, agrees with two passes."""

from __future__ import annotations

import doctest
import math

from hypothesis import given
from hypothesis import strategies as st

import core.gp.moments
from core.gp.moments import RunningMoments


def test_the_docstring_example_runs():
    assert doctest.testmod(core.gp.moments).failed == 0


def test_nothing_seen_is_count_zero_mean_zero_spread_zero():
    moments = RunningMoments()
    assert (moments.count, moments.mean, moments.std) == (0, 0.0, 0.0)


@given(
    st.floats(-1e9, 1e9),
    st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=50),
)
def test_one_update_at_a_time_equals_two_passes(offset, deltas):
    """Far from 0 with a small spread (offset 1e9, spread 1e3) the shift keeps the digits."""
    values = [offset + delta for delta in deltas]
    moments = RunningMoments()
    for value in values:
        moments.update(value)
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((value - mean) ** 2 for value in values) / len(values))
    assert moments.count == len(values)
    assert math.isclose(moments.mean, mean, rel_tol=1e-12, abs_tol=1e-6)
    assert math.isclose(moments.std, std, rel_tol=1e-6, abs_tol=1e-6)
