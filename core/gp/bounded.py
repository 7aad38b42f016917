"""A GP for unbounded streams: exact up to a capacity, then a budget of the most informative rows.

`BoundedGP` is an `IncrementalGP` (same factor, appends, refits beside the model, posterior)
that stops growing. Below `GPConfig.capacity` observations per member it is the exact GP and
does nothing else. When a member first holds more than `capacity` rows the switch is logged
(`gp.bounded`), and from then on every learned reading is followed by the removal of the
member's least informative rows — two per reading while the member is above its `budget` m,
one per reading after — so a member settles at m rows without a pause, and each reading costs
O(m²): the append, one removal and the bookkeeping below.

Which row goes. Given the other rows, row i tells the GP ½·log(1 + s²₋ᵢ(xᵢ)/σ²) nats about
f, s²₋ᵢ(xᵢ) being the leave-one-out predictive variance at xᵢ; since s²₋ᵢ(xᵢ) + σ² = 1/Qᵢᵢ
with Q = (K + σ²I)⁻¹, the least informative row is the one with the largest Qᵢᵢ. Removing it
first is the greedy backward step of maximizing the information the kept set carries about f
(the log-determinant criterion of sparse GP subset selection; Seeger et al. 2003, Csató and
Opper 2002 score rows the same way). It depends on the inputs and hyperparameters only, not on
the readings, so one outlier cannot pin itself into the budget, and it keeps the budget spread
over the region the policy visits instead of its newest corner (the oldest-first `window`).

The diagonal of Q is kept in O(m²) per step from the factor L (K + σ²I = LLᵀ):
  - append of row [cᵀ, d] to L: b = L⁻ᵀc, Qᵢᵢ += bᵢ²/d², the new Qₙₙ = 1/d²;
  - removal of row i: q = Q eᵢ = L⁻ᵀ(L⁻¹eᵢ), Qⱼⱼ −= qⱼ²/qᵢ;
and recomputed exactly (O(m³), from L⁻¹) after every rebuild and every `budget` removals, so
rounding never accumulates over a long stream — with deferred refits (the service) that pass
runs beside the caller: the member goes out in the next `refit_job`, refactorized under the
values it holds, and `install` brings back the factor and the diagonal computed there and
replays the edits since the copy (see `_current_qdiag`). The factor loses row i as `core.gp.window`
forgets the oldest row: with L = [[L_AA, 0, 0], [·, lᵢᵢ, 0], [L_BA, l_B, L_BB]], the factor
without row and column i is [[L_AA, 0], [L_BA, L_BB·C]], C = chol(I + ppᵀ), p = L_BB⁻¹l_B —
a rank-one update with C in closed form.

Refits beside the loop fit the member's kept rows (`refit_job` copies what the buffers hold:
at most the capacity). A restart rebuilds the same state: `state()` carries the kept rows and
the count of observations each member has learned, `resume` puts them back before the stored
readings are replayed, and the replay skips the readings the kept rows already stand for; the
rest are learned exactly as they were live (the selection is a function of the rows, the
hyperparameters and the order of the readings only, and the agent stores a snapshot at every
change of hyperparameters).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import structlog
import torch

from core.blas import solve_lower_in_buffer_, solve_lower_transposed_in_buffer_
from core.gp.buffers import ensure_capacity, truncate
from core.gp.config import GPConfig, LearnReport
from core.gp.model import IncrementalGP
from core.gp.refit import RefitJob, RefitResult
from core.gp.standardize import recount

__all__ = ["STALE_PASSES", "BoundedGP", "make_gp", "remove_row"]

# With deferred refits, the removals (in budgets) after which a member whose exact pass over
# its diagonal is still due computes it on the caller (no refit job came for it).
STALE_PASSES = 4

log = structlog.get_logger("core.gp.bounded")


def make_gp(
    bounds: torch.Tensor | Sequence, config: GPConfig | None = None, *, dims=None
) -> IncrementalGP:
    """A `BoundedGP` when the config sets a capacity, else the exact `IncrementalGP`."""
    if config is not None and config.capacity is not None:
        return BoundedGP(bounds, config, dims=dims)
    return IncrementalGP(bounds, config, dims=dims)


def remove_row(factor: torch.Tensor, n: int, i: int, p: torch.Tensor | None = None) -> bool:
    """Remove row and column i from the n-row lower factor held in `factor`, in O(n²).

    Args:
        factor: (c, c) a member's factor buffer, c ≥ n; rows and columns past n-1 are left
            for the caller to make inert.
        p: (n-i-1,) L_BB⁻¹l_B if the caller has it (−lᵢᵢ·(L⁻¹eᵢ)[i+1:]); else solved here.

    Returns:
        False (factor untouched) when the update is not finite.
    """
    l_bb = factor[i + 1 : n, i + 1 : n]
    if p is None:
        p = factor[i + 1 : n, i].clone()
        if p.numel():
            p = torch.linalg.solve_triangular(l_bb, p.unsqueeze(-1), upper=False).squeeze(-1)
    t = torch.cumsum(p.square(), 0).add_(1.0)
    if not bool(torch.isfinite(t[-1:]).all()):
        return False
    t_prev = torch.cat((torch.ones_like(t[:1]), t[:-1]))
    scale = t.div(t_prev).sqrt_()  # Cₖₖ
    weight = p.div((t_prev * t).sqrt_())  # wₖ
    new = l_bb * p  # (L_BB)ᵢₖ pₖ
    new.cumsum_(-1)
    new = new[:, -1:] - new  # Sᵢₖ = Σ_{j>k} (L_BB)ᵢⱼ pⱼ
    new.mul_(weight).addcmul_(l_bb, scale)  # L_BB diag(C) + S diag(w)
    factor[i : n - 1, :i] = factor[i + 1 : n, :i].clone()
    factor[i : n - 1, i : n - 1] = new
    return True


class BoundedGP(IncrementalGP):
    """An `IncrementalGP` exact up to `config.capacity` rows per member, then bounded.

    Args: as `IncrementalGP`; `config.capacity` must be set (`config.budget` defaults to it).
    """

    def __init__(
        self,
        bounds: torch.Tensor | Sequence,
        config: GPConfig,
        *,
        dims: Sequence[int] | None = None,
    ) -> None:
        if config.capacity is None:
            raise ValueError("a BoundedGP needs config.capacity")
        super().__init__(bounds, config, dims=dims)
        self.capacity = config.capacity
        self.budget = config.budget or config.capacity
        b = self.batch
        self._switched = [False] * b
        self._qdiag: list[torch.Tensor | None] = [None] * b
        self._removals = [0] * b  # since the diagonal was last computed exactly
        self._before: list[int] | None = None  # rows before the append being learned
        # Deferred refits: per member, its edits (("add", z, y), ("remove", i)) since the
        # oldest job's copy, numbered from _edit_base, so that `install` replays them
        self._edits: list[list[tuple]] = [[] for _ in range(b)]
        self._edit_base = [0] * b
        self._logged = [0] * b  # rows when the edits were last logged
        self.reserve(self.capacity + 2)

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
        """As `IncrementalGP.learn_one`, then the budget (see the module)."""
        self._before = list(self._buffers.real)  # read by `_apply_window`, after the append
        try:
            return super().learn_one(x, y, mask, refit=refit)
        finally:
            self._before = None

    @torch.no_grad()
    def learn_block(
        self,
        x: torch.Tensor | Sequence,
        y: torch.Tensor | Sequence,
        mask: torch.Tensor | Sequence[bool] | None = None,
        *,
        refit: bool = True,
    ) -> LearnReport:
        """As `IncrementalGP.learn_block` while every member stays within its capacity; else row
        by row (`learn_one`), so that the kept set does not depend on how readings were grouped
        (a restart replays them one by one); the schedule runs once at the end."""
        x, y = self._as_tensor(x), self._as_tensor(y)
        k = x.shape[1]
        mask = torch.ones(self.batch, k, dtype=torch.bool) if mask is None else mask
        mask = torch.as_tensor(mask, dtype=torch.bool)
        if k == 1:
            return self.learn_one(x[:, 0], y[:, 0], mask[:, 0], refit=refit)
        if self._within_capacity(mask.sum(-1).tolist()):
            return super().learn_block(x, y, mask, refit=refit)
        return self._learn_rows(x, y, mask, refit=refit)

    @torch.no_grad()
    def learn_many(
        self,
        x: torch.Tensor | Sequence,
        y: torch.Tensor | Sequence,
        mask: torch.Tensor | Sequence[bool] | None = None,
        *,
        refit: bool = True,
    ) -> LearnReport:
        """One refactorization while every member stays within its capacity (and nothing is
        skipped); otherwise row by row, as `learn_block`."""
        x = self._as_tensor(x)
        counts = (
            [x.shape[1]] * self.batch if mask is None else torch.as_tensor(mask).sum(-1).tolist()
        )
        if self._within_capacity(counts):
            return super().learn_many(x, y, mask, refit=refit)
        return self.learn_block(x, y, mask, refit=refit)

    def _within_capacity(self, counts: list[int]) -> bool:
        """Whether learning counts[j] more rows keeps every member exact (and none is skipped)."""
        return not any(self._skip) and all(
            not self._switched[j] and self._buffers.real[j] + int(counts[j]) <= self.capacity
            for j in range(self.batch)
        )

    def _track_appends(self, before: list[int]) -> None:
        """Keep the diagonal of Q of members that appended one row (see the module)."""
        factor = self._buffers.factor
        for j, n_old in enumerate(before):
            qd = self._qdiag[j]
            n = self._buffers.real[j]
            if qd is None or n != n_old + 1 or qd.numel() != n_old:
                continue
            b, d = factor[j, n_old, :n_old].clone(), factor[j, n_old, n_old]
            solve_lower_transposed_in_buffer_(factor[j], n_old, b)  # b = L⁻ᵀc, L read in place
            self._qdiag[j] = torch.cat((qd + b.square() / d.square(), (1.0 / d.square())[None]))

    # ------------------------------------------------------------------ the budget
    def _apply_window(self, rebuilding: set[int]) -> tuple[list[int], list[int]]:
        """Past capacity, remove the least informative rows (two while above the budget)."""
        if self._before is not None:
            self._track_appends(self._before)
        self._log_appends()
        dropped, rebuild = [0] * self.batch, []
        for j in range(self.batch):
            real = self._buffers.real[j]
            if not self._switched[j]:
                if real <= self.capacity:
                    continue
                self._switched[j] = True
                log.info(
                    "gp.bounded",
                    member=j,
                    rows=real,
                    capacity=self.capacity,
                    budget=self.budget,
                    observations=self._seen[j],
                )
            excess = min(real - self.budget, 2)
            for _ in range(max(excess, 0)):
                removed = self._remove_least_informative(j)
                if removed is None:
                    rebuild.append(j)
                    self._log(j, ("reset",))
                    break
                self._log(j, ("remove", removed))
                dropped[j] += 1
        self._logged = list(self._buffers.real)
        if any(dropped):
            for j, count in enumerate(dropped):
                self._forgotten[j] += count  # a refit job copied before is resynced
            self._moments = recount(self._buffers)
        return dropped, sorted(set(rebuild))

    def _fresh_qdiag(self, j: int) -> torch.Tensor:
        """diag((K + σ²I)⁻¹) of member j from its factor, exactly (O(n³))."""
        n = self._buffers.real[j]
        eye = torch.eye(n, dtype=self.dtype, device=self.device)
        inverse = torch.linalg.solve_triangular(self._buffers.factor[j, :n, :n], eye, upper=False)
        self._removals[j] = 0
        return inverse.square().sum(0)

    def _remove_least_informative(self, j: int) -> int | None:
        """Drop member j's row of largest Qᵢᵢ (the oldest among ties); its index, or None if
        it failed."""
        qd = self._current_qdiag(j)
        i = int(torch.argmax(qd))
        return i if self._remove_at(j, i, qd) else None

    def _current_qdiag(self, j: int) -> torch.Tensor:
        """Member j's diag(Q), kept, or computed exactly when missing (O(n³)). After `budget`
        removals it is due for an exact pass: here and now, or, with deferred refits, beside
        the caller (`refit_job` hands the member out to be refactorized under its current
        values; `install` brings the factor and diagonal computed there, and the removals
        meanwhile use the kept one). Past STALE_PASSES·budget removals with no job come (a
        caller that runs none), it is computed here."""
        qd = self._qdiag[j]
        if qd is None or qd.numel() != self._buffers.real[j]:
            return self._fresh_qdiag(j)
        removals = self._removals[j]
        if removals >= self.budget:
            if self.config.deferred and removals < STALE_PASSES * self.budget:
                self._refresh_due[j] = True
            else:
                qd = self._fresh_qdiag(j)
        return qd

    def _remove_at(self, j: int, i: int, qd: torch.Tensor) -> bool:
        """Drop member j's row i in O(n²), diag(Q) = qd before; False if it failed."""
        buffers = self._buffers
        n = buffers.real[j]
        factor = buffers.factor[j]
        u = torch.zeros(n, dtype=self.dtype, device=self.device)
        u[i] = 1.0  # L⁻¹eᵢ is zero above row i: only the trailing block is solved
        solve_lower_in_buffer_(factor[i:, i:], n - i, u[i:])
        q = u.clone()
        solve_lower_transposed_in_buffer_(factor, n, q)  # Q eᵢ = L⁻ᵀL⁻¹eᵢ
        # (L⁻¹eᵢ)[i+1:] = −L_BB⁻¹l_B / lᵢᵢ: the p of the rank-one update, with no solve of its own
        p = u[i + 1 :] * -factor[i, i]
        if not remove_row(buffers.factor[j], n, i, p):
            self._qdiag[j] = None
            return False
        qd = qd - q.square() / q[i]
        self._qdiag[j] = torch.cat((qd[:i], qd[i + 1 :]))
        self._removals[j] += 1
        buffers.z[j, i : n - 1] = buffers.z[j, i + 1 : n].clone()
        buffers.y[j, i : n - 1] = buffers.y[j, i + 1 : n].clone()
        buffers.real[j] = n - 1
        truncate(buffers, j, n - 1)
        buffers.v[j, : n - 1] = (buffers.y[j, : n - 1] - self.y_mean[j]) / self.y_scale[j]
        solve_lower_in_buffer_(buffers.factor[j], n - 1, buffers.v[j, : n - 1])  # fresh v = L⁻¹ỹ
        buffers.version += 1
        return True

    def _rebuild(self, members: list[int]) -> None:
        super()._rebuild(members)
        for j in members:  # a new factor: the diagonal is computed again when next needed
            self._qdiag[j] = None

    # ------------------------------------------------------------------ refits beside the loop
    def _log(self, j: int, edit: tuple) -> None:
        """Note an edit of member j's rows for a job's install (deferred refits only)."""
        if not self.config.deferred:
            return
        edits = self._edits[j]
        edits.append(edit)
        if len(edits) > 4 * (self.capacity + 2):  # no job came for them: keep memory flat
            self._edit_base[j] += len(edits)
            edits.clear()

    def _log_appends(self) -> None:
        """Log the rows each member appended since the last log (a member holding fewer rows
        than then lost them to a change or a failure: no replay gets past that)."""
        buffers = self._buffers
        for j, logged in enumerate(self._logged):
            if buffers.real[j] < logged:
                self._log(j, ("reset",))
            for r in range(logged, buffers.real[j]):
                self._log(j, ("add", buffers.z[j, r].clone(), float(buffers.y[j, r])))
        self._logged = list(buffers.real)

    def _mark(self, j: int) -> int:
        return self._edit_base[j] + len(self._edits[j])

    def refit_job(self, members: Sequence[int] | None = None) -> RefitJob | None:
        """As `IncrementalGP.refit_job`, with each member's edit count (see `install`)."""
        job = super().refit_job(members)
        if job is None or not self.config.deferred:
            return job
        for j in job.members:  # the service runs one job at a time: older edits are done with
            self._edit_base[j] += len(self._edits[j])
            self._edits[j].clear()
        return dataclasses.replace(job, marks=[self._mark(j) for j in job.members])

    def refresh_job(self, job: RefitJob) -> RefitJob | None:
        fresh = super().refresh_job(job)
        if fresh is None or job.marks is None:
            return fresh
        return dataclasses.replace(fresh, marks=[self._mark(j) for j in job.members])

    @torch.no_grad()
    def install(self, result: RefitResult) -> LearnReport:
        """Swap in a refit done beside the model: per member its values, its snapshot's factor
        and diag(Q) (both computed beside the loop), then the member's own appends and
        removals since the snapshot replayed in order (O(m²) each), so the kept rows are
        exactly the live ones. (`IncrementalGP.install` would forget the snapshot's oldest
        rows, where this model removed its least informative.) A member whose edits are not
        all known (a change, a failed removal) is rebuilt from its rows."""
        job, buffers = result.job, self._buffers
        if job.marks is None or result.qdiag is None:
            return super().install(result)
        installed, resync, replays = [], [], {}
        with self._pending_detached():
            for k, j in enumerate(job.members):
                if not self._take_result(result, k, j):
                    continue
                installed.append(j)
                start = job.marks[k] - self._edit_base[j]
                edits = self._edits[j][start:] if start >= 0 else None
                if edits is None or any(e[0] == "reset" for e in edits):
                    resync.append(j)
                    continue
                n0 = job.rows[k]
                buffers.z[j, :n0] = job.z[k]
                buffers.y[j, :n0] = job.y[k]
                self._put_factor(result, k, j)
                self._qdiag[j] = result.qdiag[k].to(self.dtype)
                self._removals[j] = 0
                self._refresh_due[j] = False
                replays[j] = edits
            self._refresh_scalars()
            for j, edits in replays.items():
                if not self._replay(j, edits):
                    resync.append(j)
            self._moments = recount(buffers)
            if resync:
                self._rebuild(sorted(set(resync)))
            self._logged = list(buffers.real)
            buffers.version += 1
        return self._installed(result, installed)

    def _replay(self, j: int, edits: list[tuple]) -> bool:
        """Member j's logged appends and removals, again, under its new factor."""
        buffers = self._buffers
        for kind, *payload in edits:
            if kind == "add":
                z = torch.zeros(self.batch, self.dim, dtype=self.dtype, device=self.device)
                z[j] = payload[0]
                y = [0.0] * self.batch
                y[j] = payload[1]
                before = list(buffers.real)
                ensure_capacity(buffers, max(buffers.rows) + 1)
                self._append(z, y, [j])
                buffers.real[j] += 1
                self._track_appends(before)
            elif not self._remove_at(j, payload[0], self._current_qdiag(j)):
                return False
        return True

    # ------------------------------------------------------------------ persistence
    @property
    def switched(self) -> list[bool]:
        """Per member: whether it has passed its capacity (and keeps a budget since)."""
        return list(self._switched)

    def resume(self, state: dict[str, torch.Tensor], *, replay: bool = True) -> None:
        """As `IncrementalGP.resume`; a member that had learned more than its capacity keeps
        its budget from the first reading on."""
        super().resume(state, replay=replay)
        self._switched = [seen > self.capacity for seen in self._seen]
        self._logged = list(self._buffers.real)
