"""Errors of the durable store: one root, `StoreError`, whose messages name the store, the
experiment or the round involved; two leaves carry what a caller may act on."""

from __future__ import annotations

__all__ = ["BudgetExceeded", "IllegalTransition", "StoreError"]


class StoreError(Exception):
    """A store operation failed; the message names the store, experiment or round involved."""


class BudgetExceeded(StoreError):
    """A reservation would take reserved + settled past the experiment's total budget."""

    def __init__(
        self, experiment: str, round: int, amount: float, spent: float, budget_total: float
    ) -> None:
        super().__init__(
            f"budget of experiment {experiment!r} exceeded: round {round} needs {amount!r} but "
            f"{spent!r} of {budget_total!r} is already spent (reserved + settled)"
        )
        self.experiment = experiment
        self.round = round
        self.amount = amount
        self.spent = spent
        self.budget_total = budget_total


class IllegalTransition(StoreError):
    """A round status or ledger entry was asked to move where its state machine does not go."""

    def __init__(self, what: str, experiment: str, round: int, current: str, requested: str):
        super().__init__(
            f"{what} of round {round} of experiment {experiment!r}: "
            f"cannot go from {current!r} to {requested!r}"
        )
        self.experiment = experiment
        self.round = round
        self.current = current
        self.requested = requested
