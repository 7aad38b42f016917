"""Arithmetic expressions from a spec, compiled to torch functions — without executing code.

A spec may define a reward as a known function g of its components (paper 003), e.g. the
apparent temperature `T + 0.33 * (RH / 100) * 6.105 * exp(17.27 * T / (237.7 + T)) - 0.70 * ws
- 4.0`. The text is parsed with Python's `ast` and only a whitelist is accepted: numbers, the
declared variable names, + - * / ** and unary minus, and the functions below. Anything else
(attributes, calls of other names, subscripts, lambdas, comprehensions) is an error naming the
offending piece. The result is differentiable (autograd flows through it).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping, Sequence

import torch

from core.errors import ExpressionError

_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "abs": torch.abs,
    "sigmoid": torch.sigmoid,
    "min": torch.minimum,
    "max": torch.maximum,
}
# Over arrays (`compile_expression(..., arrays=True)`): each reduces a field, flattened to its
# last dim, to one number per sample (kept as a dim of 1, so it broadcasts against scalars).
_REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sum": lambda x: x.sum(-1, keepdim=True),
    "mean": lambda x: x.mean(-1, keepdim=True),
    "var": lambda x: x.var(-1, unbiased=False, keepdim=True),
    "amax": lambda x: x.amax(-1, keepdim=True),
    "amin": lambda x: x.amin(-1, keepdim=True),
}
_BINARY = {
    ast.Add: torch.add,
    ast.Sub: torch.sub,
    ast.Mult: torch.mul,
    ast.Div: torch.div,
    ast.Pow: torch.pow,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}
MAX_LENGTH = 2000


Compiled = Callable[[Mapping[str, torch.Tensor]], torch.Tensor]


def compile_expression(text: str, variables: Sequence[str], *, arrays: bool = False) -> Compiled:
    """Compile `text` into a function of a mapping variable name -> tensor.

    Args:
        text: the expression.
        variables: the names it may use (component or action names).
        arrays: allow the reductions sum, mean, var (population), amax and amin. The caller
            then passes each array (..., t) flattened and each scalar as (..., 1); arithmetic
            is element-wise, a reduction maps (..., t) to (..., 1).

    Returns:
        f(values) -> tensor broadcast over the inputs' shapes.

    Raises:
        ExpressionError: naming what is wrong.
    """
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise ExpressionError(f"syntax error at column {error.offset}: {error.msg}") from None
    allowed = set(variables)
    clash = allowed & (set(_FUNCTIONS) | set(_REDUCTIONS) | set(_CONSTANTS))
    if clash:
        raise ExpressionError(f"variable names {sorted(clash)} clash with built-in names")
    functions = {**_FUNCTIONS, **(_REDUCTIONS if arrays else {})}
    _check(tree.body, allowed, functions)
    body = tree.body

    def evaluate(values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        missing = allowed - set(values)
        used = {node.id for node in ast.walk(body) if isinstance(node, ast.Name)}
        if missing & used:
            raise ExpressionError(f"no value for {sorted(missing & used)}")
        reference = next(iter(values.values()), None)
        return _evaluate(body, values, reference, functions)

    return evaluate


def variables_used(text: str) -> set[str]:
    """The names an expression refers to (besides functions and constants)."""
    tree = ast.parse(text, mode="eval")
    return {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name)
        and node.id not in _FUNCTIONS
        and node.id not in _REDUCTIONS
        and node.id not in _CONSTANTS
    }


def _check(node: ast.AST, allowed: set[str], functions: Mapping[str, Callable]) -> None:
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, int | float) or isinstance(node.value, bool):
            raise ExpressionError(f"only numbers are allowed as constants, not {node.value!r}")
    elif isinstance(node, ast.Name):
        if node.id not in allowed and node.id not in _CONSTANTS:
            raise ExpressionError(
                f"unknown name {node.id!r}; allowed: {sorted(allowed) + sorted(_CONSTANTS)}"
            )
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise ExpressionError(f"operator {type(node.op).__name__} is not allowed")
        _check(node.left, allowed, functions)
        _check(node.right, allowed, functions)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, ast.USub | ast.UAdd):
            raise ExpressionError(f"operator {type(node.op).__name__} is not allowed")
        _check(node.operand, allowed, functions)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in functions:
            raise ExpressionError(f"only the functions {sorted(functions)} may be called")
        if node.keywords:
            raise ExpressionError("keyword arguments are not allowed")
        expected = 2 if node.func.id in ("min", "max") else 1
        if len(node.args) != expected:
            raise ExpressionError(f"{node.func.id} takes {expected} argument(s)")
        for arg in node.args:
            _check(arg, allowed, functions)
    else:
        raise ExpressionError(f"{type(node).__name__} is not allowed in an expression")


def _evaluate(
    node: ast.AST,
    values: Mapping[str, torch.Tensor],
    reference: torch.Tensor | None,
    functions: Mapping[str, Callable[..., torch.Tensor]],
) -> torch.Tensor:
    def constant(value: float) -> torch.Tensor:
        if reference is None:
            return torch.tensor(value, dtype=torch.float64)
        return torch.tensor(value, dtype=reference.dtype, device=reference.device)

    if isinstance(node, ast.Constant):
        return constant(float(node.value))
    if isinstance(node, ast.Name):
        return values[node.id] if node.id in values else constant(_CONSTANTS[node.id])
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, values, reference, functions)
        right = _evaluate(node.right, values, reference, functions)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, values, reference, functions)
        return -operand if isinstance(node.op, ast.USub) else operand
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    args = [_evaluate(arg, values, reference, functions) for arg in node.args]
    return functions[node.func.id](*args)
