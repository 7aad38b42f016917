"""Running count, mean and spread of a stream of floats, O(1) per value (a river estimator)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RunningMoments"]


@dataclass
class RunningMoments:
    """Count, mean and standard deviation (population, ddof 0) of the values seen so far.

    The sums are kept relative to the first value, the shift: outputs far from 0 with a small
    spread keep their digits, which the plain E[x²] − E[x]² would cancel away.

    Attributes:
        count: values seen.
        shift: the first value (0 before any).
        total: Σ (x − shift).
        total_sq: Σ (x − shift)².

    Example:
        >>> moments = RunningMoments()
        >>> for value in (1e9 + 1.0, 1e9 + 2.0, 1e9 + 3.0):
        ...     moments.update(value)
        >>> moments.count, moments.mean, round(moments.std, 6)
        (3, 1000000002.0, 0.816497)

    References:
        T. F. Chan, G. H. Golub, R. J. LeVeque, "Algorithms for computing the sample variance:
        analysis and recommendations", The American Statistician 37(3), 1983 (shifted data).
    """

    count: int = 0
    shift: float = 0.0
    total: float = 0.0
    total_sq: float = 0.0

    def update(self, value: float) -> None:
        """Add one value."""
        if self.count == 0:
            self.shift = value
        self.count += 1
        delta = value - self.shift
        self.total += delta
        self.total_sq += delta * delta  # a float product overflows to inf, ** would raise

    @property
    def mean(self) -> float:
        return self.shift + self.total / max(self.count, 1)

    @property
    def std(self) -> float:
        count = max(self.count, 1)
        mean_shift = self.total / count
        return math.sqrt(max(self.total_sq / count - mean_shift * mean_shift, 0.0))
