"""Paper 003's flu-prevention task over a school year: the best use of the vaccine moves.

The environment of issue 22's drift task whose *best action* changes with the calendar (in
`sim.sir_seasonal` the season scales every contact rate alike, so it changes what every plan is
worth but not which plan is best). Rounds are weeks of a 52-week year; round t's system is
`AgeStructuredSIR` (`sim.sir`) with the contact pattern of week t:

- in term, the stationary task's contact matrix C, with the transmissibility q calibrated so that
  R0 = `TERM_R0` = 1.8;
- in the school holidays, contacts among the school-age group (0-19) fall to `AMONG_SCHOOL_AGE`
  = 0.4 of term and its contacts with every other group to `WITH_SCHOOL_AGE` = 0.8 (C_00 × 0.4,
  C_0j and C_j0 × 0.8 for j ≠ 0; the matrix stays reciprocal), everyone else's are as in term,
  and q is the same: R0 falls to 1.35.

Why: school-age children mix most at school, so a holiday removes mostly child-child contacts
and some of children's contacts with adults (teachers, school runs); the other groups' contacts
go on (Hens et al. 2009, BMC Infect. Dis. 9:187, and Eames et al. 2012, PLoS Comput. Biol.
8:e1002425, measured children's contacts falling in holidays, most of all at school; Cauchemez
et al. 2008, Nature 452:750, found influenza transmission among children lower in holidays).
The two factors are our assumption, not a transcription: together they lower R0 by a quarter.
Term R0 1.8 is a strong season (the stationary task's 1.4 is a typical one) — chosen so that the
holiday epidemic (R0 1.35) is still one the budget cannot stop, and the allocation matters in
both regimes.

What moves: in term the best plan under the budget of 0.10 doses per person gives every dose to
the 0-19 group (x = 0.371, 0.93 sick days per person); in a holiday, to the 20-49 group (x =
0.244, 0.15 sick days), where term's plan would lose 0.18 sick days per person and, in term, the
holiday's plan 0.13. A model that does not know the calendar can be right in at most one regime.

The calendar (`HOLIDAY_WEEKS`, week 0 = the first week of January; an English school year):
Christmas (weeks 51, 0), February half-term (7), Easter (13, 14), May half-term (21), summer
(29-34), October half-term (43): 13 holiday weeks, 39 of term. Everything else — groups,
budget, noise, the decomposed reward — is `sim.sir`'s. `at(t)` is round t's system (one object
per regime: the oracle and the optimum under the budget are computed once each); the instance
itself is round 0's (a holiday).
"""

from __future__ import annotations

import functools

import numpy as np

from sim.sir import AgeStructuredSIR

PERIOD = 52  # rounds (weeks) per year
HOLIDAY_WEEKS = frozenset({51, 0, 7, 13, 14, 21, *range(29, 35), 43})
TERM_R0 = 1.8
AMONG_SCHOOL_AGE = 0.4  # contacts among 0-19 in a holiday, of term's
WITH_SCHOOL_AGE = 0.8  # contacts between 0-19 and any other group in a holiday, of term's


def in_holiday(round: int, period: int = PERIOD) -> bool:
    """Whether round `round`'s week of the year is a school holiday (see the module)."""
    return int(round) % period in HOLIDAY_WEEKS


def holiday_factors() -> np.ndarray:
    """(5, 5) factors of the contact matrix in a holiday: symmetric, so C stays reciprocal."""
    factors = np.ones((5, 5))
    factors[0, :] = factors[:, 0] = WITH_SCHOOL_AGE
    factors[0, 0] = AMONG_SCHOOL_AGE
    return factors


class SchoolTermsSIR(AgeStructuredSIR):
    """`AgeStructuredSIR` with the contacts of week `round % 52`'s school calendar (module)."""

    def __init__(self, round: int = 0) -> None:
        self.week = int(round) % PERIOD
        self.holiday = in_holiday(self.week)
        super().__init__(r0=TERM_R0)  # q calibrated to term's contacts, also in a holiday
        if self.holiday:
            self.contacts = self.contacts * holiday_factors()
            self._cache.clear()
        next_gen = self.susceptibility[:, None] * self.contacts / self.gamma
        self.r0_now = self.transmissibility * float(np.abs(np.linalg.eigvals(next_gen)).max())
        self.name = "sir-school-terms"
        self.description = (
            f"age-structured SIR flu season (paper 003) over a school year of {PERIOD} rounds: "
            f"R0 {TERM_R0} in term, {self.r0_now if self.holiday else _holiday_r0():.2f} in the "
            "holidays, when the school-age group's contacts fall"
        )

    def at(self, round: int) -> SchoolTermsSIR:
        """Round `round`'s system (one object per regime: term or holiday)."""
        return _at(in_holiday(round))


@functools.lru_cache(maxsize=2)
def _at(holiday: bool) -> SchoolTermsSIR:
    return SchoolTermsSIR(min(HOLIDAY_WEEKS) if holiday else 2)


def _holiday_r0() -> float:
    return _at(True).r0_now
