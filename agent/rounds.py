"""A round as the agent tracks it, and what the agent says about rounds and messages.

Round lifecycle:

    proposed --publish--> published --ack applied--> acked --all readings / timeout--> closed
                              |  \\--ack rejected--> rejected (budget released)
                              \\--no ack received by expires_at--> expired (budget released)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import structlog
from structlog.typing import FilteringBoundLogger

from connectors.schemas import Action
from connectors.store import OPEN_STATUSES as STORE_OPEN_STATUSES
from connectors.store import RoundStatus  # the project's one list of round statuses

__all__ = [
    "OPEN_STATUSES",
    "EventSink",
    "LiveRound",
    "Outcome",
    "RoundEvent",
    "RoundStatus",
    "Verdict",
]

Outcome = Literal["accepted", "duplicate", "late", "rejected"]


OPEN_STATUSES = frozenset(STORE_OPEN_STATUSES)


@dataclass(frozen=True)
class Verdict:
    """What became of one incoming message."""

    outcome: Outcome
    reason: str = ""


@dataclass
class LiveRound:
    """A round as the agent tracks it; `log` carries its experiment and number.

    `proposed_at` is wall time (it is stored and sent). The timer fields — published_at,
    acked_at, closed_at, last_reading_at, retry_at and expires_tick — are on the experiment's
    monotonic clock (`Experiment.ticks`): timeouts and durations must not jump with the wall
    clock. `expires_tick` is the action's `expires_at` (wall time, for devices) on that clock.
    """

    number: int
    action: Action
    target_set: tuple[str, ...]
    cost: float
    acquisition: float
    policy: str
    model_round: int
    status: RoundStatus = RoundStatus.PROPOSED
    proposed_at: float = 0.0
    published_at: float | None = None
    acked_at: float | None = None
    closed_at: float | None = None
    last_reading_at: float | None = None
    retry_at: float | None = None  # a device said "busy": re-publish then
    expires_tick: float | None = None  # action.expires_at, on the monotonic clock
    # recovered, not acknowledged: none of its timers runs until this life's first broker
    # session is up, when its expiry window starts (`agent.recovery.start_windows`)
    awaits_session: bool = False
    pending: int | None = None  # the model's pending-point handle while the round is in flight
    # False between `propose(deferred=True)` and `settle`: its regret estimate, model row and
    # pending point are not made yet (the runtime settles it right after publishing it)
    settled: bool = True
    readings: dict[str, float] = field(default_factory=dict)
    log: FilteringBoundLogger = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # bound once, so no event about the round has to name it by hand
        self.log = structlog.get_logger(__name__).bind(
            experiment=self.action.experiment, round=self.number
        )

    @property
    def intervention(self) -> dict[str, float]:
        return dict(self.action.intervention)

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES


@dataclass(frozen=True)
class RoundEvent:
    """Something a person watching the agent wants to see (the demo's live view, logs)."""

    kind: Literal["proposed", "published", "closed", "rejected", "expired", "finished"]
    experiment: str
    round: int | None
    intervention: dict[str, float] = field(default_factory=dict)
    reward: float | None = None
    expected_reward: float | None = None
    cumulative_regret: float | None = None
    regret_upper_estimate: float | None = None
    decision_seconds: float | None = None
    decision_latency_s: float | None = None
    detail: str = ""


EventSink = Callable[[RoundEvent], None]
