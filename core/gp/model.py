"""An exact GP that learns one observation at a time: the Cholesky factor grows by row appends.

`IncrementalGP` holds a batch of b independent GPs (one per node of a causal graph, say). Each
member has its own number of rows n_j; the batch shares one (b, capacity, capacity) buffer whose
rows past a member's n_j hold the identity (`buffers`), so a batched solve or Cholesky over
max_j n_j rows is exact for every member at once, and members learn independently (a node whose
reading is late, or that was set by a hard intervention, simply does not append).

Per member with n rows, unit-cube inputs Z and standardized outputs ỹ:

    K + σ²I = L Lᵀ,     v = L⁻¹ ỹ,     α = L⁻ᵀ v (the weights, derived lazily).

A row is appended in O(n²) (`append`), k rows through their Schur complement (`block`), the
oldest row forgotten by a rank-one update (`window`); the O(n³) refactorization (`rebuild`)
follows a refit, a drift of the data or a numerical breakdown only.

Inputs are scaled to the unit cube from declared bounds and outputs standardized with a mean and
scale that stay fixed between refits, so appends stay exact; when the data drift away from them
the factor is rebuilt (`standardize`). With `GPConfig.change`, a test on the predictive
residuals (`change`) makes a member forget its rows from before a shift of the system.
Pending points (inputs whose readings are not known yet) are kept as each member's trailing
rows with the posterior mean as their value: the variance shrinks, the mean does not move
(`pending`). Everything follows the dtype and device of the
declared bounds (float64 default).

With `GPConfig.deferred`, learning only appends (and forgets) rows; due refits and drift
rebuilds are copied out (`refit_job`), run beside the model (`core.gp.refit`) and swapped in
with the rows that came meanwhile appended again (`install`).

This module holds the model: its learn verbs, the refit schedule and its state; the work is
done by functions over its buffers, in the modules named above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager

import structlog
import torch

from core.gp.append import append_rows, member_scalars
from core.gp.block import append_block, one_thread
from core.gp.buffers import (
    allocate,
    blank,
    ensure_capacity,
    grow,
    memory_bytes,
    next_capacity,
    put_data,
    truncate,
)
from core.gp.change import CHANGE_FIELDS, ChangeDetector
from core.gp.checks import (
    check_bounds,
    check_dims,
    check_inputs,
    check_mask,
    check_observations,
    check_queries,
    check_state,
    member_index,
    parse_noise,
    positive,
)
from core.gp.config import GPConfig, LearnReport
from core.gp.pending import PendingPoint, detached, find
from core.gp.posterior import FactorCache, GPPosterior, in_output_units, latent_posterior
from core.gp.rebuild import add_jitter, refactorize
from core.gp.refit import RefitJob, RefitResult, effective_noise, fit_member
from core.gp.standardize import drifted, recount, restandardize
from core.gp.window import apply_window, forget_oldest

# The most rows `learn_block` appends as one block (see `_append_blocks`).
BLOCK_ROWS = 64
# A spare (the next, larger buffer, `prepare_spare`) is wanted once the rows held pass this
# share of the capacity: made beside the learning, it is ready before a growth needs it.
SPARE_AT = 0.75

# The rows a model's `state()` carries when a replay from scratch would not rebuild its set of
# rows (a budget, a change detector): each member's rows (b, c, d) and (b, c), its count of
# rows (b,) and of the observations it learned (b,), kept or not.
KEPT_FIELDS = ("kept_z", "kept_y", "kept_rows", "kept_seen")
_LEGACY_KEPT = dict(
    zip(("bounded_z", "bounded_y", "bounded_rows", "bounded_seen"), KEPT_FIELDS, strict=True)
)

__all__ = ["KEPT_FIELDS", "IncrementalGP"]

log = structlog.get_logger("core.gp.model")


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
        bounds = check_bounds(bounds)
        self.config = config or GPConfig()
        self.dtype, self.device = bounds.dtype, bounds.device
        self.batch, self.dim = bounds.shape[0], bounds.shape[1]
        self._lower = bounds[..., 0].clone()
        self._span = bounds[..., 1] - bounds[..., 0]
        self.dims = check_dims(dims, self.batch, self.dim)
        self._known_noise = parse_noise(
            self.config.noise_variance, self.batch, self.dtype, self.device
        )

        b, d = self.batch, self.dim
        opts = {"dtype": self.dtype, "device": self.device}
        self.lengthscale = torch.full((b, d), 0.5, **opts)
        self.outputscale = torch.ones(b, **opts)
        self._learned_noise = torch.full((b,), 1e-2, **opts)
        self.jitter = torch.zeros(b, **opts)
        self.y_mean = torch.zeros(b, **opts)
        self.y_scale = torch.ones(b, **opts)

        # Per-member bookkeeping lives in Python lists: b is small and these are read every append.
        self._buffers = allocate(b, d, **opts)
        self._pending: list[PendingPoint] = []
        self._next_pending_id = 0
        self._since_refit = [0] * b
        self._refit_due = [False] * b
        # Deferred mode (`GPConfig.deferred`): members whose data drifted from the frozen
        # standardization, waiting for a `refit_job`; and, per member, an epoch bumped by every
        # change a job's copy cannot follow (new hyperparameters, a rebuild from learn_many) and
        # the rows the window forgot, so that `install` recognises a stale result.
        self._drift_due = [False] * b
        # and members whose factor is due to be computed again under the values they hold (a
        # bounded model's exact pass over its diagonal, `core.gp.bounded`)
        self._refresh_due = [False] * b
        self._epochs = [0] * b
        self._forgotten = [0] * b
        self._change = ChangeDetector(b, self.config.change) if self.config.change else None
        self._seen = [0] * b  # observations each member has learned, kept or not
        self._skip = [0] * b  # readings a replay after `resume` must not learn again
        self._changed: dict[int, int] = {}  # member -> newest rows after a change, to keep
        self._moments = recount(self._buffers)
        self._no_surprise = torch.full((b,), math.nan, **opts)
        self._arange_b = torch.arange(b, device=self.device)
        self._cache = FactorCache(self._buffers)
        self._refresh_scalars()
        # the most rows a member will ever hold, when known (an experiment's last round and
        # pending points, `NetworkModel.reserve_rounds`): no spare is made for a growth past it
        self.most_rows: int | None = None

    def reserve(self, rows: int) -> None:
        """Make room for `rows` rows per member now, so that later appends never reallocate."""
        if rows > self._buffers.capacity:
            grow(self._buffers, rows)

    @property
    def room(self) -> int:
        """Rows each member has room for before the buffers must grow (a `BoundedGP`'s
        `capacity` is another thing: the rows it keeps exactly)."""
        return self._buffers.capacity

    def spare_wanted(self) -> bool:
        """Whether the rows held passed `SPARE_AT` of the capacity with no spare ready for
        the next growth: then `prepare_spare` (beside the learning) saves the growth its
        allocation."""
        buffers = self._buffers
        if self.most_rows is not None and self.most_rows <= buffers.capacity:
            return False  # room for every row it will hold: no growth ever comes
        held = max(buffers.rows, default=0) + len(self._pending)
        spare = buffers.spare
        ready = spare is not None and spare.capacity > buffers.capacity
        return not ready and held >= SPARE_AT * buffers.capacity

    def prepare_spare(self) -> None:
        """Allocate the buffers the next growth takes (`core.gp.buffers.Spare`): the identity
        and zeros at `next_capacity`, most of a growth's cost. Safe in another thread while
        this model learns: it reads only shapes, and hands the spare over by one assignment;
        a growth that came first makes it useless, not wrong (`grow` checks its room)."""
        buffers = self._buffers
        spare = blank(buffers, next_capacity(buffers.capacity))
        if spare.capacity > buffers.capacity:
            buffers.spare = spare

    # ------------------------------------------------------------------ public state
    @property
    def num_rows(self) -> torch.Tensor:
        """(b,) rows in each member's factor: observations plus pending points."""
        return torch.tensor(self._buffers.rows, dtype=torch.long)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def num_observations(self) -> torch.Tensor:
        """(b,) number of observations each member holds (after any window)."""
        return torch.tensor(self._buffers.real, dtype=torch.long)

    @property
    def seen(self) -> list[int]:
        """Per member: observations learned, kept or not (since the start or a `resume`d
        state's start)."""
        return list(self._seen)

    @property
    def noise(self) -> torch.Tensor:
        """(b,) observation-noise variance in standardized units (as the factor uses it)."""
        return effective_noise(self._known_noise, self._learned_noise, self.y_scale)

    @property
    def refit_due(self) -> torch.Tensor:
        """(b,) bool: members whose refit schedule has fired."""
        return torch.tensor(self._refit_due, dtype=torch.bool)

    def memory_bytes(self) -> int:
        """Bytes held by the factor and the data buffers (all members)."""
        return memory_bytes(self._buffers)

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
        return positive(name, value, shape, dtype=self.dtype, device=self.device)

    def _as_tensor(self, value: torch.Tensor | Sequence | float) -> torch.Tensor:
        return torch.as_tensor(value, dtype=self.dtype, device=self.device)

    def _scale(self, x: torch.Tensor, members: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """Map inputs (b', ..., d) to the unit cube with each member's declared bounds."""
        if x.dim() == 2 and isinstance(members, slice) and members == slice(None):
            return (x - self._lower) / self._span  # (b, d): one input per member, the hot path
        lower, span = self._lower[members], self._span[members]
        extra = x.dim() - lower.dim()
        shape = (lower.shape[0], *([1] * extra), self.dim)
        return (x - lower.reshape(shape)) / span.reshape(shape)

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
        if any(self._skip):
            mask = self._skipping(mask)
        if mask is None:
            learners = list(range(self.batch))
        else:
            mask = check_mask(mask, lead, self.device)
            learners = [j for j, chosen in enumerate(mask.tolist()) if chosen]
        check_observations(x, y, lead, mask, self.dim, self.device)
        with self._pending_detached():
            ensure_capacity(self._buffers, max(self._buffers.rows) + 1 + len(self._pending))
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
        mask = check_mask(mask, lead, self.device)
        check_observations(x, y, lead, mask, self.dim, self.device)
        if any(self._skip):  # a replay after `resume`: which rows are skipped goes row by row
            return self._learn_rows(x, y, mask, refit=refit)
        buffers = self._buffers
        with self._pending_detached():
            ensure_capacity(buffers, max(buffers.rows) + x.shape[1] + len(self._pending))
            z = self._scale(x)
            for j in range(self.batch):
                chosen = mask[j].nonzero().flatten()
                put_data(buffers, j, z[j, chosen], y[j, chosen])
                self._since_refit[j] += chosen.numel()
                self._seen[j] += chosen.numel()
            self._moments = recount(buffers)
            return self._after_new_data(refit, restandardizing=range(self.batch))

    @torch.no_grad()
    def learn_block(
        self,
        x: torch.Tensor | Sequence,
        y: torch.Tensor | Sequence,
        mask: torch.Tensor | Sequence[bool] | None = None,
        *,
        refit: bool = True,
    ) -> LearnReport:
        """Learn up to k observations per member, reading each member's factor once per
        BLOCK_ROWS rows.

        The result is the model that k calls `learn_one(x[:, i], y[:, i], mask[:, i],
        refit=False)`, i = 0..k-1, followed by one pass of the window/drift/refit schedule
        would leave: the schedule is checked once per block, at its end (a drift or window that
        would fire mid-block fires there; the standardization stays fixed within the block,
        exactly as between appends). See `core.gp.block` for the algebra. A member whose block
        is not numerically positive definite appends its rows one by one instead, with the
        jitter and rebuild that path applies.

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
        mask = check_mask(mask, lead, self.device)
        check_observations(x, y, lead, mask, self.dim, self.device)
        if x.shape[1] == 1:  # one row: the append is already one pass over the factor
            return self.learn_one(x[:, 0], y[:, 0], mask[:, 0], refit=refit)
        if any(self._skip):  # a replay after `resume`: which rows are skipped goes row by row
            return self._learn_rows(x, y, mask, refit=refit)
        chosen = [[i for i, m in enumerate(row) if m] for row in mask.tolist()]
        buffers = self._buffers
        with self._pending_detached():
            ensure_capacity(buffers, max(buffers.rows) + x.shape[1] + len(self._pending))
            with one_thread():
                surprises = self._append_blocks(self._scale(x), y.tolist(), chosen)
            for j, values in enumerate(surprises):
                self._count_learned(j, values)
            report = self._after_new_data(refit)
        largest = [max(values) if values else math.nan for values in surprises]
        report.surprise = torch.tensor(largest, dtype=self.dtype, device=self.device)
        return report

    def _skipping(self, mask: torch.Tensor | Sequence[bool] | None) -> list[bool]:
        """`mask` less the members whose next reading a `resume`d state already stands for."""
        if mask is None:
            chosen = [True] * self.batch
        else:
            chosen = [bool(m) for m in torch.as_tensor(mask).reshape(-1).tolist()]
        for j, learns in enumerate(chosen[: self.batch]):
            if learns and self._skip[j] > 0:
                self._skip[j] -= 1
                chosen[j] = False
        return chosen

    def _learn_rows(
        self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, *, refit: bool
    ) -> LearnReport:
        """k rows per member (x (b, k, d), y and mask (b, k)) by k `learn_one` calls, the
        schedule run after the last only; the report merged as `learn_block`'s."""
        k = x.shape[1]
        largest = torch.full((self.batch,), math.nan, dtype=self.dtype, device=self.device)
        merged = LearnReport(surprise=largest)
        for i in range(k):
            part = self.learn_one(x[:, i], y[:, i], mask[:, i], refit=refit and i == k - 1)
            seen = ~torch.isnan(part.surprise)
            largest[seen] = torch.fmax(largest[seen], part.surprise[seen])
            merged.refit += part.refit
            merged.refit_failed += part.refit_failed
            merged.rebuilt = sorted(set(merged.rebuilt) | set(part.rebuilt))
            merged.forgotten += part.forgotten
            merged.changed = sorted(set(merged.changed) | set(part.changed))
        return merged

    def _append(
        self, z: torch.Tensor, y: Sequence[float] | None, learners: list[int]
    ) -> list[float]:
        """One row per learner (see `append_rows`); a breakdown adds jitter and rebuilds.

        Args:
            z: (b, d) unit-cube inputs.
            y: b raw outputs, or None for pending rows valued at the mean.
        """
        surprise, breakdown = append_rows(
            self._buffers,
            z,
            y,
            learners,
            self.lengthscale,
            self.outputscale,
            self.config.kernel,
            self._scalars,
            self._moments,
        )
        if breakdown:
            add_jitter(self.jitter, self.outputscale, breakdown)
            self._rebuild(breakdown)
        return surprise

    def _append_blocks(
        self, z: torch.Tensor, y: list[list[float]], chosen: list[list[int]]
    ) -> list[list[float]]:
        """`_append_block` over at most BLOCK_ROWS of the k rows at a time, in order.

        A block's own k×k part is written through Python lists (O(k²) values per member),
        while its solve against the stored factor costs O(k·n²) whatever the split: beyond a
        few dozen rows, longer blocks only add the O(k²) part (measured: a backlog of 250 rounds
        in one block spent more in those lists than in the solve).
        """
        k = z.shape[1]
        if k <= BLOCK_ROWS:
            return self._append_block(z, y, chosen)
        surprises: list[list[float]] = [[] for _ in chosen]
        for start in range(0, k, BLOCK_ROWS):
            stop = start + BLOCK_ROWS
            part = [[i - start for i in rows if start <= i < stop] for rows in chosen]
            values = self._append_block(z[:, start:stop], [row[start:stop] for row in y], part)
            for j, each in enumerate(values):
                surprises[j] += each
        return surprises

    def _append_block(
        self, z: torch.Tensor, y: list[list[float]], chosen: list[list[int]]
    ) -> list[list[float]]:
        """Member j's rows chosen[j] as one block (see `append_block`), or one by one if broken.

        Args:
            z: (b, k, d) unit-cube inputs.
            y: b lists of k raw outputs.

        Returns:
            Per member, the surprise of each of its rows, in row order.
        """
        surprises, broken = append_block(
            self._buffers,
            z,
            y,
            chosen,
            self.lengthscale,
            self.outputscale,
            self.config.kernel,
            self._scalars,
            self._moments,
        )
        for j in broken:  # not positive definite as a block: the appends handle it
            columns = [[y[m][i] for m in range(self.batch)] for i in chosen[j]]
            surprises[j] = [
                self._append(z[:, i], column, [j])[j]
                for i, column in zip(chosen[j], columns, strict=True)
            ]
        return surprises

    def _count_learned(self, member: int, surprises: Sequence[float]) -> None:
        """Count a member's newly learned rows; a surprising one makes a refit due."""
        self._buffers.real[member] += len(surprises)
        self._since_refit[member] += len(surprises)
        self._seen[member] += len(surprises)
        misfit_z = self.config.misfit_z
        if misfit_z is not None and any(s > misfit_z for s in surprises):
            self._refit_due[member] = True
        if self._change is not None:
            for i, value in enumerate(surprises):
                after = self._change.learn(member, value)
                if after is not None:  # rows of the block past this one came after it too
                    self._changed[member] = after + len(surprises) - 1 - i

    def _forget_before_change(self) -> list[int]:
        """Members whose detector raised an alarm forget their rows from before the change
        (keeping at least `change.keep`); they are due for a refit. Returns them."""
        alarms, self._changed = self._changed, {}
        if not alarms:
            return []
        buffers, keep_least = self._buffers, self.config.change.keep
        for j, after in sorted(alarms.items()):
            n = buffers.real[j]
            drop = n - min(n, max(after, keep_least))
            log.info("gp.change", member=j, rows=n, forgotten=drop)
            if drop:
                buffers.z[j, : n - drop] = buffers.z[j, drop:n].clone()
                buffers.y[j, : n - drop] = buffers.y[j, drop:n].clone()
                buffers.real[j] -= drop
                truncate(buffers, j, n - drop)
                self._forgotten[j] += drop
            self._refit_due[j] = True
        self._moments = recount(buffers)
        return sorted(alarms)

    def _after_new_data(self, refit: bool, restandardizing: Sequence[int] = ()) -> LearnReport:
        """Change, window, drift and refit schedule; the members they touch are rebuilt once."""
        changed = self._forget_before_change()
        restandardizing = sorted(set(restandardizing) | set(changed))
        forgotten, window_rebuild = self._apply_window(rebuilding=set(restandardizing))
        scalars = self._scalars
        moved = drifted(self._moments, scalars.mean, scalars.scale, self.config.drift_tolerance)
        every, min_points = self.config.refit_every, self.config.min_fit_points
        for j in range(self.batch):
            if every is not None and self._since_refit[j] >= every:
                self._refit_due[j] = True
        if self.config.deferred:  # a drift waits for the next job like a due refit
            for j in moved:
                self._drift_due[j] = True
            moved = []
        restd = set(restandardizing) | set(moved)
        fit: list[int] = []
        if refit and not self.config.deferred:
            fit = [
                j
                for j in range(self.batch)
                if self._refit_due[j] and self._moments[j].count >= min_points
            ]
        restd |= set(fit)
        restandardize(self._buffers, sorted(restd), self.y_mean, self.y_scale)
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
            changed=changed,
        )

    def _apply_window(self, rebuilding: set[int]) -> tuple[list[int], list[int]]:
        """The window (see `apply_window`), then the running moments of what is left."""
        window = self.config.window
        if window is None:
            return [0] * self.batch, []
        dropped, rebuild = apply_window(
            self._buffers, window, rebuilding, self.y_mean, self.y_scale
        )
        for j, count in enumerate(dropped):
            self._forgotten[j] += count
        if any(dropped):
            self._moments = recount(self._buffers)
        return dropped, rebuild

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
        mask = check_mask(mask, (self.batch,), self.device)
        check_inputs(x, (self.batch,), mask, self.dim)
        point = PendingPoint(
            self._next_pending_id, self._scale(x), mask.nonzero().flatten().tolist()
        )
        self._next_pending_id += 1
        ensure_capacity(self._buffers, max(self._buffers.rows) + 1)
        with torch.no_grad():
            self._append(point.z, None, point.members)
        self._pending.append(point)
        return point.ident

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
        point = find(self._pending, handle)
        with self._pending_detached():
            self._pending.remove(point)

    def _pending_detached(self) -> AbstractContextManager[None]:
        """Pending rows taken off for the body, put back at the new posterior after it."""
        return detached(self._buffers, self._pending, self._append)

    # ------------------------------------------------------------------ rebuilds
    @torch.no_grad()
    def _rebuild(self, members: list[int]) -> None:
        """Refactorize the listed members from their stored rows (O(n³) each)."""
        refactorize(
            self._buffers,
            members,
            kernel=self.config.kernel,
            lengthscale=self.lengthscale,
            outputscale=self.outputscale,
            noise=self.noise,
            jitter=self.jitter,  # raised in place where a factor needs it
            y_mean=self.y_mean,
            y_scale=self.y_scale,
        )
        for j in members:
            self._epochs[j] += 1  # a refit job copied before this is stale
        # After the factorization, not before: it may have raised a member's jitter, and the
        # appends that follow must use the diagonal the factor was computed with.
        self._refresh_scalars()

    def _refresh_scalars(self) -> torch.Tensor:
        """Cache the per-member scalars of the appends (`MemberScalars`); returns the noise."""
        noise = self.noise
        self._scalars = member_scalars(
            self.outputscale, noise, self.jitter, self.y_mean, self.y_scale
        )
        return noise

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
            restandardize(self._buffers, members, self.y_mean, self.y_scale)
            self._rebuild(members)

    # ------------------------------------------------------------------ hyperparameters
    def refit(self, members: Sequence[int] | None = None) -> list[int]:
        """Fit hyperparameters by maximizing the marginal likelihood, then rebuild once.

        Members with fewer than `config.min_fit_points` observations keep their values.
        Returns the members that were fit.
        """
        if members is None:
            members = range(self.batch)
        real, min_points = self._buffers.real, self.config.min_fit_points
        chosen = [int(j) for j in members if real[int(j)] >= min_points]
        with self._pending_detached():
            restandardize(self._buffers, chosen, self.y_mean, self.y_scale)
            self._fit_members(chosen)
            self._rebuild(chosen)
        return chosen

    def _fit_members(self, members: list[int]) -> list[int]:
        """Fit hyperparameters of members on their standardized data (no rebuild).

        Returns the members whose optimizer did not converge.
        """
        failed: list[int] = []
        for j in members:
            n, d_j = self._buffers.real[j], max(int(self.dims[j]), 1)
            known = None if torch.isnan(self._known_noise[j]) else float(self.noise[j])
            outcome = fit_member(
                self._buffers.z[j, :n, :d_j],
                (self._buffers.y[j, :n] - self.y_mean[j]) / self.y_scale[j],
                kernel=self.config.kernel,
                priors=self.config.priors,
                known_noise=known,
                lengthscale=self.lengthscale[j, :d_j],
                outputscale=float(self.outputscale[j]),
                learned_noise=float(self._learned_noise[j]),
            )
            self.lengthscale[j, :d_j] = outcome.lengthscale
            self.outputscale[j] = outcome.outputscale
            self._learned_noise[j] = outcome.noise
            self.jitter[j] = 0.0
            if not outcome.converged:
                failed.append(j)
            self._since_refit[j] = 0
            self._refit_due[j] = False
        return failed

    # ------------------------------------------------------------------ refits beside the model
    def refit_job(self, members: Sequence[int] | None = None) -> RefitJob | None:
        """The due refits and drift restandardizations, copied out to run beside the model.

        A member is in the job when its refit schedule fired (and it has `min_fit_points`
        observations: it is fit), its data drifted from the frozen standardization (it is
        restandardized and refactorized only) or its factor is due to be computed again under
        the values it holds (`keep`: refactorized only; a bounded model's exact pass over its
        diagonal). Their schedule is reset now: rows that arrive while the job runs count
        toward the next refit. None when nothing is due.

        Args:
            members: consider only these (default all).
        """
        chosen = range(self.batch) if members is None else [int(j) for j in members]
        real, min_points = self._buffers.real, self.config.min_fit_points
        fit = {j for j in chosen if self._refit_due[j] and real[j] >= min_points}
        moved = {j for j in chosen if self._drift_due[j] and real[j] > 0}
        refresh = {j for j in chosen if self._refresh_due[j] and real[j] > 0} - fit - moved
        listed = sorted(fit | moved | refresh)
        if not listed:
            return None
        for j in listed:
            self._drift_due[j] = self._refresh_due[j] = False
            if j in fit:
                self._refit_due[j], self._since_refit[j] = False, 0
        idx = torch.tensor(listed, device=self.device)
        buffers = self._buffers
        return RefitJob(
            members=listed,
            fit=[j in fit for j in listed],
            z=[buffers.z[j, : real[j]].clone() for j in listed],
            y=[buffers.y[j, : real[j]].clone() for j in listed],
            dims=[int(self.dims[j]) for j in listed],
            lengthscale=self.lengthscale[idx].clone(),
            outputscale=self.outputscale[idx].clone(),
            learned_noise=self._learned_noise[idx].clone(),
            known_noise=self._known_noise[idx].clone(),
            jitter=self.jitter[idx].clone(),
            kernel=self.config.kernel,
            priors=self.config.priors,
            epochs=[self._epochs[j] for j in listed],
            forgotten=[self._forgotten[j] for j in listed],
            keep=[j in refresh for j in listed] if refresh else None,
            y_mean=self.y_mean[idx].clone() if refresh else None,
            y_scale=self.y_scale[idx].clone() if refresh else None,
        )

    def refresh_job(self, job: RefitJob) -> RefitJob | None:
        """The job over its members' rows as they are now (for the factorization after a fit).

        A fit takes seconds to minutes at n in the thousands; the rows that came meanwhile (and
        the oldest ones a window forgot meanwhile) are then the factorization's business, in
        the refit's thread, not the install's on the caller's. None when a member changed in a
        way the copy cannot follow (its epoch moved): the job's members are then due again.
        """
        if any(self._epochs[j] != job.epochs[k] for k, j in enumerate(job.members)):
            for k, j in enumerate(job.members):
                self._requeue(j, job.fit[k], bool(job.keep and job.keep[k]))
            return None
        real, buffers = self._buffers.real, self._buffers
        return job.with_rows(
            z=[buffers.z[j, : real[j]].clone() for j in job.members],
            y=[buffers.y[j, : real[j]].clone() for j in job.members],
            forgotten=[self._forgotten[j] for j in job.members],
        )

    def late_rows(self, job: RefitJob) -> int:
        """The most rows a member of `job` learned or forgot since its rows were copied: what
        `install` appends (O(n²) each) or removes (O(n²) each) on the caller's thread."""
        real = self._buffers.real
        return max(
            (
                max(
                    real[j] + self._forgotten[j] - job.rows[k] - job.forgotten[k],
                    self._forgotten[j] - job.forgotten[k],
                )
                for k, j in enumerate(job.members)
            ),
            default=0,
        )

    def _requeue(self, member: int, fit: bool, keep: bool = False) -> None:
        """A stale job's member: its refit (or restandardization, or refactorization) is due
        again."""
        self._refit_due[member] = self._refit_due[member] or fit
        if keep:
            self._refresh_due[member] = True
        else:
            self._drift_due[member] = self._drift_due[member] or not fit

    @torch.no_grad()
    def install(self, result: RefitResult) -> LearnReport:
        """Swap in a refit done beside the model, then bring it up to the rows held now.

        Per member: its hyperparameters, standardization and jitter become the result's, its
        factor the result's for the snapshot's n₀ rows; the d oldest of them that the window
        forgot since the snapshot are removed again (`forget_oldest`, O(n²) each) and the rows
        that came since are appended again (one block, O(k·n²)): exactly the model a refit of
        the snapshot's rows and then those appends and removals would give. Nothing here is
        O(n³) unless the window forgot every row of the snapshot (then the member is rebuilt).
        A member changed in a way the copy cannot follow since the job was made (new
        hyperparameters, a rebuild) keeps its state and is due again.

        Returns:
            A `LearnReport`: refit, refit_failed and rebuilt name the members swapped in.
        """
        job, buffers = result.job, self._buffers
        installed, resync, late = [], [], [[] for _ in range(self.batch)]
        late_z = [None] * self.batch
        forget = [0] * self.batch
        with self._pending_detached():
            for k, j in enumerate(job.members):
                if not self._take_result(result, k, j):
                    continue
                installed.append(j)
                n0, n = job.rows[k], buffers.real[j]
                dropped = self._forgotten[j] - job.forgotten[k]
                if dropped >= n0:  # nothing of the snapshot is left
                    resync.append(j)
                    continue
                late_z[j] = buffers.z[j, n0 - dropped : n].clone()
                late[j] = buffers.y[j, n0 - dropped : n].tolist()
                if dropped:  # the snapshot's rows back in place, to forget its oldest again
                    ensure_capacity(buffers, n0)
                    buffers.z[j, :n0] = job.z[k]
                    buffers.y[j, :n0] = job.y[k]
                    forget[j] = dropped
                self._put_factor(result, k, j)
            resync += self._forget(forget)
            self._refresh_scalars()
            self._catch_up(late_z, late)
            self._moments = recount(buffers)
            if resync:
                self._rebuild(sorted(resync))
            buffers.version += 1
        return self._installed(result, installed)

    def _take_result(self, result: RefitResult, k: int, j: int) -> bool:
        """Member j (the job's k-th) takes the result's values; False, and due again, when a
        change the copy cannot follow came since (its epoch moved)."""
        job = result.job
        if self._epochs[j] != job.epochs[k]:
            self._requeue(j, job.fit[k], bool(job.keep and job.keep[k]))
            return False
        self._take_values(result, k, j)
        return True

    def _put_factor(self, result: RefitResult, k: int, j: int) -> None:
        """Member j's factor and v become the result's for the job's n₀ rows (its data
        buffers must hold those rows)."""
        n0 = result.job.rows[k]
        self._buffers.factor[j, :n0, :n0] = result.factor[k]
        self._buffers.v[j, :n0] = result.v[k]
        truncate(self._buffers, j, n0)
        self._buffers.rows[j] = self._buffers.real[j] = n0

    def _installed(self, result: RefitResult, installed: list[int]) -> LearnReport:
        """The report of an install that swapped in `installed`."""
        job = result.job
        return LearnReport(
            surprise=self._no_surprise,
            refit=[j for k, j in enumerate(job.members) if job.fit[k] and j in installed],
            refit_failed=[j for j in result.failed if j in installed],
            rebuilt=installed,
        )

    def _forget(self, counts: list[int]) -> list[int]:
        """Remove counts[j] oldest rows of each member j, one row per step (O(n²) each);
        returns the members whose update failed (to rebuild)."""
        buffers, failed = self._buffers, {}
        for step in range(max(counts, default=0)):
            members = [j for j, count in enumerate(counts) if count > step and j not in failed]
            if members:
                lost = forget_oldest(buffers, members, self.y_mean, self.y_scale)
                failed |= {j: step + 1 for j in lost}
        for j, done in failed.items():  # its data still loses the rows left (it is rebuilt)
            n, drop = buffers.rows[j], counts[j] - done
            buffers.z[j, : n - drop] = buffers.z[j, drop:n].clone()
            buffers.y[j, : n - drop] = buffers.y[j, drop:n].clone()
            buffers.real[j] -= drop
            truncate(buffers, j, n - drop)
        return sorted(failed)

    def _take_values(self, result: RefitResult, k: int, j: int) -> None:
        """Member j takes the result's k-th hyperparameters, jitter and standardization."""
        self.lengthscale[j] = result.lengthscale[k]
        self.outputscale[j] = result.outputscale[k]
        self._learned_noise[j] = result.learned_noise[k]
        self.jitter[j] = result.jitter[k]
        self.y_mean[j] = result.y_mean[k]
        self.y_scale[j] = result.y_scale[k]

    def _catch_up(self, late_z: list[torch.Tensor | None], late_y: list[list[float]]) -> None:
        """Append each member's late rows again (unit-cube inputs, raw outputs) as one block."""
        k = max((len(values) for values in late_y), default=0)
        if k == 0:
            return
        z = torch.zeros(self.batch, k, self.dim, dtype=self.dtype, device=self.device)
        y = [[0.0] * k for _ in range(self.batch)]
        chosen: list[list[int]] = [[] for _ in range(self.batch)]
        for j, values in enumerate(late_y):
            if values:
                z[j, : len(values)] = late_z[j]
                y[j][: len(values)] = values
                chosen[j] = list(range(len(values)))
        with one_thread():
            self._append_block(z, y, chosen)
        for j, rows in enumerate(chosen):
            self._buffers.real[j] += len(rows)

    def member_data(self, member: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A member's observations: (n, dims) unit-cube inputs and (n,) outputs (copies)."""
        n, width = self._buffers.real[member], max(int(self.dims[member]), 1)
        return self._buffers.z[member, :n, :width].clone(), self._buffers.y[member, :n].clone()

    # ------------------------------------------------------------------ persistence
    @property
    def carries_rows(self) -> bool:
        """Whether `state()` carries the rows (and `resume` is how a restart starts): a model
        with a budget (`capacity`) or a change detector (`change`) keeps rows chosen with the
        hyperparameters of the moment, which a replay from scratch would choose again with
        other ones."""
        return self.config.capacity is not None or self._change is not None

    def state(self) -> dict[str, torch.Tensor]:
        """Hyperparameters, standardization, refit schedule; with `carries_rows`, also the
        rows held and the count of observations learned (`KEPT_FIELDS`), and with a change
        detector its running test (`core.gp.change.CHANGE_FIELDS`).

        With the same data replayed, `load_state` of this reproduces an exact GP's posterior
        exactly (an exact GP is a function of data, hyperparameters and standardization only);
        for the others `resume` then the replay does.
        """
        state = {
            "lengthscale": self.lengthscale.clone(),
            "outputscale": self.outputscale.clone(),
            "learned_noise": self._learned_noise.clone(),
            "jitter": self.jitter.clone(),
            "y_mean": self.y_mean.clone(),
            "y_scale": self.y_scale.clone(),
            "since_refit": torch.tensor(self._since_refit, dtype=torch.long),
            "refit_due": torch.tensor(self._refit_due, dtype=torch.bool),
        }
        if self.carries_rows:
            width = max(max(self._buffers.real), 1)
            state["kept_z"] = self._buffers.z[:, :width].clone()
            state["kept_y"] = self._buffers.y[:, :width].clone()
            state["kept_rows"] = torch.tensor(self._buffers.real, dtype=torch.long)
            state["kept_seen"] = torch.tensor(self._seen, dtype=torch.long)
        if self._change is not None:
            for name, values in self._change.state().items():
                dtype = torch.float64 if name == "change_statistic" else torch.long
                state[name] = torch.tensor(values, dtype=dtype)
        return state

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the hyperparameters, standardization and schedule of `state()` (same batch
        and dims), then rebuild once. The rows and the change test stay (see `resume`)."""
        check_state(state, self.batch, self.dim)
        b = (self.batch,)
        with self._pending_detached():
            opts = {"dtype": self.dtype, "device": self.device}
            self.lengthscale = self._positive("lengthscale", state["lengthscale"], (*b, self.dim))
            self.outputscale = self._positive("outputscale", state["outputscale"], b)
            self._learned_noise = self._positive("noise", state["learned_noise"], b)
            self.jitter = torch.as_tensor(state["jitter"], **opts).clone()
            self.y_mean = torch.as_tensor(state["y_mean"], **opts).clone()
            self.y_scale = self._positive("y_scale", state["y_scale"], b)
            self._since_refit = [int(v) for v in state["since_refit"].tolist()]
            self._refit_due = [bool(v) for v in state["refit_due"].tolist()]
            self._rebuild(list(range(self.batch)))

    def resume(self, state: dict[str, torch.Tensor], *, replay: bool = True) -> None:
        """Start again from `state()` on a model that has learned nothing yet: the rows held,
        hyperparameters, counts and change test; the next `kept_seen[j]` readings of member j
        (a replay of the readings the state was taken after) are skipped, and those after
        them are learned as the model that made the state learned them. A state without rows
        (an exact model's) is only loaded: its replay from scratch rebuilds the model.

        Args:
            replay: False when the caller will not replay the readings before the state (it
                continues with the next ones): nothing is skipped.
        """
        if any(self._buffers.real) or any(self._seen):
            raise ValueError("resume needs a model that has learned nothing")
        state = {_LEGACY_KEPT.get(k, k): v for k, v in state.items()}  # older snapshots
        if any(name not in state for name in KEPT_FIELDS):
            return self.load_state(state)
        rows = [int(v) for v in state["kept_rows"].tolist()]
        if len(rows) != self.batch:
            raise ValueError(f"state has {len(rows)} members, expected {self.batch}")
        z = torch.as_tensor(state["kept_z"], dtype=self.dtype, device=self.device)
        y = torch.as_tensor(state["kept_y"], dtype=self.dtype, device=self.device)
        self.reserve(max(rows, default=0) + 2)
        for j, n in enumerate(rows):
            put_data(self._buffers, j, z[j, :n], y[j, :n])
        self._moments = recount(self._buffers)
        self._seen = [int(v) for v in state["kept_seen"].tolist()]
        self._skip = list(self._seen) if replay else [0] * self.batch
        self.load_state(state)
        if self._change is not None and all(name in state for name in CHANGE_FIELDS):
            self._change.load({name: state[name].tolist() for name in CHANGE_FIELDS})

    # ------------------------------------------------------------------ prediction
    def alpha(self) -> torch.Tensor:
        """(b, w) weights α = (K + σ²I)⁻¹ ỹ in standardized units (zero past a member's rows)."""
        return self._cache.alpha()

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
            full_covariance: also return the (b', q, q) covariance (`rsample` needs it).

        Returns:
            `GPPosterior` in output units, with a leading dim b' (dropped for an int member).
        """
        single = isinstance(members, int)
        idx = member_index(members, self.batch, self._arange_b)
        x = check_queries(x, len(idx), self.dim, single, self.dtype, self.device)
        post = latent_posterior(
            self._buffers,
            self._cache,
            self._scale(x, idx),
            idx,
            idx is self._arange_b,
            full_covariance,
            self.lengthscale,
            self.outputscale,
            self.config.kernel,
        )
        return in_output_units(post, self.y_mean[idx], self.y_scale[idx], single)
