"""Refits beside the model: a snapshot of some members' data, fitted and factorized elsewhere.

A hyperparameter fit (BoTorch, hundreds of milliseconds) and the O(n³) refactorization that
follows it must not hold up the caller that appends rows. `IncrementalGP.refit_job` copies what
a refit needs — each member's observations, hyperparameters and jitter — into a `RefitJob`;
`run_refit` does the slow work on that copy alone — `fit_job` (the hyperparameter fit, Python-
heavy: a process of its own keeps it off the caller's interpreter lock) then `factorize_job`
(the O(n³) LAPACK work, which releases that lock: a thread will do) — and
`IncrementalGP.install` swaps the result in, appending the rows that arrived meanwhile with the
new hyperparameters (O(k·n²) for k of them). The installed model is exactly the model a
synchronous refit of the snapshot's rows followed by those appends would give.

Per member the job does what the synchronous path does: restandardize from the data, fit the
hyperparameters on the standardized data (members marked `fit`; the others only drifted from
their standardization and keep their hyperparameters), then refactorize with jitter retries.
A member marked `keep` keeps its standardization too: it is only refactorized (a bounded
model's periodic exact recomputation of diag((K + σ²I)⁻¹), `core.gp.bounded`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.gp.buffers import GPBuffers, allocate, ensure_capacity, put_data
from core.gp.config import LENGTHSCALE_FLOOR, MIN_NOISE
from core.gp.rebuild import refactorize
from core.gp.standardize import standardization
from core.hyperfit import FittedHyperparameters, PriorName, fit_hyperparameters
from core.kernels import KernelName

__all__ = [
    "FitOutcome",
    "RefitFit",
    "RefitJob",
    "RefitResult",
    "effective_noise",
    "factorize_job",
    "fit_job",
    "fit_member",
    "run_refit",
]


def effective_noise(
    known: torch.Tensor, learned: torch.Tensor, y_scale: torch.Tensor
) -> torch.Tensor:
    """(b,) noise variance in standardized units, as the factor uses it.

    Args:
        known: (b,) known noise variance in output units, NaN where the noise is learned.
        learned: (b,) learned noise variance (standardized units).
        y_scale: (b,) the output scale of the standardization.
    """
    noise = torch.where(torch.isnan(known), learned, known / y_scale.pow(2))
    return noise.clamp_min(MIN_NOISE)


@dataclass(frozen=True)
class FitOutcome:
    """One member's fitted hyperparameters, ready to store (lengthscale floored)."""

    lengthscale: torch.Tensor  # (d_j,)
    outputscale: float
    noise: float  # the learned noise (standardized units); unchanged where the noise is known
    converged: bool


def fit_member(
    z: torch.Tensor,
    y_std: torch.Tensor,
    *,
    kernel: KernelName,
    priors: PriorName,
    known_noise: float | None,
    lengthscale: torch.Tensor,
    outputscale: float,
    learned_noise: float,
) -> FitOutcome:
    """Fit one member's hyperparameters, warm-started from its current ones.

    Args:
        z: (n, d_j) unit-cube inputs (the member's real dimensions only).
        y_std: (n,) standardized outputs.
        known_noise: the fixed noise variance (standardized units), None when it is learned.
        lengthscale: (d_j,) the current lengthscales, the warm start.
    """
    initial = FittedHyperparameters(lengthscale, outputscale, learned_noise, True)
    fitted = fit_hyperparameters(
        z, y_std, kernel=kernel, priors=priors, known_noise=known_noise, initial=initial
    )
    return FitOutcome(
        fitted.lengthscale.to(lengthscale).clamp_min(LENGTHSCALE_FLOOR),
        float(fitted.outputscale),
        learned_noise if known_noise is not None else float(fitted.noise),
        fitted.converged,
    )


