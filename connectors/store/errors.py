"""Errors of the durable store: one root, `StoreError`, whose messages name the store, the
experiment or the round involved; the leaves carry what a caller may act on."""

from __future__ import annotations

__all__ = ["BudgetExceeded", "FencedError", "IllegalTransition", "NotRunning", "StoreError"]


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


class FencedError(StoreError):
    """A write carried a lease epoch that is no longer the experiment's: another owner took the
    experiment (or it was never this epoch's). Nothing was written."""

    def __init__(self, experiment: str, epoch: int, current: int, owner: str | None) -> None:
        holder = f"owner {owner!r}" if owner is not None else "no owner"
        super().__init__(
            f"experiment {experiment!r}: lease epoch {epoch} is stale (the current epoch is "
            f"{current}, {holder}); this writer was fenced off and wrote nothing"
        )
        self.experiment = experiment
        self.epoch = epoch
        self.current = current
        self.owner = owner


class NotRunning(StoreError):
    """A reservation for an experiment that an operator paused or stopped: no new action."""

    def __init__(self, experiment: str, round: int, state: str) -> None:
        why = "resume it first" if state == "paused" else "a stopped experiment never acts again"
        super().__init__(
            f"experiment {experiment!r} is {state}: round {round} gets no budget ({why})"
        )
        self.experiment = experiment
        self.round = round
        self.state = state
