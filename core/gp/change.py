"""A change detector over a GP's predictive residuals: when the system shifts, forget the past.

Before a reading y at x is appended, the model predicts it: y ~ N(μ(x), s²(x) + σ²), and the
append already computes z = (y − μ)/√(s² + σ²) (`LearnReport.surprise`, |z|). While the model
is right about the system, z is standard normal and E[z²] = 1; after a shift (a season, a worn
actuator, a new batch) the readings stop fitting and z² grows. `ChangeDetector` runs one
CUSUM (the one-sided Page-Hinkley test) per member on z²:

    Sₜ = max(0, Sₜ₋₁ + min(zₜ², cap) − 1 − slack),   alarm when Sₜ > threshold,

with cap = threshold / 3, so that no single reading (an outlier) raises an alarm on its own: it
takes at least three in a row. A shift that makes E[z²] = 1 + slack + δ is found after about
threshold/δ readings; on a stationary stream the statistic drifts down by `slack` per reading
and returns to 0. The detector also counts the readings since Sₜ was last 0: the test's
estimate of when the change began (the start of the excursion that raised the alarm).

What the model does on an alarm (`IncrementalGP`): the member forgets every reading from
before that estimate (keeping at least `keep` of the newest), is restandardized, rebuilt on
what is left (O(kept³), a few rows) and refit, and the test starts again after `warmup`
readings. The z of a model still learning its hyperparameters is not standard normal (a few
readings, a misfit refit pending), hence the warmup before the first test and after each
alarm. This is the "raise the forgetting rate when readings stop fitting" of time-varying
GP-UCB taken to its end point: all of the past that the test says is stale goes at once;
a temporal kernel's learned lengthscale (`core.gp.temporal`) is the gradual form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CHANGE_FIELDS", "ChangeConfig", "ChangeDetector"]

# The detector's fields in a model's `state()` (`IncrementalGP.state`), each (b,).
CHANGE_FIELDS = ("change_statistic", "change_since_zero", "change_learned", "change_alarms")


@dataclass(frozen=True)
class ChangeConfig:
    """Settings of the detector (the spec's `model.change`).

    Attributes:
        threshold: alarm when the CUSUM of z² − 1 − slack passes this.
        slack: excess of z² per reading tolerated before it counts.
        keep: readings a member keeps on an alarm, at least (more if the test dates the change
            earlier).
        warmup: readings a member learns before its test runs (again after each alarm).
    """

    threshold: float = 30.0
    slack: float = 1.0
    keep: int = 10
    warmup: int = 20

    def __post_init__(self) -> None:
        if not self.threshold > 0:
            raise ValueError(f"change threshold must be > 0; got {self.threshold}")
        if not self.slack >= 0:
            raise ValueError(f"change slack must be >= 0; got {self.slack}")
        if self.keep < 1 or self.warmup < 1:
            raise ValueError(f"change keep and warmup must be >= 1; got {self.keep}, {self.warmup}")


class ChangeDetector:
    """One CUSUM of z² per member of a batch (see the module).

    Args:
        batch: number of members.
        config: the test's settings.
    """

    def __init__(self, batch: int, config: ChangeConfig) -> None:
        self.config = config
        self.cap = config.threshold / 3.0
        self.statistic = [0.0] * batch  # Sₜ per member
        self.since_zero = [0] * batch  # readings since Sₜ was last 0
        self._learned = [0] * batch  # readings since the start or the last alarm
        self.alarms = [0] * batch

    def learn(self, member: int, z: float) -> int | None:
        """One reading's |z| (NaN: nothing learned). On an alarm, returns how many of the
        newest readings stand after the estimated change (and resets the member's test);
        else None."""
        if math.isnan(z):
            return None
        self._learned[member] += 1
        if self._learned[member] <= self.config.warmup:
            return None
        excess = min(z * z, self.cap) - 1.0 - self.config.slack  # z = inf: capped
        value = max(0.0, self.statistic[member] + excess)
        self.statistic[member] = value
        self.since_zero[member] = self.since_zero[member] + 1 if value > 0 else 0
        if value <= self.config.threshold:
            return None
        after = self.since_zero[member]
        self.reset(member)
        self.alarms[member] += 1
        return after

    def state(self) -> dict[str, list]:
        """Everything the test carries from one reading to the next, per member: Sₜ, the
        readings since it was last 0, the readings since the start or the last alarm (the
        warmup), and the alarms so far. Keyed by `CHANGE_FIELDS`."""
        return {
            "change_statistic": list(self.statistic),
            "change_since_zero": list(self.since_zero),
            "change_learned": list(self._learned),
            "change_alarms": list(self.alarms),
        }

    def load(self, state: dict[str, Sequence]) -> None:
        """Continue from `state()` (same batch): the next reading is tested as it would have
        been by the detector that made it."""
        batch = len(self.statistic)
        for name in CHANGE_FIELDS:
            if len(state[name]) != batch:
                raise ValueError(f"{name} has {len(state[name])} members, expected {batch}")
        self.statistic = [float(v) for v in state["change_statistic"]]
        self.since_zero = [int(v) for v in state["change_since_zero"]]
        self._learned = [int(v) for v in state["change_learned"]]
        self.alarms = [int(v) for v in state["change_alarms"]]

    def reset(self, member: int) -> None:
        """Start the member's test again (after its warmup)."""
        self.statistic[member] = 0.0
        self.since_zero[member] = 0
        self._learned[member] = 0
