"""Settings and reports of the incremental GP, and the numeric floors all of it shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from core.gp.change import ChangeConfig
from core.hyperfit import PriorName
from core.kernels import KERNELS, KernelName

__all__ = ["LENGTHSCALE_FLOOR", "MIN_NOISE", "GPConfig", "LearnReport"]

MIN_NOISE = 1e-6  # standardized units; the noise floor of a noiseless node (as papers 003/004)
# Fitted lengthscales (unit-cube inputs) are kept at or above this. A marginal-likelihood fit can
# drive an unidentified lengthscale toward 0 (seen: 2.5e-12 for GP-UCB on alpine2-noisy); the
# expansion |a|² − 2ab + |b|² of squared distances then cancels catastrophically, the Gram
# matrix turns indefinite beyond what jitter repairs, and such a kernel models nothing anyway.
LENGTHSCALE_FLOOR = 1e-3


@dataclass
class GPConfig:
    """Settings shared by every member of an IncrementalGP.

    Attributes:
        kernel: "matern52" or "rbf", both with ARD lengthscales and an output scale.
        noise_variance: known observation-noise variance in output units, one value for all
            members or one per member; None (for all or per member) means the noise is learned.
        priors: hyperparameter prior family, see `core.hyperfit`.
        refit_every: refit a member's hyperparameters after this many new observations
            (None: never on count).
        misfit_z: refit a member when a reading lies more than this many predictive standard
            deviations from the prediction (None: never on misfit).
        min_fit_points: a member is refit only once it has at least this many observations.
        window: keep at most this many observations (the oldest are forgotten, each by an
            exact O(n²) update of the factor); None keeps all.
        capacity: exact up to this many observations per member; past it, a member keeps its
            `budget` most informative rows, each reading O(budget²) (`core.gp.bounded`; a model
            with a capacity is made by `core.gp.bounded.make_gp`). None: no bound.
        budget: rows kept past the capacity (at most the capacity); None: the capacity.
        change: a change detector over the predictive residuals (`core.gp.change`): on an
            alarm a member forgets its readings from before the change and refits. None: none.
        drift_tolerance: rebuild when the data mean moves by more than this many scales from the
            frozen standardization, or the data scale changes by more than this factor.
        deferred: refits and drift rebuilds are left to the caller, who runs them beside the
            model (`IncrementalGP.refit_job`, `core.gp.refit.run_refit`,
            `IncrementalGP.install`); learning then only appends rows (and forgets them, with
            a window). False: they run inside the learn call that makes them due.
    """

    kernel: KernelName = "matern52"
    noise_variance: float | Sequence[float | None] | None = None
    priors: PriorName = "gamma"
    refit_every: int | None = 10
    misfit_z: float | None = 4.0
    min_fit_points: int = 3
    window: int | None = None
    capacity: int | None = None
    budget: int | None = None
    change: ChangeConfig | None = None
    drift_tolerance: float = 0.5
    deferred: bool = False

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}; got {self.kernel!r}")
        if self.refit_every is not None and self.refit_every < 1:
            raise ValueError(f"refit_every must be >= 1 or None; got {self.refit_every}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1 or None; got {self.window}")
        if self.capacity is not None and self.capacity < 2:
            raise ValueError(f"capacity must be >= 2 or None; got {self.capacity}")
        if self.budget is not None:
            if self.capacity is None:
                raise ValueError("budget needs a capacity")
            if not 2 <= self.budget <= self.capacity:
                raise ValueError(f"budget must be in [2, capacity]; got {self.budget}")
        if self.capacity is not None and self.window is not None:
            raise ValueError("window and capacity exclude each other: set one")
        if self.drift_tolerance <= 0:
            raise ValueError(f"drift_tolerance must be > 0; got {self.drift_tolerance}")


@dataclass
class LearnReport:
    """What one call to `learn_one` (or `learn_block`, `learn_many`) did, for logs and metrics.

    Attributes:
        surprise: (b,) |y − prediction| / predictive std per member (NaN where not learned).
        refit: members whose hyperparameters were refit.
        refit_failed: members among those whose optimizer did not converge (they keep the best
            values it reached).
        rebuilt: members whose factor was rebuilt (refit, drift or jitter; the window removes
            a row in O(n²) and rebuilds only when learn_many overflows it or that fails).
        forgotten: rows dropped by the window.
        changed: members whose change detector raised an alarm (they forgot their readings
            from before the change and are rebuilt and due for a refit).
    """

    surprise: torch.Tensor
    refit: list[int] = field(default_factory=list)
    refit_failed: list[int] = field(default_factory=list)
    rebuilt: list[int] = field(default_factory=list)
    forgotten: int = 0
    changed: list[int] = field(default_factory=list)
