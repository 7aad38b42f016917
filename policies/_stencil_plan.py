"""`hagpucb`'s phase-1 plan: its finite-difference stencil points, indexed without being built.

Phase 1 plays `blocks` stencils (`core.structure.stencil`) one after the other: the stencil of
base 0 `repeats` times, then base 1's, and so on — T0 bases played C1 times each, or, under a
block limit, the default θ's stencil T0·C1 times. A stencil has q = 1 + D + |pairs| points,
so the plan has `bases · repeats · q` points: at D = 414 with every pair queried that is
85,906 points of 414 coordinates (285 MB), which the policy used to build, and round to
9 decimals coordinate by coordinate, in its constructor (47 s before a service's first
proposal). Nothing here costs more than O(bases · D) up front.

Every point of a stencil differs from its base in at most two coordinates, each either left at
its value or stepped. So a base is two rows of declared values, `low` (the coordinate not
stepped) and `high` (stepped), computed with the same floating-point operations the full
stencil used: point k is `where(stepped(k), high, low)`, equal bit for bit to the old row.

The policy recognises its points in the history by their key (every coordinate rounded to
9 decimals, `policies.hagpucb.key`): a stencil point's key is, coordinate by coordinate, the
key of `low` or of `high`. A record's key is thus matched by comparing it to the bases' two
key rows: the coordinates off `low` must be on `high` and form an empty set, one coordinate or
a queried pair. (A coordinate whose `low` and `high` keys are equal — a step below the
rounding — can be stepped or not for the same key; `match` enumerates those too, so that every
point with the record's key is found, as the old key-by-key comparison found them.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch

from core.structure import Pairs, stencil_size

__all__ = ["Entry", "StencilPlan", "key"]

Entry = tuple[int, int]  # (base, index in its stencil): every repeat of a base shares it


def key(values: Sequence[float]) -> tuple[float, ...]:
    """A point's identity in the history: its coordinates rounded to 9 decimals."""
    return tuple(round(float(v), 9) for v in values)


@dataclass(frozen=True)
class StencilPlan:
    """The points of phase 1, in play order, computed one at a time.

    Attributes:
        low: (B, D) float64, each base's declared coordinates where they are not stepped.
        high: (B, D) float64, the same coordinates stepped (base + d_a·h, in declared units).
        repeats: plays of each base's stencil in a row.
        pairs: the pairs (a, b), a < b, whose mixed point the stencil holds, in its order.
    """

    low: torch.Tensor
    high: torch.Tensor
    repeats: int
    pairs: Pairs

    def __post_init__(self) -> None:
        dim = self.dim
        rows, cols = self.pairs
        index = torch.full((dim, dim), -1, dtype=torch.long)  # pair (a, b) -> its position
        index[rows, cols] = torch.arange(rows.numel())
        object.__setattr__(self, "_pair_index", index)
        # the keys of low and high, numpy for a vectorised comparison with the history's keys
        low_keys = np.array([key(row) for row in self.low.tolist()], dtype=np.float64)
        high_keys = np.array([key(row) for row in self.high.tolist()], dtype=np.float64)
        object.__setattr__(self, "_low_keys", low_keys.reshape(self.bases, dim))
        object.__setattr__(self, "_high_keys", high_keys.reshape(self.bases, dim))

    @property
    def dim(self) -> int:
        return int(self.low.shape[1])

    @property
    def bases(self) -> int:
        return int(self.low.shape[0])

    @property
    def size(self) -> int:
        """q: the points of one stencil, 1 + D + |pairs|."""
        return stencil_size(self.dim, self.pairs)

    def __len__(self) -> int:
        return self.bases * self.repeats * self.size

    # ---------------------------------------------------------------- indexing
    def entry(self, k: int) -> Entry:
        """The (base, stencil index) of point k of the plan."""
        q = self.size
        return (k // q) // self.repeats, k % q

    def first_index(self, entry: Entry) -> int:
        """The plan index of an entry's first play."""
        base, j = entry
        return base * self.repeats * self.size + j

    def stepped(self, j: int) -> tuple[int, ...]:
        """The coordinates stencil point j steps: none, (a,) or (a, b)."""
        dim = self.dim
        if j == 0:
            return ()
        if j <= dim:
            return (j - 1,)
        rows, cols = self.pairs
        return int(rows[j - dim - 1]), int(cols[j - dim - 1])

    def point(self, k: int) -> torch.Tensor:
        """(D,) float64: point k in declared units, as the full stencil held it."""
        base, j = self.entry(k)
        row = self.low[base].clone()
        steps = list(self.stepped(j))
        row[steps] = self.high[base, steps]
        return row

    # ---------------------------------------------------------------- matching
    def match(self, record_key: Sequence[float]) -> list[Entry]:
        """The entries whose points have this key (usually one or none)."""
        values = np.asarray(record_key, dtype=np.float64)
        found: list[Entry] = []
        for base in range(self.bases):
            low, high = self._low_keys[base], self._high_keys[base]  # type: ignore[attr-defined]
            off = np.flatnonzero(values != low)
            if len(off) > 2 or not np.array_equal(values[off], high[off]):
                continue
            free = np.flatnonzero(low == high)  # stepped or not, the same key
            for steps in _step_sets(tuple(int(i) for i in off), [int(i) for i in free]):
                j = self._index_of(steps)
                if j is not None:
                    found.append((base, j))
        return found

    def _index_of(self, steps: tuple[int, ...]) -> int | None:
        """The stencil index that steps exactly these (sorted) coordinates; None: not queried."""
        if not steps:
            return 0
        if len(steps) == 1:
            return 1 + steps[0]
        position = int(self._pair_index[steps[0], steps[1]])  # type: ignore[attr-defined]
        return None if position < 0 else 1 + self.dim + position


def _step_sets(off: tuple[int, ...], free: list[int]) -> Iterator[tuple[int, ...]]:
    """The sorted sets of ≤ 2 coordinates holding `off` and otherwise only `free` ones."""
    room = 2 - len(off)
    others = [i for i in free if i not in off]
    for extra in range(room + 1):
        for added in combinations(others, extra):
            yield tuple(sorted(off + added))
