"""The errors core raises: one root, `CoreError`, and leaves that also inherit a builtin.

A caller that knows cbo-agent catches `CoreError` (or a leaf); one that does not still catches
the builtin it would expect — `ValueError` for bad input, `RuntimeError` for a failed
computation — as BoTorch's `InfeasibilityError(BotorchError, ValueError)` does. The root is
core's, not the project's: connectors/ may not import core (DESIGN.md), so their errors keep
roots of their own.
"""

from __future__ import annotations

__all__ = ["CoreError", "DeviceError", "ExpressionError", "NumericalError", "SpecError"]


class CoreError(Exception):
    """Root of every error core raises."""


class NumericalError(CoreError, RuntimeError):
    """A matrix that must be positive definite stayed indefinite even after adding jitter."""


class DeviceError(CoreError, ValueError):
    """A device that cannot hold the models: not a torch device, or CUDA asked for and absent."""


class SpecError(CoreError, ValueError):
    """A spec file that cannot be read or does not validate; `problems` lists each issue."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


class ExpressionError(CoreError, ValueError):
    """An expression that cannot be parsed or uses something outside the whitelist."""
