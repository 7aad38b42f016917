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
the factor is rebuilt (`standardize`). Pending points (inputs whose readings are not known yet)
are kept as each member's trailing rows with the posterior mean as their value: the variance
shrinks, the mean does not move (`pending`). Everything follows the dtype and device of the
declared bounds (float64 default).

This module holds the model: its learn verbs, the refit schedule and its state; the work is
done by functions over its buffers, in the modules named above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager

import torch

from core.gp.append import append_rows, member_scalars
from core.gp.block import append_block, one_thread
from core.gp.buffers import allocate, ensure_capacity, grow, memory_bytes, put_data
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
from core.gp.config import LENGTHSCALE_FLOOR, MIN_NOISE, GPConfig, LearnReport
from core.gp.pending import PendingPoint, detached, find
from core.gp.posterior import FactorCache, GPPosterior, in_output_units, latent_posterior
from core.gp.rebuild import add_jitter, refactorize
from core.gp.standardize import drifted, recount, restandardize
from core.gp.window import apply_window
from core.hyperfit import FittedHyperparameters, fit_hyperparameters

__all__ = ["IncrementalGP"]


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
        self._moments = recount(self._buffers)
        self._no_surprise = torch.full((b,), math.nan, **opts)
        self._arange_b = torch.arange(b, device=self.device)
        self._cache = FactorCache(self._buffers)
        self._refresh_scalars()

    def reserve(self, rows: int) -> None:
        """Make room for `rows` rows per member now, so that later appends never reallocate."""
        if rows > self._buffers.capacity:
            grow(self._buffers, rows)

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
        buffers = self._buffers
        with self._pending_detached():
            ensure_capacity(buffers, max(buffers.rows) + x.shape[1] + len(self._pending))
            z = self._scale(x)
            for j in range(self.batch):
                chosen = mask[j].nonzero().flatten()
                put_data(buffers, j, z[j, chosen], y[j, chosen])
                self._since_refit[j] += chosen.numel()
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
        """Learn up to k observations per member, reading each member's factor once.

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
        chosen = [[i for i, m in enumerate(row) if m] for row in mask.tolist()]
        buffers = self._buffers
        with self._pending_detached():
            ensure_capacity(buffers, max(buffers.rows) + x.shape[1] + len(self._pending))
            with one_thread():
                surprises = self._append_block(self._scale(x), y.tolist(), chosen)
            for j, values in enumerate(surprises):
                self._count_learned(j, values)
            report = self._after_new_data(refit)
        largest = [max(values) if values else math.nan for values in surprises]
        report.surprise = torch.tensor(largest, dtype=self.dtype, device=self.device)
        return report

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
        misfit_z = self.config.misfit_z
        if misfit_z is not None and any(s > misfit_z for s in surprises):
            self._refit_due[member] = True

    def _after_new_data(self, refit: bool, restandardizing: Sequence[int] = ()) -> LearnReport:
        """Window, drift and refit schedule; the members they touch are rebuilt once."""
        forgotten, window_rebuild = self._apply_window(rebuilding=set(restandardizing))
        scalars = self._scalars
        moved = drifted(self._moments, scalars.mean, scalars.scale, self.config.drift_tolerance)
        restd = set(restandardizing) | set(moved)
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
        )

    def _apply_window(self, rebuilding: set[int]) -> tuple[list[int], list[int]]:
        """The window (see `apply_window`), then the running moments of what is left."""
        window = self.config.window
        if window is None:
            return [0] * self.batch, []
        dropped, rebuild = apply_window(
            self._buffers, window, rebuilding, self.y_mean, self.y_scale
        )
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
        noise = self._refresh_scalars()  # every change of a hyperparameter, jitter or scale
        refactorize(
            self._buffers,
            members,
            kernel=self.config.kernel,
            lengthscale=self.lengthscale,
            outputscale=self.outputscale,
            noise=noise,
            jitter=self.jitter,
            y_mean=self.y_mean,
            y_scale=self.y_scale,
        )

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
            z = self._buffers.z[j, :n, :d_j]
            y_std = (self._buffers.y[j, :n] - self.y_mean[j]) / self.y_scale[j]
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
        n, width = self._buffers.real[member], max(int(self.dims[member]), 1)
        return self._buffers.z[member, :n, :width].clone(), self._buffers.y[member, :n].clone()

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
