"""Paper 003's flu-prevention task in a year whose contact rates follow the seasons.

The environment of issue 22's drift task. Rounds are weeks: round t's system is
`AgeStructuredSIR` (`sim.sir`) with every contact rate scaled by the season,

    R0(t) = 1.4 · (1 + A·cos(2π·(t mod P)/P)),   A = 0.15, P = 52 rounds (a year of weeks),

i.e. winter (t ≡ 0) transmits 15% more than the year's mean and summer 15% less: the epidemic a
campaign meets grows and shrinks with the calendar, and so do the sick days it saves. Everything
else — groups, budget, noise, the decomposed reward — is the stationary task's. `at(t)` is round
t's system (its oracle, its optimum under the budget, computed once per week of the year); the
instance itself is round 0's.
"""

from __future__ import annotations

import functools
import math

from sim.sir import R0, AgeStructuredSIR

PERIOD = 52  # rounds per year
AMPLITUDE = 0.15  # of R0 over the year


def seasonal_r0(round: int, period: int = PERIOD) -> float:
    """R0 of round `round`'s week (see the module)."""
    return R0 * (1.0 + AMPLITUDE * math.cos(2.0 * math.pi * (round % period) / period))


class SeasonalSIR(AgeStructuredSIR):
    """`AgeStructuredSIR` with the R0 of week `round % period` (see the module)."""

    def __init__(self, round: int = 0, period: int = PERIOD) -> None:
        self.week, self.period = int(round) % int(period), int(period)
        super().__init__(r0=seasonal_r0(self.week, self.period))
        self.name = "sir-seasonal"
        self.description = (
            f"age-structured SIR flu season (paper 003) whose R0 follows a {period}-round year "
            f"({R0 * (1 - AMPLITUDE):.2f} to {R0 * (1 + AMPLITUDE):.2f})"
        )

    def at(self, round: int) -> SeasonalSIR:
        """Round `round`'s system (the same object for the same week of the year)."""
        return _at(self.period, int(round) % self.period)


@functools.lru_cache(maxsize=512)
def _at(period: int, week: int) -> SeasonalSIR:
    return SeasonalSIR(week, period)
