"""Retired rounds: closed rounds nothing can still arrive for leave memory (a bounded model).

An experiment whose node GPs are bounded (`model.capacity`) keeps its per-round state bounded
too (issue 22): a round *retires* — it leaves `Experiment.rounds`, its oracle value leaves the
regret tracker (whose running sums keep it), and the model may forget its `Round`
(`NetworkModel.release_round`, `core.history`) — once nothing can still arrive for it:

  - it is closed (acknowledged, and every reported node's reading is in: a round closed by
    its timeout with readings missing stays, as a late reading still teaches the model, and so
    do expired and rejected rounds, whose late readings and acks are charged);
  - its oracle value is in, or no device of the spec may send one.

The store has every retired round. What the checks of a message for one need comes from there
on demand (`RoundBook.get`): its action, and that it is closed with every reading in — so a
duplicate ack, reading or oracle of a retired round gets the verdict it got while the round
was in memory ("duplicate"; "unknown_round" for another action's id), at one store read for a
message that is rare (a redelivery of a round long done). An experiment with an exact model
retires nothing: its GPs grow with every round (8·n² bytes a node), the rounds' records with
them, and every round stays as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from agent.rounds import LiveRound, RoundStatus

__all__ = ["RoundBook"]


class RoundBook(dict[int, LiveRound]):
    """The rounds in memory, by number (a dict), whose `get` also answers for retired ones.

    `get(number)` of a retired round returns a stand-in rebuilt from the store: its action,
    its status (closed), a reading of every node (so any reading for it is a duplicate), no
    model row; `[number]`, `in`, iteration and `len` see the rounds in memory only.

    Args:
        retired: whether a round number not in memory is a retired round.
        stand_in: the stand-in of a retired round, from the store (None: not stored).
    """

    def __init__(
        self, retired: Callable[[int], bool], stand_in: Callable[[int], LiveRound | None]
    ) -> None:
        super().__init__()
        self._retired = retired
        self._stand_in = stand_in
        self.retired_count = 0

    def get(self, number: int, default: LiveRound | None = None) -> LiveRound | None:  # type: ignore[override]
        live = super().get(number)
        if live is not None:
            return live
        if isinstance(number, int) and self._retired(number):
            return self._stand_in(number) or default
        return default

    def retire(self, number: int) -> LiveRound:
        """Take a round out of memory (the caller has checked that it may retire)."""
        self.retired_count += 1
        return self.pop(number)


def stand_in_readings(nodes: list[str]) -> dict[str, float]:
    """A retired round's readings as its stand-in shows them: every node, values unknown (a
    reading's duplicate check only asks which nodes a round has)."""
    return dict.fromkeys(nodes, math.nan)


def is_closed_complete(live: LiveRound, reported: list[str]) -> bool:
    """Closed with every reported node's reading in: no reading can be new for it."""
    return live.status is RoundStatus.CLOSED and all(node in live.readings for node in reported)
