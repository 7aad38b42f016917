"""The rounds a `NetworkModel` has run, by index: all of them, or a bounded window of them.

An exact model keeps every round (its GPs grow with them anyway). A bounded one
(`model.capacity`) would otherwise keep one `Round` per round forever — about 2 KB each, the
one part of its memory that still grew with the stream (issue 22) — so its history forgets
rounds once they are *released* (nothing can still arrive for them: the agent releases a round
when it retires it, `agent.experiment`), keeping the `keep` newest released ones beside every
round not released yet. Everything a policy or the model reads of old rounds is then either
in that window (the regret estimate's recent interventions, a policy's scan of recent rounds),
or a running aggregate kept by the model (the count, best and values of the rewards:
`NetworkModel.reward_count`, `best_reward`), or the round count itself (`len`, the round a
policy proposes for), which never shrinks.

Indices are absolute: `history[i]` is round i whatever was forgotten before it (an IndexError
names a forgotten one), iteration goes through the rounds held in index order, and a slice
gives the held rounds among its indices.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from core.network import Round

__all__ = ["History"]


class History(Sequence["Round"]):
    """Rounds by index; with `keep`, released rounds past the `keep` newest are forgotten.

    Args:
        keep: how many released rounds to hold (the newest by index); None: every round.
    """

    def __init__(self, keep: int | None = None) -> None:
        self.keep = keep
        self._records: dict[int, Round] = {}  # by index; appended in index order
        self._count = 0
        self._released: list[int] = []  # a heap of the released indices still held
        self._is_released: set[int] = set()  # the same, to refuse a second release

    @property
    def held(self) -> int:
        """How many rounds are in memory (`len` counts every round ever started)."""
        return len(self._records)

    def append(self, record: Round) -> int:
        """Hold a new round (its `index` must be `len(self)`); returns its index."""
        index = self._count
        if record.index != index:
            raise ValueError(f"round {record.index} appended as round {index}")
        self._records[index] = record
        self._count += 1
        return index

    def release(self, index: int) -> list[int]:
        """Nothing more can arrive for round `index`: with `keep`, it may now be forgotten.
        Returns the indices forgotten by this call (the oldest released, past `keep`)."""
        if self.keep is None or index not in self._records or index in self._is_released:
            return []
        heapq.heappush(self._released, index)
        self._is_released.add(index)
        forgotten = []
        while len(self._released) > self.keep:
            oldest = heapq.heappop(self._released)
            self._is_released.discard(oldest)
            del self._records[oldest]
            forgotten.append(oldest)
        return forgotten

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Round: ...

    @overload
    def __getitem__(self, index: slice) -> list[Round]: ...

    def __getitem__(self, index: int | slice) -> Round | list[Round]:
        if isinstance(index, slice):
            indices = range(*index.indices(self._count))
            return [self._records[i] for i in indices if i in self._records]
        i = index + self._count if index < 0 else index
        record = self._records.get(i)
        if record is None:
            if 0 <= i < self._count:
                raise IndexError(f"round {i} was released and forgotten (a bounded history)")
            raise IndexError(f"round {index} not in a history of {self._count}")
        return record

    def __iter__(self) -> Iterator[Round]:
        return iter(list(self._records.values()))

    def __reversed__(self) -> Iterator[Round]:
        return reversed(list(self._records.values()))

    def __contains__(self, record: object) -> bool:
        index = getattr(record, "index", None)
        return isinstance(index, int) and self._records.get(index) is record

    def __bool__(self) -> bool:
        return self._count > 0
