"""An exact GP that learns one observation at a time: the Cholesky factor grows by row appends.

`IncrementalGP` holds a batch of b independent GPs (one per node of a causal graph, say). Each
member has its own number of rows n_j; the batch shares one (b, capacity, capacity) buffer whose
rows past a member's n_j hold the identity, so a batched solve or Cholesky over max_j n_j rows is
exact for every member at once, and members learn independently (a node whose reading is late, or
that was set by a hard intervention, simply does not append).

Per member with n rows, unit-cube inputs Z and standardized outputs ỹ:

    K + σ²I = L Lᵀ,     v = L⁻¹ ỹ,     α = L⁻ᵀ v (the weights, derived lazily).

Appending x*, y*:   l = L⁻¹ k(Z, x*)  — the only O(n²) step, one triangular solve read in place
                    d = √(k(x*, x*) + σ² − lᵀl)
                    L ← [[L, 0], [lᵀ, d]],   v ← [v; (ỹ* − lᵀv) / d]

The posterior mean at x* before the append is lᵀv and the predictive variance d², so the
"surprise" of every reading (which triggers refits) costs nothing extra.

Inputs are scaled to the unit cube from declared bounds and outputs standardized with a mean and
scale that stay fixed between refits, so appends stay exact; when the data drift away from them
the factor is rebuilt. Pending points (inputs whose readings are not known yet) are kept as each
member's trailing rows with the posterior mean as their value: the variance shrinks, the mean
does not move. Everything follows the dtype and device of the declared bounds (float64 default).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from core.blas import (
    append_rows_,
    set_entries_,
    solve_lower_in_buffer_,
    solve_lower_rows_in_buffer_,
)
from core.errors import NumericalError
from core.hyperfit import FittedHyperparameters, PriorName, fit_hyperparameters
from core.kernels import KERNELS, KernelName, gram_matrix, kernel_matrix, kernel_row

MIN_NOISE = 1e-6  # standardized units; the noise floor of a noiseless node (as papers 003/004)
_MAX_JITTER_TRIES = 8
# Fitted lengthscales (unit-cube inputs) are kept at or above this. A marginal-likelihood fit can
# drive an unidentified lengthscale toward 0 (seen: 2.5e-12 for GP-UCB on alpine2-noisy); the
# expansion |a|² − 2ab + |b|² of squared distances then cancels catastrophically, the Gram
# matrix turns indefinite beyond what jitter repairs, and such a kernel models nothing anyway.
LENGTHSCALE_FLOOR = 1e-3
REBUILD_BYTES = 512 * 2**20  # kernel matrices held at once while refactorizing
_FORGET_BLOCK = 2**17  # elements of the factor a window removal works on at once (1 MiB)


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
        drift_tolerance: rebuild when the data mean moves by more than this many scales from the
            frozen standardization, or the data scale changes by more than this factor.
    """

    kernel: KernelName = "matern52"
    noise_variance: float | Sequence[float | None] | None = None
    priors: PriorName = "gamma"
    refit_every: int | None = 10
    misfit_z: float | None = 4.0
    min_fit_points: int = 3
    window: int | None = None
    drift_tolerance: float = 0.5

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}; got {self.kernel!r}")
        if self.refit_every is not None and self.refit_every < 1:
            raise ValueError(f"refit_every must be >= 1 or None; got {self.refit_every}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1 or None; got {self.window}")
        if self.drift_tolerance <= 0:
            raise ValueError(f"drift_tolerance must be > 0; got {self.drift_tolerance}")


@dataclass(frozen=True)
class GPPosterior:
    """Posterior of the latent function (no observation noise), in output units.

    Attributes:
        mean: (b, q)
        variance: (b, q)
        covariance: (b, q, q), present when asked for.
    """

    mean: torch.Tensor
    variance: torch.Tensor
    covariance: torch.Tensor | None = None

    @property
    def stddev(self) -> torch.Tensor:
        return self.variance.clamp_min(0.0).sqrt()


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
    """

    surprise: torch.Tensor
    refit: list[int] = field(default_factory=list)
    refit_failed: list[int] = field(default_factory=list)
    rebuilt: list[int] = field(default_factory=list)
    forgotten: int = 0


@dataclass
class _RunningMoments:
    """Count, mean and spread of a member's outputs, shifted by the first value for accuracy."""

    count: int = 0
    shift: float = 0.0
    total: float = 0.0
    total_sq: float = 0.0

    def add(self, value: float) -> None:
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


