"""Spec expressions compile to torch functions and refuse anything but arithmetic."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from core.expression import ExpressionError, compile_expression, variables_used

APPARENT = "T + 0.33 * (RH / 100) * 6.105 * exp(17.27 * T / (237.7 + T)) - 0.70 * ws - 4.0"


def test_apparent_temperature_matches_a_hand_computation():
    g = compile_expression(APPARENT, ["T", "RH", "ws"])
    f64 = {"dtype": torch.float64}
    value = g(
        {
            "T": torch.tensor(30.0, **f64),
            "RH": torch.tensor(50.0, **f64),
            "ws": torch.tensor(2.0, **f64),
        }
    )
    e = 0.5 * 6.105 * math.exp(17.27 * 30 / (237.7 + 30))
    assert float(value) == pytest.approx(30 + 0.33 * e - 1.4 - 4.0, rel=1e-12)


def test_gradients_flow_through():
    g = compile_expression("a * exp(b) - max(a, b) + sqrt(abs(b))", ["a", "b"])
    a = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    g({"a": a, "b": b}).backward()
    assert float(a.grad) == pytest.approx(math.exp(0.5) - 1)


def test_broadcasting_over_batches():
    g = compile_expression("2 * x + y ** 2", ["x", "y"])
    out = g({"x": torch.ones(3, 4), "y": torch.arange(4.0)})
    assert out.shape == (3, 4)
    assert torch.equal(out[1], 2 + torch.arange(4.0) ** 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("__import__('os').system('true')", "only the functions"),
        ("x.real", "Attribute is not allowed"),
        ("x[0]", "Subscript is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("z + 1", "unknown name 'z'"),
        ("x // 2", "FloorDiv is not allowed"),
        ("'text'", "only numbers"),
        ("exp(x, x)", "exp takes 1 argument"),
        ("x +", "syntax error"),
        ("x if x else 1", "IfExp is not allowed"),
    ],
)
def test_anything_but_arithmetic_is_refused(text, message):
    with pytest.raises(ExpressionError, match=message):
        compile_expression(text, ["x"])


def test_names_that_shadow_builtins_are_refused():
    with pytest.raises(ExpressionError, match="clash"):
        compile_expression("exp + 1", ["exp"])


@given(st.text(max_size=60))
def test_arbitrary_text_never_raises_anything_but_expression_error(text):
    with contextlib.suppress(ExpressionError):
        compile_expression(text, ["x", "y"])


def test_variables_used():
    assert variables_used(APPARENT) == {"T", "RH", "ws"}