@dataclass(frozen=True)
class RefitJob:
    """What a refit of m members needs, copied out of the model (nothing here is shared).

    Attributes:
        members: the members, in the model's numbering.
        fit: per member, whether its hyperparameters are fit (else it is only restandardized
            and refactorized: its data drifted from the frozen standardization).
        z: per member, (n_j, d) its unit-cube inputs; y: (n_j,) its raw outputs.
        dims: per member, its real input dimensions (the fit sees only those).
        lengthscale: (m, d); outputscale, learned_noise, known_noise (NaN: learned), jitter: (m,).
        kernel, priors: the model's settings.
        epochs: per member, the model's epoch when copied; `install` refuses a stale one.
        forgotten: per member, rows the window had forgotten when copied.
        marks: per member, a bounded model's count of edits (appends, removals) when copied,
            so that its install replays those since (`core.gp.bounded`); None otherwise.
        keep: per member, whether it keeps its hyperparameters and standardization (y_mean,
            y_scale: (m,) the model's when copied) and is only refactorized; None: none does.
    """

    members: list[int]
    fit: list[bool]
    z: list[torch.Tensor]
    y: list[torch.Tensor]
    dims: list[int]
    lengthscale: torch.Tensor
    outputscale: torch.Tensor
    learned_noise: torch.Tensor
    known_noise: torch.Tensor
    jitter: torch.Tensor
    kernel: KernelName
    priors: PriorName
    epochs: list[int]
    forgotten: list[int]
    marks: list[int] | None = None
    keep: list[bool] | None = None
    y_mean: torch.Tensor | None = None
    y_scale: torch.Tensor | None = None

    @property
    def rows(self) -> list[int]:
        """n_j, the observations each member's snapshot holds."""
        return [int(y.shape[0]) for y in self.y]

    def split(self) -> list[RefitJob]:
        """One job per member: each can be fit, factorized and installed on its own, so the
        first member's new values arrive after one fit rather than after all of them."""
        return [self.part([k]) for k in range(len(self.members))]

    def part(self, ks: Sequence[int]) -> RefitJob:
        """The job of the members at positions `ks` only."""
        idx = torch.tensor(list(ks), dtype=torch.long)
        return RefitJob(
            members=[self.members[k] for k in ks],
            fit=[self.fit[k] for k in ks],
            z=[self.z[k] for k in ks],
            y=[self.y[k] for k in ks],
            dims=[self.dims[k] for k in ks],
            lengthscale=self.lengthscale[idx],
            outputscale=self.outputscale[idx],
            learned_noise=self.learned_noise[idx],
            known_noise=self.known_noise[idx],
            jitter=self.jitter[idx],
            kernel=self.kernel,
            priors=self.priors,
            epochs=[self.epochs[k] for k in ks],
            forgotten=[self.forgotten[k] for k in ks],
            marks=None if self.marks is None else [self.marks[k] for k in ks],
            keep=None if self.keep is None else [self.keep[k] for k in ks],
            y_mean=None if self.y_mean is None else self.y_mean[idx],
            y_scale=None if self.y_scale is None else self.y_scale[idx],
        )

    def with_rows(
        self,
        z: list[torch.Tensor],
        y: list[torch.Tensor],
        forgotten: list[int],
        marks: list[int] | None = None,
    ) -> RefitJob:
        """The same job (members, values, epochs) over newer copies of its members' rows: the
        factorization after a long fit uses the rows the model holds by then, so that only
        the few that come during the factorization are left to append on install."""
        marks = self.marks if marks is None else marks
        return dataclasses.replace(self, z=z, y=y, forgotten=forgotten, marks=marks)


@dataclass(frozen=True)
class RefitResult:
    """A refit's outcome for the job's m members, to `install` in the model.

    Attributes:
        factor: per member, (n_j, n_j) the Cholesky factor of its snapshot's rows.
        v: per member, (n_j,) L⁻¹ỹ.
        lengthscale: (m, d); outputscale, learned_noise, jitter, y_mean, y_scale: (m,).
        failed: the members (model numbering) whose optimizer did not converge.
        seconds: wall time of the fit and the factorization.
        qdiag: for a bounded model's job (`marks` set), per member (n_j,) diag((K + σ²I)⁻¹)
            of the snapshot, O(n³) here beside the loop instead of on it; else None.
    """

    job: RefitJob
    factor: list[torch.Tensor]
    v: list[torch.Tensor]
    lengthscale: torch.Tensor
    outputscale: torch.Tensor
    learned_noise: torch.Tensor
    jitter: torch.Tensor
    y_mean: torch.Tensor
    y_scale: torch.Tensor
    failed: list[int]
    seconds: float
    qdiag: list[torch.Tensor] | None = None


@dataclass(frozen=True)
class RefitFit:
    """`fit_job`'s outcome: the job's members' new hyperparameters and standardization.

    Attributes:
        lengthscale: (m, d); outputscale, learned_noise, jitter, y_mean, y_scale: (m,).
        failed: the members (model numbering) whose optimizer did not converge.
        seconds: wall time of the fit.
    """

    lengthscale: torch.Tensor
    outputscale: torch.Tensor
    learned_noise: torch.Tensor
    jitter: torch.Tensor
    y_mean: torch.Tensor
    y_scale: torch.Tensor
    failed: list[int]
    seconds: float