@dataclass
class _Pending:
    ident: int
    z: torch.Tensor  # (b, d) unit-cube input
    members: list[int]  # the members it applies to


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run the body with one intra-op thread (torch's setting is per calling thread).

    A block append is small tensor operations and a solve with a few right-hand sides, all
    memory-bound: a second thread gains nothing there, while its fork and join — and, on
    busy cores, the wait for it — cost several times the work (measured on 2 busy cores:
    6.0 s instead of 0.9 s for the learning of the 1000-round ingest profile). The sequential
    append never paid this: its tensors stay below torch's parallel grain and a solve with one
    right-hand side is not threaded.
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Block:
    """A block append between its algebra and its writes; lists are per learner l.

    Attributes:
        learners: the members that learn, in order.
        rows: each learner's n before the block.
        counts: each learner's k_l new rows.
        cross: (L, k, w) the rows of B = L⁻¹K (zero past n_l and past k_l).
        lower: (L, k, k) C, the factor of the Schur complement (identity past k_l).
        info: per learner, 0 where C was computed.
        y_raw, y_std: the new outputs, raw and standardized (k_l each; y_std padded to k).
        v_new: (L, k) the new entries of v.
        z_new: (L, k, d) the new unit-cube inputs.
        surprises: filled in by `_write_block`.
    """

    learners: list[int]
    rows: list[int]
    counts: list[int]
    cross: torch.Tensor
    lower: list[list[list[float]]]
    info: list[int]
    y_raw: list[list[float]]
    y_std: list[list[float]]
    v_new: list[list[float]]
    z_new: list[list[list[float]]]
    surprises: list[list[float]] = field(default_factory=list)


class IncrementalGP:
    """A batch of independent exact GPs updated by Cholesky row appends.

    Args:
        bounds: (b, d, 2) or (d, 2) lower/upper bounds of each member's inputs; fixes the batch
            size b, the input dimension d, the dtype and the device. A member with fewer real
            inputs than d declares its extra dimensions with bounds (0, 1) and feeds zeros there;
            zero differences leave the kernel untouched.
        config: see `GPConfig`.
        dims: number of real (leading) input dimensions per member, used when fitting
            hyperparameters; defaults to d for all.
    """

    def __init__(
        self,
        bounds: torch.Tensor | Sequence,
        config: GPConfig | None = None,
        *,
        dims: Sequence[int] | None = None,
    ) -> None:
        bounds = self._check_bounds(bounds)
        self.config = config or GPConfig()
        self.dtype, self.device = bounds.dtype, bounds.device
        self.batch, self.dim = bounds.shape[0], bounds.shape[1]
        self._lower = bounds[..., 0].clone()
        self._span = bounds[..., 1] - bounds[..., 0]
        self.dims = self._check_dims(dims)
        self._known_noise = self._parse_noise(self.config.noise_variance)

        b, d = self.batch, self.dim
        opts = {"dtype": self.dtype, "device": self.device}
        self.lengthscale = torch.full((b, d), 0.5, **opts)
        self.outputscale = torch.ones(b, **opts)
        self._learned_noise = torch.full((b,), 1e-2, **opts)
        self.jitter = torch.zeros(b, **opts)
        self.y_mean = torch.zeros(b, **opts)
        self.y_scale = torch.ones(b, **opts)

        # Per-member bookkeeping lives in Python lists: b is small and these are read every append.
        self._rows = [0] * b  # rows in each member's factor: observations + pending points
        self._real = [0] * b  # observations
        self._pending: list[_Pending] = []
        self._next_pending_id = 0
        self._since_refit = [0] * b
        self._refit_due = [False] * b
        self._moments = [_RunningMoments() for _ in range(b)]
        self._no_surprise = torch.full((b,), math.nan, **opts)
        self._arange_b = torch.arange(b, device=self.device)
        self._version = 0
        self._factor_cache: tuple[int, torch.Tensor] | None = None
        self._alpha_cache: tuple[int, torch.Tensor] | None = None
        self._capacity = 0
        self._alloc(16)
        self._refresh_scalars()

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _check_bounds(bounds: torch.Tensor | Sequence) -> torch.Tensor:
        bounds = torch.as_tensor(bounds)
        if not bounds.is_floating_point():
            bounds = bounds.to(torch.float64)
        if bounds.dim() == 2:
            bounds = bounds.unsqueeze(0)
        if bounds.dim() != 3 or bounds.shape[-1] != 2 or bounds.shape[1] < 1:
            raise ValueError(
                f"bounds must have shape (b, d, 2) or (d, 2); got {tuple(bounds.shape)}"
            )
        if not torch.isfinite(bounds).all():
            raise ValueError("bounds must be finite")
        if not (bounds[..., 1] > bounds[..., 0]).all():
            raise ValueError("every upper bound must exceed its lower bound")
        return bounds

    def _check_dims(self, dims: Sequence[int] | None) -> torch.Tensor:
        if dims is None:
            return torch.full((self.batch,), self.dim, dtype=torch.long)
        dims_t = torch.as_tensor(list(dims), dtype=torch.long)
        if dims_t.shape != (self.batch,) or (dims_t < 0).any() or (dims_t > self.dim).any():
            raise ValueError(
                f"dims must hold {self.batch} integers in [0, {self.dim}]; got {list(dims)}"
            )
        return dims_t

    def _parse_noise(self, noise: float | Sequence[float | None] | None) -> torch.Tensor:
        """Known noise per member in output units; NaN marks a learned noise."""
        values = [noise] * self.batch if noise is None or isinstance(noise, int | float) else noise
        values = list(values)
        if len(values) != self.batch:
            raise ValueError(f"noise_variance needs {self.batch} entries; got {len(values)}")
        out = []
        for j, value in enumerate(values):
            if value is None:
                out.append(math.nan)
            elif not math.isfinite(float(value)) or float(value) < 0:
                raise ValueError(f"noise_variance[{j}] must be finite and >= 0; got {value}")
            else:
                out.append(float(value))
        return torch.tensor(out, dtype=self.dtype, device=self.device)

    def _alloc(self, capacity: int) -> None:
        """(Re)allocate buffers; the factor starts as the identity (every row inert)."""
        b, d = self.batch, self.dim
        opts = {"dtype": self.dtype, "device": self.device}
        factor = torch.eye(capacity, **opts).expand(b, capacity, capacity).clone()
        z = torch.zeros(b, capacity, d, **opts)
        y = torch.zeros(b, capacity, **opts)
        v = torch.zeros(b, capacity, **opts)
        old = self._capacity
        if old:
            factor[:, :old, :old] = self._factor
            z[:, :old], y[:, :old], v[:, :old] = self._z, self._y, self._v
        self._factor, self._z, self._y, self._v = factor, z, y, v
        self._capacity = capacity

    def reserve(self, rows: int) -> None:
        """Make room for `rows` rows per member now, so that later appends never reallocate."""
        if rows > self._capacity:
            self._alloc(rows)

    def _ensure_capacity(self, rows: int) -> None:
        if rows > self._capacity:
            self._alloc(max(rows, math.ceil(self._capacity * 1.5), 16))

    # ------------------------------------------------------------------ public state
    @property
    def num_rows(self) -> torch.Tensor:
        """(b,) rows in each member's factor: observations plus pending points."""
        return torch.tensor(self._rows, dtype=torch.long)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def num_observations(self) -> torch.Tensor:
        """(b,) number of observations each member holds (after any window)."""
        return torch.tensor(self._real, dtype=torch.long)

    @property
    def noise(self) -> torch.Tensor:
        """(b,) observation-noise variance in standardized units (as the factor uses it)."""
        known = self._known_noise / self.y_scale.pow(2)
        noise = torch.where(torch.isnan(self._known_noise), self._learned_noise, known)
        return noise.clamp_min(MIN_NOISE)

    @property
    def refit_due(self) -> torch.Tensor:
        """(b,) bool: members whose refit schedule has fired."""
        return torch.tensor(self._refit_due, dtype=torch.bool)

    def memory_bytes(self) -> int:
        """Bytes held by the factor and the data buffers (all members)."""
        tensors = (self._factor, self._z, self._y, self._v)
        return sum(t.element_size() * t.nelement() for t in tensors)

    def hyperparameters(self) -> dict[str, torch.Tensor]:
        """Current hyperparameters: lengthscale (b, d), outputscale (b,), noise (b,)."""
        return {
            "lengthscale": self.lengthscale.clone(),
            "outputscale": self.outputscale.clone(),
            "noise": self.noise.clone(),
        }

    def set_hyperparameters(
        self,
        *,
        lengthscale: torch.Tensor | None = None,
        outputscale: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
    ) -> None:
        """Set hyperparameters (standardized units) and rebuild the factor once.

        `noise` applies only to members whose noise is learned; known noise stays known.
        """
        with self._pending_detached():
            if lengthscale is not None:
                shape = (self.batch, self.dim)
                self.lengthscale = self._positive("lengthscale", lengthscale, shape)
            if outputscale is not None:
                self.outputscale = self._positive("outputscale", outputscale, (self.batch,))
            if noise is not None:
                self._learned_noise = self._positive("noise", noise, (self.batch,))
            self._rebuild(list(range(self.batch)))

    def _positive(self, name: str, value: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        value = torch.as_tensor(value, dtype=self.dtype, device=self.device)
        value = value.expand(shape).clone() if value.dim() < len(shape) else value
        if value.shape != shape:
            raise ValueError(f"{name} must have shape {shape}; got {tuple(value.shape)}")
        if not (torch.isfinite(value).all() and (value > 0).all()):
            raise ValueError(f"{name} must be finite and positive")
        return value

    # ------------------------------------------------------------------ input checks
    def _as_tensor(self, value: torch.Tensor | Sequence | float) -> torch.Tensor:
        return torch.as_tensor(value, dtype=self.dtype, device=self.device)

    def _check_mask(self, mask: torch.Tensor | Sequence[bool] | None, shape: tuple) -> torch.Tensor:
        if mask is None:
            return torch.ones(shape, dtype=torch.bool, device=self.device)
        mask_t = torch.as_tensor(mask, device=self.device)
        if mask_t.dtype != torch.bool or mask_t.shape != shape:
            raise ValueError(
                f"mask must be a bool tensor of shape {shape}; got {mask_t.dtype} "
                f"{tuple(mask_t.shape)}"
            )
        return mask_t

    def _check_observations(
        self, x: torch.Tensor, y: torch.Tensor, lead: tuple[int, ...], mask: torch.Tensor | None
    ) -> None:
        """Shapes, and finite values wherever `mask` (None: everywhere) says a reading is."""
        expected = (*lead, self.dim)
        if x.shape != expected:
            raise ValueError(
                f"x must have shape {expected} (batch, ..., dim); got {tuple(x.shape)}"
            )
        if y.shape != lead:
            raise ValueError(f"y must have shape {lead}; got {tuple(y.shape)}")
        # Two sums settle the usual case in two tensor calls: their total is finite only if
        # every value is. Otherwise (a bad value, one where the mask is False, or an overflow of
        # good values) the checks below look closer and say where.
        if math.isfinite(float(x.sum()) + float(y.sum())):
            return
        mask = self._check_mask(mask, lead)
        self._check_inputs(x, lead, mask)
        self._check_outputs(y, lead, mask)

    def _check_inputs(self, x: torch.Tensor, lead: tuple[int, ...], mask: torch.Tensor) -> None:
        expected = (*lead, self.dim)
        if x.shape != expected:
            raise ValueError(
                f"x must have shape {expected} (batch, ..., dim); got {tuple(x.shape)}"
            )
        bad = ~torch.isfinite(x).all(-1) & mask
        if bad.any():
            where = bad.nonzero()[0].tolist()
            raise ValueError(f"x holds NaN or infinity at index {where} (batch member first)")

    def _check_outputs(self, y: torch.Tensor, lead: tuple[int, ...], mask: torch.Tensor) -> None:
        if y.shape != lead:
            raise ValueError(f"y must have shape {lead}; got {tuple(y.shape)}")
        bad = ~torch.isfinite(y) & mask
        if bad.any():
            raise ValueError(f"y holds NaN or infinity at index {bad.nonzero()[0].tolist()}")

    def _scale(self, x: torch.Tensor, members: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """Map inputs (b', ..., d) to the unit cube with each member's declared bounds."""
        if x.dim() == 2 and isinstance(members, slice) and members == slice(None):
            return (x - self._lower) / self._span  # (b, d): one input per member, the hot path
        lower, span = self._lower[members], self._span[members]
        extra = x.dim() - lower.dim()
        shape = (lower.shape[0], *([1] * extra), self.dim)
        return (x - lower.reshape(shape)) / span.reshape(shape)

    def _row_mask(self, rows: Sequence[int], width: int) -> torch.Tensor:
        """(b', width) bool: which of the first `width` rows each member really holds."""
        counts = torch.tensor(rows, device=self.device).unsqueeze(-1)
        return torch.arange(width, device=self.device) < counts

    # ------------------------------------------------------------------ learning
    @torch.no_grad()
    def learn_one(
        self,
        x: torch.Tensor | Sequence,
        y: torch.Tensor | Sequence,
        mask: torch.Tensor | Sequence[bool] | None = None,
        *,
        refit: bool = True,
    ) -> LearnReport:
        """Learn one observation per member: one row appended, O(n²) per member.

        Args:
            x: (b, d) inputs in declared units.
            y: (b,) outputs. Entries where `mask` is False are ignored (NaN allowed there).
            mask: (b,) bool, which members observed something; default all.
            refit: run the refit schedule now (otherwise it waits in `refit_due`).

        Returns:
            A `LearnReport`.
        """
        x, y = self._as_tensor(x), self._as_tensor(y)
        lead = (self.batch,)
        if mask is None:
            learners = list(range(self.batch))
        else:
            mask = self._check_mask(mask, lead)
            learners = [j for j, chosen in enumerate(mask.tolist()) if chosen]
        self._check_observations(x, y, lead, mask)
        with self._pending_detached():
            self._ensure_capacity(max(self._rows) + 1 + len(self._pending))
            surprise = self._append(self._scale(x), y.tolist(), learners)
            for j in learners:
                self._count_learned(j, [surprise[j]])
            report = self._after_new_data(refit)
        report.surprise = torch.tensor(surprise, dtype=self.dtype, device=self.device)
        return report

    @torch.no_grad()
    def learn_many(
        self,
        x: torch.Tensor | Sequence,
        y: torch.Tensor | Sequence,
        mask: torch.Tensor | Sequence[bool] | None = None,
        *,
        refit: bool = True,
    ) -> LearnReport:
        """Learn m observations per member with one O((n+m)³) refactorization.

        Cheaper than m appends when m is comparable to n (an initial design, a recovery).

        Args:
            x: (b, m, d) inputs.
            y: (b, m) outputs.
            mask: (b, m) bool.
        """
        x, y = self._as_tensor(x), self._as_tensor(y)
        if x.dim() != 3:
            raise ValueError(f"x must have shape (batch, m, dim); got {tuple(x.shape)}")
        lead = (self.batch, x.shape[1])
        mask = self._check_mask(mask, lead)
        self._check_observations(x, y, lead, mask)
        with self._pending_detached():
            self._ensure_capacity(max(self._rows) + x.shape[1] + len(self._pending))
            z = self._scale(x)
            for j in range(self.batch):
                chosen = mask[j].nonzero().flatten()
                start, count = self._rows[j], chosen.numel()
                self._z[j, start : start + count] = z[j, chosen]
                self._y[j, start : start + count] = y[j, chosen]
                self._rows[j] += count
                self._real[j] += count
                self._since_refit[j] += count
            self._recount()
            return self._after_new_data(refit, restandardize=range(self.batch))

    @torch.no_grad()
    def learn_block(
        self,
        x: torch.Tensor | Sequence,
        y: torch.Tensor | Sequence,
        mask: torch.Tensor | Sequence[bool] | None = None,
        *,
        refit: bool = True,
    ) -> LearnReport:
        """Learn up to k observations per member, reading each member's factor once.

        The result is the model that k calls `learn_one(x[:, i], y[:, i], mask[:, i],
        refit=False)`, i = 0..k-1, followed by one pass of the window/drift/refit schedule
        would leave: the schedule is checked once per block, at its end (a drift or window that
        would fire mid-block fires there; the standardization stays fixed within the block,
        exactly as between appends). Per member with n rows and k' new ones:

            B = L⁻¹ K(Z, Z_new)                      one solve with k' right-hand sides
            C = chol(K(Z_new, Z_new) + (σ² + jitter) I − BᵀB)
            L ← [[L, 0], [Bᵀ, C]],   v ← [v; C⁻¹(ỹ_new − Bᵀv)]

        The diagonal of C holds the pivots the appends would compute and the new v entries
        their surprises. A member whose block is not numerically positive definite (a pivot
        below the breakdown threshold of `_append`) appends its rows one by one instead,
        with the jitter and rebuild that path applies.

        Args:
            x: (b, k, d) inputs in declared units.
            y: (b, k) outputs. Entries where `mask` is False are ignored (NaN allowed there).
            mask: (b, k) bool; member j learns the rows i with mask[j, i], in order of i.
                Default all.
            refit: run the refit schedule at the end (otherwise it waits in `refit_due`).

        Returns:
            A `LearnReport` whose surprise (b,) is each member's largest over its rows (NaN for
            a member that learned nothing).
        """
        x, y = self._as_tensor(x), self._as_tensor(y)
        if x.dim() != 3:
            raise ValueError(f"x must have shape (batch, k, dim); got {tuple(x.shape)}")
        lead = (self.batch, x.shape[1])
        mask = self._check_mask(mask, lead)
        self._check_observations(x, y, lead, mask)
        if x.shape[1] == 1:  # one row: the append is already one pass over the factor
            return self.learn_one(x[:, 0], y[:, 0], mask[:, 0], refit=refit)
        chosen = [[i for i, m in enumerate(row) if m] for row in mask.tolist()]
        with self._pending_detached():
            self._ensure_capacity(max(self._rows) + x.shape[1] + len(self._pending))
            with _one_thread():
                surprises = self._append_block(self._scale(x), y.tolist(), chosen)
            for j, values in enumerate(surprises):
                self._count_learned(j, values)
            report = self._after_new_data(refit)
        largest = [max(values) if values else math.nan for values in surprises]
        report.surprise = torch.tensor(largest, dtype=self.dtype, device=self.device)
        return report

    def _count_learned(self, member: int, surprises: Sequence[float]) -> None:
        """Count a member's newly learned rows; a surprising one makes a refit due."""
        self._real[member] += len(surprises)
        self._since_refit[member] += len(surprises)
        misfit_z = self.config.misfit_z
        if misfit_z is not None and any(s > misfit_z for s in surprises):
            self._refit_due[member] = True

    def _after_new_data(self, refit: bool, restandardize: Sequence[int] = ()) -> LearnReport:
        """Window, drift and refit schedule; the members they touch are rebuilt once."""
        forgotten, window_rebuild = self._apply_window(rebuilding=set(restandardize))
        restd = set(restandardize) | set(self._drifted())
        every, min_points = self.config.refit_every, self.config.min_fit_points
        for j in range(self.batch):
            if every is not None and self._since_refit[j] >= every:
                self._refit_due[j] = True
        fit: list[int] = []
        if refit:
            fit = [
                j
                for j in range(self.batch)
                if self._refit_due[j] and self._moments[j].count >= min_points
            ]
        restd |= set(fit)
        self._restandardize(sorted(restd))
        failed = self._fit_members(fit)
        rebuild = sorted(restd | set(window_rebuild))
        if rebuild:
            self._rebuild(rebuild)
        return LearnReport(
            surprise=self._no_surprise,
            refit=fit,
            refit_failed=failed,
            rebuilt=rebuild,
            forgotten=sum(forgotten),
        )

    def _append(
        self, z: torch.Tensor, y: Sequence[float] | None, learners: list[int]
    ) -> list[float]:
        """Append one row to each learner. `y=None` appends pending rows valued at the mean.

        Args:
            z: (b, d) unit-cube inputs.
            y: b raw outputs (only the learners' are read), or None.

        Returns:
            Per member, the surprise |ỹ − μ̃| / √(predictive variance) (NaN where not learned).
        """
        surprise = [math.nan] * self.batch
        if not learners:
            return surprise
        rows = self._rows
        width = max(rows[j] for j in learners)
        k_row = kernel_row(
            self._z[:, :width], z, self.lengthscale, self.outputscale, self.config.kernel
        )
        # Each learner's new row l = L⁻¹k, with lᵀl and lᵀv (the prior mean), as Python floats:
        # the b per-member scalars that follow are cheaper in Python than as tiny tensor ops.
        products = append_rows_(self._factor, self._v, k_row, rows, learners)
        diag, outputscale, means, scales = self._scalars
        pivots, v_new, y_raw, breakdown = [], [], [], []
        for j, (quad_sq, prior_mean) in zip(learners, products, strict=True):
            pivot_sq = diag[j] - quad_sq
            if pivot_sq < 0.5 * (diag[j] - outputscale[j]):
                breakdown.append(j)  # exact arithmetic guarantees pivot² ≥ noise + jitter
            pivot = math.sqrt(max(pivot_sq, 1e-300))
            if y is None:
                y_std = prior_mean
            else:
                y_std = (y[j] - means[j]) / scales[j]
                self._moments[j].add(y[j])
                surprise[j] = abs(y_std - prior_mean) / pivot
            pivots.append(pivot)
            v_new.append((y_std - prior_mean) / pivot)
            y_raw.append(means[j] + scales[j] * y_std)
        # The new scalars, stored in place: flat offsets of (j, n_j) in the (b, capacity) buffers.
        cap, dim = self._capacity, self.dim
        at = [j * cap + rows[j] for j in learners]
        z_values = z.tolist()
        set_entries_(
            (self._factor, [a * cap + rows[j] for a, j in zip(at, learners, strict=True)], pivots),
            (self._v, at, v_new),
            (self._y, at, y_raw),
            (
                self._z,
                [a * dim + i for a in at for i in range(dim)],
                [value for j in learners for value in z_values[j]],
            ),
        )
        for j in learners:
            rows[j] += 1
        self._touch()
        if breakdown:
            self.jitter[breakdown] = torch.maximum(
                self.jitter[breakdown] * 10, 1e-8 * self.outputscale[breakdown]
            )
            self._rebuild(breakdown)
        return surprise

    def _append_block(
        self, z: torch.Tensor, y: list[list[float]], chosen: list[list[int]]
    ) -> list[list[float]]:
        """Append member j's rows chosen[j] of `z` and `y`, in order, as one block per member.

        The learners are batched, each padded to k rows with the identity (a padded row of B is
        zero, its block of the Schur complement the identity), so the small k×k work costs the
        same few tensor calls however many members learn; only the triangular solve and the
        copy of B into the factor are per member.

        Args:
            z: (b, k, d) unit-cube inputs.
            y: b lists of k raw outputs (only the chosen entries are read).
            chosen: per member, the indices i of the rows it learns.

        Returns:
            Per member, the surprise of each of its rows (see `_append`), in row order.
        """
        surprises: list[list[float]] = [[] for _ in range(self.batch)]
        learners = [j for j in range(self.batch) if chosen[j]]
        if not learners:
            return surprises
        block = self._block_factor(z, learners, [chosen[j] for j in learners], y)
        broken = self._write_block(block)
        for j, values in zip(learners, block.surprises, strict=True):
            surprises[j] = values
        for j in broken:  # not positive definite as a block: the appends handle it
            columns = [[y[m][i] for m in range(self.batch)] for i in chosen[j]]
            surprises[j] = [
                self._append(z[:, i], column, [j])[j]
                for i, column in zip(chosen[j], columns, strict=True)
            ]
        self._touch()
        return surprises

    def _block_factor(
        self,
        z: torch.Tensor,
        learners: list[int],
        chosen: list[list[int]],
        y: list[list[float]],
    ) -> _Block:
        """B, C and the new v entries of every learner (nothing is written to the buffers).

        Args:
            z: (b, k, d) unit-cube inputs; learner m's rows are chosen[m].
            y: b lists of k raw outputs.
        """
        opts = {"dtype": self.dtype, "device": self.device}
        rows = [self._rows[j] for j in learners]
        counts = [len(picked) for picked in chosen]
        k, width = max(counts), max(rows)
        index = torch.tensor(learners, device=self.device)
        padded = [picked + picked[-1:] * (k - len(picked)) for picked in chosen]
        z_new = z[index.unsqueeze(-1), torch.tensor(padded, device=self.device)]  # (L, k, d)
        sel = self._selector(learners)
        ls, os = self.lengthscale[sel].unsqueeze(1), self.outputscale[sel].unsqueeze(1)
        kernel = self.config.kernel
        # The append's own direct differences, so that each covariance is the one the
        # sequential appends compute: (L, k, w) against the stored rows, (L, k, k) each other.
        cross = kernel_row(self._z[sel, :width].unsqueeze(1), z_new, ls, os, kernel)
        inner = kernel_row(z_new.unsqueeze(1), z_new, ls, os, kernel)
        real = self._row_mask(counts, k)  # (L, k): which rows are real, not padding
        cross.mul_(real.unsqueeze(-1) & self._row_mask(rows, width).unsqueeze(-2))
        for m, j in enumerate(learners):  # B = L⁻¹K, one pass over each factor
            solve_lower_rows_in_buffer_(self._factor[j], rows[m], cross[m, : counts[m], : rows[m]])
        gram = cross @ cross.mT
        prior_mean = (cross @ self._v[sel, :width].unsqueeze(-1)).squeeze(-1)  # (L, k): Bᵀv
        diag = torch.tensor([self._scalars[0][j] for j in learners], **opts)
        schur = (inner - gram).mul_(real.unsqueeze(-1) & real.unsqueeze(-2))
        pivot_sq = torch.where(real, diag.unsqueeze(-1) - gram.diagonal(dim1=-2, dim2=-1), 1.0)
        schur.diagonal(dim1=-2, dim2=-1).copy_(pivot_sq)  # k(x, x) + σ² + jitter − |b|²
        lower, info = torch.linalg.cholesky_ex(schur)
        means, scales = self._scalars[2], self._scalars[3]
        y_std = [
            [(y[j][i] - means[j]) / scales[j] for i in picked] + [0.0] * (k - len(picked))
            for j, picked in zip(learners, chosen, strict=True)
        ]
        residual = torch.tensor(y_std, **opts) - prior_mean
        v_new = torch.linalg.solve_triangular(lower, residual.unsqueeze(-1), upper=False)
        return _Block(
            learners=learners,
            rows=rows,
            counts=counts,
            cross=cross,
            lower=lower.tolist(),
            info=info.tolist(),
            y_raw=[[y[j][i] for i in picked] for j, picked in zip(learners, chosen, strict=True)],
            y_std=y_std,
            v_new=v_new.squeeze(-1).tolist(),
            z_new=z_new.tolist(),
        )

    def _write_block(self, block: _Block) -> list[int]:
        """Store each learner's block in the buffers; returns the learners that broke down.

        A learner breaks down when its k×k Cholesky fails or a pivot² falls below the
        threshold `_append` uses (exact arithmetic guarantees pivot² ≥ noise + jitter; far
        below it, no digit can be trusted); it is left untouched.
        """
        cap, dim = self._capacity, self.dim
        diag, outputscale, means, scales = self._scalars
        broken: list[int] = []
        factor_at, factor_values, at, v_values, y_values, z_at, z_values = ([] for _ in range(7))
        for m, j in enumerate(block.learners):
            n, count, lower = block.rows[m], block.counts[m], block.lower[m]
            if block.info[m] != 0 or not all(
                lower[i][i] * lower[i][i] >= 0.5 * (diag[j] - outputscale[j]) for i in range(count)
            ):
                broken.append(j)
                block.surprises.append([])
                continue
            self._factor[j, n : n + count, :n].copy_(block.cross[m, :count, :n])  # Bᵀ
            for i in range(count):  # C, then the row's scalars, as flat offsets
                row = (j * cap + n + i) * cap + n
                factor_at += range(row, row + i + 1)
                factor_values += lower[i][: i + 1]
                at.append(j * cap + n + i)
                y_std = block.y_std[m][i]
                v_values.append(block.v_new[m][i])
                y_values.append(means[j] + scales[j] * y_std)
                z_at += range((j * cap + n + i) * dim, (j * cap + n + i + 1) * dim)
                z_values += block.z_new[m][i]
                self._moments[j].add(block.y_raw[m][i])
            block.surprises.append([abs(value) for value in block.v_new[m][:count]])
            self._rows[j] += count
        set_entries_(
            (self._factor, factor_at, factor_values),
            (self._v, at, v_values),
            (self._y, at, y_values),
            (self._z, z_at, z_values),
        )
        return broken

    # ------------------------------------------------------------------ pending points
    def add_pending(
        self, x: torch.Tensor | Sequence, mask: torch.Tensor | Sequence[bool] | None = None
    ) -> int:
        """Condition on an input whose reading is not known yet; returns its handle.

        The posterior variance shrinks around x, the mean does not move.

        Args:
            x: (b, d) inputs in declared units.
            mask: (b,) bool, members the pending point applies to.
        """
        x = self._as_tensor(x)
        mask = self._check_mask(mask, (self.batch,))
        self._check_inputs(x, (self.batch,), mask)
        entry = _Pending(self._next_pending_id, self._scale(x), mask.nonzero().flatten().tolist())
        self._next_pending_id += 1
        self._ensure_capacity(max(self._rows) + 1)
        with torch.no_grad():
            self._append(entry.z, None, entry.members)
        self._pending.append(entry)
        return entry.ident

    def resolve_pending(
        self,
        handle: int,
        x: torch.Tensor | Sequence,
        y: torch.Tensor | Sequence,
        mask: torch.Tensor | Sequence[bool] | None = None,
        *,
        refit: bool = True,
    ) -> LearnReport:
        """Replace a pending point by its reading (x may differ from the pending input)."""
        self.drop_pending(handle)
        return self.learn_one(x, y, mask, refit=refit)

    def drop_pending(self, handle: int) -> None:
        """Forget a pending point whose reading will never come."""
        if all(entry.ident != handle for entry in self._pending):
            raise KeyError(f"no pending point with handle {handle}")
        with self._pending_detached():
            self._pending = [entry for entry in self._pending if entry.ident != handle]

    @contextmanager
    def _pending_detached(self) -> Iterator[None]:
        """Remove the trailing pending rows, run the body, re-append them at the new posterior."""
        if not self._pending:  # no pending rows: nothing to take off or put back
            yield
            return
        for j in range(self.batch):
            self._truncate(j, self._real[j])
        try:
            yield
        finally:
            self._ensure_capacity(max(self._rows) + len(self._pending))
            with torch.no_grad():
                for entry in self._pending:
                    self._append(entry.z, None, entry.members)

    def _truncate(self, member: int, rows: int) -> None:
        """Shrink a member to its first `rows` rows; the freed rows become inert again."""
        old = self._rows[member]
        if old <= rows:
            return
        freed = self._factor[member, rows:old]
        freed.zero_()
        freed[:, rows:old].fill_diagonal_(1.0)
        self._v[member, rows:old] = 0.0
        self._rows[member] = rows
        self._touch()

    # ------------------------------------------------------------------ rebuilds
    def _touch(self) -> None:
        self._version += 1

    @torch.no_grad()
    def _rebuild(self, members: list[int]) -> None:
        """Refactorize the listed members from their stored rows (O(n³) each).

        Members are factorized in chunks whose kernel matrices fit REBUILD_BYTES, so a rebuild
        of many large members never holds all their matrices at once.
        """
        self._touch()
        self._refresh_scalars()  # every change of a hyperparameter, jitter or scale ends here
        if not members or max(self._rows[j] for j in members) == 0:
            return
        width = max(self._rows[j] for j in members)
        per_member = width * width * self._factor.element_size()
        chunk = max(1, REBUILD_BYTES // max(per_member, 1))
        for start in range(0, len(members), chunk):
            self._rebuild_chunk(members[start : start + chunk])

    def _refresh_scalars(self) -> None:
        """Cache per-member scalars as Python floats for the append's scalar work.

        k(x, x) + σ² + jitter, the output scale, and the frozen output mean and scale: read from
        their tensors after the O(n²) solve, each would cost a torch call on a cold cache.
        """
        self._scalars = tuple(
            t.tolist()
            for t in (
                self.outputscale + self.noise + self.jitter,
                self.outputscale,
                self.y_mean,
                self.y_scale,
            )
        )

    def _rebuild_chunk(self, members: list[int]) -> None:
        rows = [self._rows[j] for j in members]
        width = max(rows)
        idx = torch.tensor(members, device=self.device)
        held = self._row_mask(rows, width)
        z = self._z[idx, :width]
        gram = gram_matrix(z, self.lengthscale[idx], self.outputscale[idx], self.config.kernel)
        gram.mul_(held.unsqueeze(-1) & held.unsqueeze(-2))
        for _attempt in range(_MAX_JITTER_TRIES):
            diag = self.outputscale[idx] + self.noise[idx] + self.jitter[idx]
            gram.diagonal(dim1=-2, dim2=-1).copy_(torch.where(held, diag.unsqueeze(-1), 1.0))
            lower, info = torch.linalg.cholesky_ex(gram)
            failed = info != 0
            if not failed.any():
                break
            bad = idx[failed]
            self.jitter[bad] = torch.maximum(self.jitter[bad] * 10, 1e-8 * self.outputscale[bad])
        else:
            raise NumericalError(
                f"kernel matrix of members {members} is not positive definite "
                f"after {_MAX_JITTER_TRIES} jitter increases"
            )
        standardized = (self._y[idx, :width] - self.y_mean[idx, None]) / self.y_scale[idx, None]
        y_std = torch.where(held, standardized, 0.0)
        self._factor[idx, :width, :width] = lower
        solved = torch.linalg.solve_triangular(lower, y_std.unsqueeze(-1), upper=False)
        self._v[idx, :width] = solved.squeeze(-1)

    def rebuild(self) -> None:
        """Refactorize every member from its data (the O(n³) path appends avoid)."""
        with self._pending_detached():
            self._rebuild(list(range(self.batch)))

    def restandardize(self) -> None:
        """Recompute every member's output mean and scale from its data, then rebuild.

        The frozen standardization depends on when drift was last detected, so two models that
        saw the same data in different orders agree exactly only after this.
        """
        with self._pending_detached():
            members = list(range(self.batch))
            self._restandardize(members)
            self._rebuild(members)

    def _apply_window(self, rebuilding: set[int]) -> tuple[list[int], list[int]]:
        """Forget each member's oldest observations beyond the window (pending rows detached).

        One row over — every learn_one once the window is full — is removed from the factor in
        O(n²) by `_forget_oldest`; more (learn_many), or a member in `rebuilding` anyway, only
        shift the data and leave the factor to a rebuild. Returns the rows dropped per member
        and the members whose factor must be rebuilt.
        """
        window = self.config.window
        if window is None:
            return [0] * self.batch, []
        dropped = [max(real - window, 0) for real in self._real]
        if not any(dropped):
            return dropped, []
        rebuild = [j for j, drop in enumerate(dropped) if drop > 1 or (drop and j in rebuilding)]
        for j in rebuild:
            n, drop = self._rows[j], dropped[j]
            self._z[j, : n - drop] = self._z[j, drop:n].clone()
            self._y[j, : n - drop] = self._y[j, drop:n].clone()
            self._real[j] -= drop
            self._truncate(j, n - drop)
        single = [j for j, drop in enumerate(dropped) if drop == 1 and j not in rebuilding]
        if single:
            rebuild += self._forget_oldest(single)
        self._recount()
        return dropped, sorted(rebuild)

    def _forget_oldest(self, members: list[int]) -> list[int]:
        """Remove each member's oldest observation, exactly and in O(n²); returns failures.

        With L = [[l₁₁, 0], [l₂₁, L₂₂]] the factor of K, the factor of K without its first row
        and column is chol(L₂₂L₂₂ᵀ + l₂₁l₂₁ᵀ) = L₂₂C with C = chol(I + ppᵀ), p = L₂₂⁻¹l₂₁ — a
        rank-one update, not a downdate: the pivots only grow, nothing cancels. C has a closed
        form (t₀ = 1, tₖ = tₖ₋₁ + pₖ²; Cₖₖ = √(tₖ/tₖ₋₁), Cᵢₖ = pᵢpₖ/√(tₖ₋₁tₖ) for i > k), so

            L' = L₂₂ diag(Cₖₖ) + S diag(wₖ),   wₖ = pₖ/√(tₖ₋₁tₖ),   Sᵢₖ = Σ_{j>k} (L₂₂)ᵢⱼ pⱼ,

        S being each row's total minus its running sum. L' is computed in blocks of rows that
        stay in cache, each written back one row up the moment it is done (the rows below, still
        to be read, are untouched), then v is solved afresh; members are batched.

        The members hold no pending rows; one narrower than the widest is padded with the
        identity, where p is 0 and the update changes nothing. A member whose update is not
        finite keeps its factor, loses its oldest row of data and is returned, to be rebuilt.
        """
        rows = [self._rows[j] for j in members]
        size = max(rows) - 1  # of the new factor (the widest member's)
        # Every member at once (the usual round) works on views of the buffers, no gathering.
        sel = self._selector(members)
        p = self._factor[sel, 1 : size + 1, 0].clone(memory_format=torch.contiguous_format)
        for k, j in enumerate(members):  # p = L₂₂⁻¹ l₂₁, the solve reading the buffer in place
            solve_lower_in_buffer_(self._factor[j, 1:, 1:], rows[k] - 1, p[k, : rows[k] - 1])
        t = torch.cumsum(p.square(), -1).add_(1.0)
        t_prev = torch.cat((torch.ones_like(t[:, :1]), t[:, :-1]), -1)
        finite = torch.isfinite(t[:, -1]).tolist()  # t is finite iff p is; then so is L'
        scale = t.div(t_prev).sqrt_().unsqueeze(-2)  # Cₖₖ ≥ 1
        weight = p.div((t_prev * t).sqrt_()).neg_().unsqueeze(-2)  # −wₖ
        p = p.unsqueeze(-2)
        failed = [j for j, ok in zip(members, finite, strict=True) if not ok]
        if failed:
            keep = torch.tensor([k for k, ok in enumerate(finite) if ok], device=self.device)
            p, scale, weight = p[keep], scale[keep], weight[keep]
            sel = self._selector([j for j in members if j not in failed])
        if len(failed) < len(members):
            block = max(16, _FORGET_BLOCK // (p.shape[0] * size))
            for start in range(0, size, block):
                stop = min(start + block, size)
                l22 = self._factor[sel, start + 1 : stop + 1, 1 : stop + 1]
                new = l22 * p[..., :stop]
                new.cumsum_(-1)  # running sums; each row's total ends in the last column
                new.sub_(new[..., -1:].clone()).mul_(weight[..., :stop])  # S diag(w)
                new.addcmul_(l22, scale[..., :stop])  # + L₂₂ diag(Cₖₖ)
                self._factor[sel, start:stop, :stop] = new
        # The data move up one row; the widest members' old last row becomes inert.
        sel = self._selector(members)
        self._z[sel, :size] = self._z[sel, 1 : size + 1].clone()
        self._y[sel, :size] = self._y[sel, 1 : size + 1].clone()
        self._factor[sel, size, : size + 1] = 0.0
        self._factor[sel, size, size] = 1.0
        held = self._row_mask([n - 1 for n in rows], size)
        y_std = (self._y[sel, :size] - self.y_mean[sel, None]) / self.y_scale[sel, None]
        self._v[sel, :size] = torch.where(held, y_std, 0.0)
        self._v[sel, size] = 0.0
        for k, j in enumerate(members):
            if j in failed:
                self._truncate(j, rows[k] - 1)
            else:  # v = L'⁻¹ ỹ, fresh: no error carried over from the old v
                solve_lower_in_buffer_(self._factor[j], rows[k] - 1, self._v[j, : rows[k] - 1])
                self._rows[j] -= 1
            self._real[j] -= 1
        self._touch()
        return failed

    def _selector(self, members: list[int]) -> slice | torch.Tensor:
        """Index of the listed members: a slice (views, no copies) when they are all."""
        if len(members) == self.batch:
            return slice(None)
        return torch.tensor(members, device=self.device)

    def _recount(self) -> None:
        """Recompute each member's running moments from its stored observations (vectorized)."""
        width = max(max(self._real), 1)
        y = self._y[:, :width]
        shift = y[:, 0]
        delta = torch.where(self._row_mask(self._real, width), y - shift.unsqueeze(-1), 0.0)
        totals = torch.stack((delta.sum(-1), delta.square().sum(-1))).tolist()
        for j, (count, first, total, total_sq) in enumerate(
            zip(self._real, shift.tolist(), *totals, strict=True)
        ):
            self._moments[j] = _RunningMoments(count, first if count else 0.0, total, total_sq)

    def _standardization(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (mean, scale) the data ask for (two-pass); scale 1 until two values exist."""
        width = max(max(self._real), 1)
        held = self._row_mask(self._real, width)
        y = self._y[:, :width]
        count = held.sum(-1)
        mean = torch.where(held, y, 0.0).sum(-1) / count.clamp_min(1)
        var = torch.where(held, y - mean.unsqueeze(-1), 0.0).pow(2).sum(-1) / count.clamp_min(1)
        std = var.sqrt()
        scale = torch.where((count >= 2) & (std > 1e-12 * mean.abs().clamp_min(1.0)), std, 1.0)
        return torch.where(count >= 1, mean, 0.0), scale

    def _drifted(self) -> list[int]:
        """Members whose data moved away from the frozen standardization (running moments)."""
        tol = self.config.drift_tolerance
        drifted = []
        for j, (moments, mean, scale) in enumerate(
            zip(self._moments, *self._scalars[2:], strict=True)
        ):
            if moments.count == 0:
                continue
            spread = moments.std
            enough = moments.count >= 2 and spread > 1e-12 * max(abs(moments.mean), 1.0)
            data_scale = spread if enough else 1.0
            moved = abs(moments.mean - mean) > tol * scale
            if moved or abs(math.log(data_scale / scale)) > math.log1p(tol):
                drifted.append(j)
        return drifted

    def _restandardize(self, members: list[int]) -> None:
        if not members:
            return
        mean, scale = self._standardization()
        self.y_mean[members] = mean[members]
        self.y_scale[members] = scale[members]

    # ------------------------------------------------------------------ hyperparameters
    def refit(self, members: Sequence[int] | None = None) -> list[int]:
        """Fit hyperparameters by maximizing the marginal likelihood, then rebuild once.

        Members with fewer than `config.min_fit_points` observations keep their values.
        Returns the members that were fit.
        """
        if members is None:
            members = range(self.batch)
        chosen = [int(j) for j in members if self._real[int(j)] >= self.config.min_fit_points]
        with self._pending_detached():
            self._restandardize(chosen)
            self._fit_members(chosen)
            self._rebuild(chosen)
        return chosen

    def _fit_members(self, members: list[int]) -> list[int]:
        """Fit hyperparameters of members on their standardized data (no rebuild).

        Returns the members whose optimizer did not converge.
        """
        failed: list[int] = []
        for j in members:
            n, d_j = self._real[j], max(int(self.dims[j]), 1)
            z = self._z[j, :n, :d_j]
            y_std = (self._y[j, :n] - self.y_mean[j]) / self.y_scale[j]
            known = None if torch.isnan(self._known_noise[j]) else float(self.noise[j])
            initial = FittedHyperparameters(
                self.lengthscale[j, :d_j],
                float(self.outputscale[j]),
                float(self._learned_noise[j]),
                True,
            )
            fitted = fit_hyperparameters(
                z,
                y_std,
                kernel=self.config.kernel,
                priors=self.config.priors,
                known_noise=known,
                initial=initial,
            )
            fitted_ls = fitted.lengthscale.to(self.lengthscale)
            self.lengthscale[j, :d_j] = fitted_ls.clamp_min(LENGTHSCALE_FLOOR)
            self.outputscale[j] = fitted.outputscale
            if known is None:
                self._learned_noise[j] = fitted.noise
            self.jitter[j] = 0.0
            if not fitted.converged:
                failed.append(j)
            self._since_refit[j] = 0
            self._refit_due[j] = False
        return failed

    def member_data(self, member: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A member's observations: (n, dims) unit-cube inputs and (n,) outputs (copies)."""
        n, width = self._real[member], max(int(self.dims[member]), 1)
        return self._z[member, :n, :width].clone(), self._y[member, :n].clone()

    # ------------------------------------------------------------------ persistence
    def state(self) -> dict[str, torch.Tensor]:
        """Everything but the data: hyperparameters, standardization, refit schedule.

        With the same data replayed, `load_state` of this reproduces the posterior exactly
        (an exact GP is a function of data, hyperparameters and standardization only).
        """
        return {
            "lengthscale": self.lengthscale.clone(),
            "outputscale": self.outputscale.clone(),
            "learned_noise": self._learned_noise.clone(),
            "jitter": self.jitter.clone(),
            "y_mean": self.y_mean.clone(),
            "y_scale": self.y_scale.clone(),
            "since_refit": torch.tensor(self._since_refit, dtype=torch.long),
            "refit_due": torch.tensor(self._refit_due, dtype=torch.bool),
        }

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state` returned (same batch and dims), then rebuild once."""
        shapes = {
            "lengthscale": (self.batch, self.dim),
            **{
                name: (self.batch,)
                for name in (
                    "outputscale",
                    "learned_noise",
                    "jitter",
                    "y_mean",
                    "y_scale",
                    "since_refit",
                    "refit_due",
                )
            },
        }
        for name, shape in shapes.items():
            if name not in state:
                raise ValueError(f"state lacks {name!r}")
            if tuple(state[name].shape) != shape:
                raise ValueError(
                    f"state {name!r} has shape {tuple(state[name].shape)}, expected {shape}"
                )
        with self._pending_detached():
            opts = {"dtype": self.dtype, "device": self.device}
            self.lengthscale = self._positive(
                "lengthscale", state["lengthscale"], shapes["lengthscale"]
            )
            self.outputscale = self._positive("outputscale", state["outputscale"], (self.batch,))
            self._learned_noise = self._positive("noise", state["learned_noise"], (self.batch,))
            self.jitter = torch.as_tensor(state["jitter"], **opts).clone()
            self.y_mean = torch.as_tensor(state["y_mean"], **opts).clone()
            self.y_scale = self._positive("y_scale", state["y_scale"], (self.batch,))
            self._since_refit = [int(v) for v in state["since_refit"].tolist()]
            self._refit_due = [bool(v) for v in state["refit_due"].tolist()]
            self._rebuild(list(range(self.batch)))

    # ------------------------------------------------------------------ prediction
    def _contiguous_factor(self) -> torch.Tensor:
        """(b, w, w) contiguous copy of the factor, w = max rows, made once per model change."""
        if self._factor_cache is None or self._factor_cache[0] != self._version:
            width = max(self._rows)
            self._factor_cache = (self._version, self._factor[:, :width, :width].contiguous())
        return self._factor_cache[1]

    def alpha(self) -> torch.Tensor:
        """(b, w) weights α = (K + σ²I)⁻¹ ỹ in standardized units (zero past a member's rows)."""
        if self._alpha_cache is None or self._alpha_cache[0] != self._version:
            width = max(self._rows)
            lower = self._contiguous_factor()
            alpha = torch.linalg.solve_triangular(
                lower.mT, self._v[:, :width].unsqueeze(-1), upper=True
            ).squeeze(-1)
            self._alpha_cache = (self._version, alpha)
        return self._alpha_cache[1]

    def posterior(
        self,
        x: torch.Tensor,
        *,
        members: Sequence[int] | int | None = None,
        full_covariance: bool = False,
    ) -> GPPosterior:
        """Posterior of the latent function at query points; differentiable in x.

        Args:
            x: (b', q, d) queries in declared units, b' = number of selected members; with a
                single int member, (q, d) is accepted as well.
            members: which members to evaluate (default all).
            full_covariance: also return the (b', q, q) covariance.

        Returns:
            `GPPosterior` in output units, with a leading dim b' (dropped for an int member).
        """
        single = isinstance(members, int)
        idx = self._member_index(members)
        x = torch.as_tensor(x, device=self.device)
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        if single and x.dim() == 2:
            x = x.unsqueeze(0)
        if x.dim() != 3 or x.shape[0] != len(idx) or x.shape[-1] != self.dim:
            expected = f"({len(idx)}, q, {self.dim})"
            raise ValueError(
                f"x must have shape {expected} for these members; got {tuple(x.shape)}"
            )
        if not torch.isfinite(x).all():
            raise ValueError("query points hold NaN or infinity")
        post = self._posterior_std_units(self._scale(x, idx), idx, full_covariance)
        scale = self.y_scale[idx, None]
        mean = self.y_mean[idx, None] + scale * post.mean
        var = scale.pow(2) * post.variance
        cov = None if post.covariance is None else scale.unsqueeze(-1).pow(2) * post.covariance
        if single:
            return GPPosterior(mean[0], var[0], None if cov is None else cov[0])
        return GPPosterior(mean, var, cov)

    def _member_index(self, members: Sequence[int] | int | None) -> torch.Tensor:
        if members is None:
            return self._arange_b
        chosen = [members] if isinstance(members, int) else list(members)
        if any(not 0 <= int(j) < self.batch for j in chosen):
            raise IndexError(f"members {chosen} out of range for a batch of {self.batch}")
        return torch.tensor(chosen, dtype=torch.long, device=self.device)

    def _posterior_std_units(self, z: torch.Tensor, idx: torch.Tensor, full: bool) -> GPPosterior:
        rows = [self._rows[j] for j in idx.tolist()]
        ls, os = self.lengthscale[idx], self.outputscale[idx]
        prior_var = os.unsqueeze(-1).expand(z.shape[:-1])
        width = max(self._rows)
        if max(rows) == 0:
            cov = kernel_matrix(z, z, ls, os, self.config.kernel) if full else None
            return GPPosterior(torch.zeros_like(prior_var), prior_var, cov)
        k_xq = kernel_matrix(self._z[idx, :width], z, ls, os, self.config.kernel)
        k_xq = k_xq * self._row_mask(rows, width).unsqueeze(-1)
        factor = self._contiguous_factor()
        factor = factor if len(idx) == self.batch and idx is self._arange_b else factor[idx]
        w = torch.linalg.solve_triangular(factor, k_xq, upper=False)
        mean = (w * self._v[idx, :width].unsqueeze(-1)).sum(-2)
        var = (prior_var - w.pow(2).sum(-2)).clamp_min(0.0)
        cov = None
        if full:
            cov = kernel_matrix(z, z, ls, os, self.config.kernel) - w.mT @ w
        return GPPosterior(mean, var, cov)

    def sample(
        self,
        x: torch.Tensor,
        num_samples: int,
        *,
        members: Sequence[int] | None = None,
        generator: torch.Generator | None = None,
        base_samples: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Joint posterior samples of the latent function at the query points.

        Args:
            x: (b', q, d) queries.
            num_samples: s.
            base_samples: optional (s, b', q) standard normals (for common random numbers).

        Returns:
            (s, b', q) samples.
        """
        post = self.posterior(x, members=members, full_covariance=True)
        cov = post.covariance
        eye = torch.eye(cov.shape[-1], dtype=self.dtype, device=self.device)
        scale = cov.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1e-12)[..., None, None]
        for exponent in range(-10, -2):
            root, info = torch.linalg.cholesky_ex(cov + (10.0**exponent) * scale * eye)
            if not (info != 0).any():
                break
        else:
            raise NumericalError("posterior covariance is not positive semi-definite")
        if base_samples is None:
            base_samples = torch.randn(
                (num_samples, *post.mean.shape),
                dtype=self.dtype,
                device=self.device,
                generator=generator,
            )
        if base_samples.shape != (num_samples, *post.mean.shape):
            raise ValueError(f"base_samples must have shape {(num_samples, *post.mean.shape)}")
        return post.mean + (root @ base_samples.unsqueeze(-1)).squeeze(-1)
