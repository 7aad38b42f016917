"""The experiment's recommendation: what its policy would run if it stopped now (issue 14).

A multi-fidelity experiment pays for cheap, short trials to decide about long ones; what an
operator takes away is the setting the model believes best at full fidelity, argmax_θ μ(θ,
τ_max), not the trial run last. After every published round (in the worker thread that settles
it, off the decision's latency) `refresh` asks the policy (`Policy.recommendation`) and, when it
changed, leaves a `Recommended` message for the runtime to publish, retained, on
``{prefix}/{experiment}/recommendation``, and sets `cbo_recommended_value`. When the experiment
has finished — its budget or its rounds spent, every round in — `refresh(final=True)` asks once
more, letting the policy fit first where a fit is due, and marks the message final: what the
experiment leaves behind. A policy that keeps no recommendation (the default) publishes nothing.

Refreshing never fails the experiment: a policy that raises is logged in one line (the
traceback at debug level) and the last recommendation stands.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from connectors.schemas import Recommended

if TYPE_CHECKING:
    from agent.experiment import Experiment

__all__ = ["refresh", "take"]


def refresh(exp: Experiment, final: bool = False) -> None:
    """Ask the policy for its recommendation; keep it to publish if it changed (or is final).

    Runs where the model may be read (a worker call holding `exp.learning`)."""
    try:
        current = exp.policy.recommendation(exp.model, refit=final)
    except Exception as error:  # the last recommendation stands; the experiment goes on
        exp.log.warning("recommendation.failed", error=f"{type(error).__name__}: {error}"[:300])
        exp.log.debug("recommendation.failed.traceback", exc_info=error)
        return
    if current is None:
        return
    numbers = [current.predicted, *current.values.values()]
    if not all(math.isfinite(v) for v in numbers):  # nothing a receiver could read
        exp.log.warning("recommendation.failed", error="not finite", predicted=current.predicted)
        return
    message = Recommended(
        experiment=exp.name,
        values=current.values,
        predicted=current.predicted,
        fidelity=current.fidelity,
        trials=current.trials,
        final=final,
        at=exp.clock(),
    )
    last = exp.recommended
    same = (
        last is not None
        and last.values == message.values
        and last.predicted == message.predicted
        and last.final == message.final
    )
    if same:
        return
    exp.recommended = message
    exp.recommendation_due = message
    if exp.metrics is not None:
        exp.metrics.set_recommended_value(exp.name, message.predicted)
    exp.log.info(
        "recommendation.changed",
        predicted=message.predicted,
        trials=message.trials,
        final=final,
    )


def take(exp: Experiment) -> Recommended | None:
    """The recommendation to publish now (once), or None."""
    message, exp.recommendation_due = exp.recommendation_due, None
    return message