def _buffers_of(job: RefitJob) -> GPBuffers:
    """The job's rows in buffers of their own (m members), unfactored."""
    m, d = len(job.members), job.lengthscale.shape[-1]
    opts = {"dtype": job.lengthscale.dtype, "device": job.lengthscale.device}
    buffers = allocate(m, d, **opts)
    ensure_capacity(buffers, max([*job.rows, 1]))
    for k in range(m):
        put_data(buffers, k, job.z[k], job.y[k])
    return buffers


@torch.no_grad()
def fit_job(job: RefitJob) -> RefitFit:
    """Restandardize the job's members from their data (not those marked `keep`) and fit
    those marked `fit`."""
    started = time.perf_counter()
    buffers = _buffers_of(job)
    y_mean, y_scale = standardization(buffers)
    if job.keep is not None and job.y_mean is not None and job.y_scale is not None:
        for k, keep in enumerate(job.keep):
            if keep:
                y_mean[k], y_scale[k] = job.y_mean[k], job.y_scale[k]
    lengthscale, outputscale = job.lengthscale.clone(), job.outputscale.clone()
    learned_noise, jitter = job.learned_noise.clone(), job.jitter.clone()
    failed: list[int] = []
    for k in range(len(job.members)):
        if not job.fit[k]:
            continue
        n, width = job.rows[k], max(job.dims[k], 1)
        noise = effective_noise(job.known_noise, learned_noise, y_scale)
        known = None if torch.isnan(job.known_noise[k]) else float(noise[k])
        outcome = fit_member(
            buffers.z[k, :n, :width],
            (buffers.y[k, :n] - y_mean[k]) / y_scale[k],
            kernel=job.kernel,
            priors=job.priors,
            known_noise=known,
            lengthscale=lengthscale[k, :width],
            outputscale=float(outputscale[k]),
            learned_noise=float(learned_noise[k]),
        )
        lengthscale[k, :width] = outcome.lengthscale
        outputscale[k] = outcome.outputscale
        learned_noise[k] = outcome.noise
        jitter[k] = 0.0
        if not outcome.converged:
            failed.append(job.members[k])
    return RefitFit(
        lengthscale,
        outputscale,
        learned_noise,
        jitter,
        y_mean,
        y_scale,
        failed,
        time.perf_counter() - started,
    )


@torch.no_grad()
def factorize_job(job: RefitJob, fit: RefitFit) -> RefitResult:
    """Refactorize the job's members under the fitted values (jitter retries raise `jitter`)."""
    started = time.perf_counter()
    buffers = _buffers_of(job)
    jitter = fit.jitter.clone()
    refactorize(
        buffers,
        list(range(len(job.members))),
        kernel=job.kernel,
        lengthscale=fit.lengthscale,
        outputscale=fit.outputscale,
        noise=effective_noise(job.known_noise, fit.learned_noise, fit.y_scale),
        jitter=jitter,  # raised in place where a factor needs it
        y_mean=fit.y_mean,
        y_scale=fit.y_scale,
    )
    rows = job.rows
    factor = [buffers.factor[k, :n, :n].clone() for k, n in enumerate(rows)]
    qdiag = None
    if job.marks is not None:  # diag(L⁻ᵀL⁻¹) = column sums of (L⁻¹)²
        qdiag = [
            torch.linalg.solve_triangular(f, torch.eye(f.shape[0]).to(f), upper=False)
            .square()
            .sum(0)
            for f in factor
        ]
    return RefitResult(
        job=job,
        qdiag=qdiag,
        factor=factor,
        v=[buffers.v[k, :n].clone() for k, n in enumerate(rows)],
        lengthscale=fit.lengthscale,
        outputscale=fit.outputscale,
        learned_noise=fit.learned_noise,
        jitter=jitter,
        y_mean=fit.y_mean,
        y_scale=fit.y_scale,
        failed=fit.failed,
        seconds=fit.seconds + time.perf_counter() - started,
    )


def run_refit(job: RefitJob) -> RefitResult:
    """`fit_job`, then `factorize_job`, in the calling thread."""
    return factorize_job(job, fit_job(job))
