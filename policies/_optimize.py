"""Maximizing an acquisition over a box: BoTorch's multi-start L-BFGS-B, a wall-clock cap, QMC.

`maximize` wraps `botorch.optim.optimize_acqf` (q = 1) around any batched, differentiable
function f: (b, D) -> (b,): `raw_samples` Sobol points are scored, `restarts` of them are chosen
by BoTorch's Boltzmann rule (plus caller-given starting points such as warm starts), and all
restarts run as one batched L-BFGS-B problem (SLSQP when a linear budget constraint is present),
stopped by `timeout_sec`. BoTorch's own RNG use is confined to a forked, seeded RNG, so a
proposal is reproducible from the policy's generator and the global RNG is untouched.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from botorch.acquisition import AcquisitionFunction
from botorch.exceptions.errors import OptimizationGradientError
from botorch.exceptions.warnings import OptimizationWarning
from botorch.optim import optimize_acqf
from botorch.optim.initializers import initialize_q_batch

Objective = Callable[[torch.Tensor], torch.Tensor]


class Deadline:
    """A wall-clock cap shared by the steps of one proposal."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()
        self.end = self.start + seconds

    def remaining(self) -> float:
        return max(self.end - time.monotonic(), 0.0)

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def share(self, parts_left: int) -> float:
        """A fair slice of what remains for the next of `parts_left` parts."""
        return self.remaining() / max(parts_left, 1)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def cap(self) -> float:
        """The cap in force: `seconds` plus what `exclude` kept out."""
        return self.end - self.start

    def exclude(self, seconds: float) -> None:
        """Keep `seconds` already spent out of the cap (model upkeep such as a field model's
        fit: it is not the search the cap bounds); `elapsed` still counts them."""
        self.end += max(seconds, 0.0)


def seed_from(generator: torch.Generator) -> int:
    """A fresh integer seed drawn from the policy's generator."""
    return int(torch.randint(2**31 - 1, (1,), generator=generator))


def sobol_normals(
    count: int, dim: int, seed: int, *, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """(count, dim) scrambled-Sobol standard normals (fixed base samples for QMC averages)."""
    if dim == 0:
        return torch.zeros(count, 0, dtype=dtype, device=device)
    engine = torch.quasirandom.SobolEngine(dim, scramble=True, seed=seed)
    u = engine.draw(count, dtype=torch.float64).clamp(1e-10, 1 - 1e-10)
    return torch.special.ndtri(u).to(dtype=dtype, device=device)


class _FunctionAcquisition(AcquisitionFunction):
    """Lets `optimize_acqf` drive a plain function of (b, D) points (q = 1)."""

    def __init__(self, fn: Objective) -> None:
        torch.nn.Module.__init__(self)
        self._fn = fn

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        lead = X.shape[:-2]
        flat = X.reshape(-1, X.shape[-1])
        return self._fn(flat).reshape(lead)


@dataclass
class BoxResult:
    """The best point found and what it cost to find it.

    Attributes:
        x: (D,) best point.
        value: f(x).
        timed_out: the optimizer was stopped by its time limit.
        seconds: wall-clock time spent.
    """

    x: torch.Tensor
    value: float
    timed_out: bool
    seconds: float


def maximize(
    fn: Objective,
    lower: torch.Tensor,
    upper: torch.Tensor,
    *,
    restarts: int,
    raw_samples: int,
    maxiter: int,
    timeout: float,
    seed: int,
    initial: torch.Tensor | None = None,
    inequality_constraints: list[tuple[torch.Tensor, torch.Tensor, float]] | None = None,
    project: Callable[[torch.Tensor], torch.Tensor] | None = None,
    raw_fn: Objective | None = None,
    chunk: int = 256,
) -> BoxResult:
    """Maximize f over the box [lower, upper] (D dims) from multiple starts, within `timeout`.

    The raw phase is done here (so the time cap covers it): `raw_samples` scrambled-Sobol points
    (made feasible by `project`) are scored in chunks until they are done or half the time is
    spent; BoTorch's Boltzmann rule (`initialize_q_batch`) picks `restarts` of them, `initial`
    points are added, and `optimize_acqf` runs the gradient phase with the remaining time as
    its `timeout_sec`. The best point seen (raw or optimized) is returned.

    Args:
        fn: (b, D) -> (b,), differentiable, independent across the batch.
        restarts: L-BFGS-B starts chosen from the raw samples (in addition to `initial`).
        raw_samples: Sobol points scored to choose the starts.
        maxiter: L-BFGS-B iteration cap.
        timeout: seconds for the whole call; the best point so far is returned when it runs out.
        seed: seeds the raw samples and BoTorch's random choices.
        initial: (k, D) extra starting points (must satisfy the constraints).
        inequality_constraints: BoTorch's (indices, coefficients, rhs) with Σ c·x[i] ≥ rhs.
        project: maps (n, D) box points into the feasible set (for the raw samples).
        raw_fn: a cheaper stand-in for f to rank the raw samples (default f).
        chunk: raw samples scored per call.
    """
    started = time.monotonic()
    dim = lower.shape[-1]
    if dim == 0:
        with torch.no_grad():
            value = fn(lower.new_zeros(1, 0))
        return BoxResult(lower.new_zeros(0), float(value[0]), False, time.monotonic() - started)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        warnings.simplefilter("ignore", OptimizationWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        starts, best_raw, cut = raw_starts(
            raw_fn or fn, lower, upper, raw_samples, restarts, timeout / 2, seed, project, chunk
        )
        candidates = best_raw.unsqueeze(0)
        if initial is not None and len(initial):
            extra = torch.minimum(torch.maximum(initial.to(lower), lower), upper)
            candidates = torch.cat([candidates, extra])
            starts = torch.cat([starts, extra])
        with torch.no_grad():  # the best starting point under f itself
            values = fn(candidates)
        best_v, best_x = float(values.max()), candidates[int(values.argmax())]
        remaining = timeout - (time.monotonic() - started)
        if remaining <= 0:
            return BoxResult(best_x, best_v, True, time.monotonic() - started)
        if not depends_on_input(fn, starts[:1]):
            # flat (a model with no data yet): every point scores the same, no gradient to follow
            return BoxResult(best_x, best_v, cut, time.monotonic() - started)
        try:
            x, value = optimize_acqf(
                _FunctionAcquisition(fn),
                bounds=torch.stack([lower, upper]),
                q=1,
                num_restarts=len(starts),
                raw_samples=None,
                options={"maxiter": maxiter, "batch_limit": len(starts)},
                inequality_constraints=inequality_constraints,
                batch_initial_conditions=starts.unsqueeze(-2),
                timeout_sec=remaining,
                retry_on_optimization_warning=False,
            )
        except OptimizationGradientError:
            # NaN gradients at a start (seen: EICBO on noiseless nodes, found by
            # tests/test_policies_properties.py): the climb cannot run; the best scored start
            # is the answer rather than no proposal at all
            return BoxResult(best_x, best_v, cut, time.monotonic() - started)
    seconds = time.monotonic() - started
    value = float(value.reshape(-1)[0])
    if math.isfinite(value) and value >= best_v:
        best_x, best_v = x.reshape(dim).detach(), value
    return BoxResult(best_x, best_v, cut or seconds >= timeout, seconds)


def depends_on_input(fn: Objective, x: torch.Tensor) -> bool:
    """Whether f at the (k, D) points `x` has a gradient with respect to them.

    A posterior with no observations is the prior everywhere: its mean and variance, and so
    every acquisition built from them, are constant in x and carry no autograd graph. A gradient
    optimizer would fail on them ("element 0 of tensors does not require grad").
    """
    probe = x.detach().clone().requires_grad_(True)
    return bool(fn(probe).requires_grad)


def raw_starts(
    fn: Objective,
    lower: torch.Tensor,
    upper: torch.Tensor,
    raw_samples: int,
    restarts: int,
    timeout: float,
    seed: int,
    project: Callable[[torch.Tensor], torch.Tensor] | None,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Score Sobol points (in chunks, within `timeout`); Boltzmann-pick `restarts` starts.

    Returns:
        starts (restarts, D) — always including the best raw point —, the best raw point (D,),
        and whether the time limit cut the scoring short.
    """
    started = time.monotonic()
    engine = torch.quasirandom.SobolEngine(lower.shape[-1], scramble=True, seed=seed)
    raw = engine.draw(max(raw_samples, restarts), dtype=torch.float64).to(lower)
    raw = lower + (upper - lower) * raw
    if project is not None:
        raw = project(raw)
    values, cut = [], False
    with torch.no_grad():
        for part in raw.split(chunk):
            if values and time.monotonic() - started > timeout:
                cut = True
                break
            values.append(fn(part))
    scores = torch.cat(values)
    raw = raw[: len(scores)]
    scores = torch.where(torch.isfinite(scores), scores, torch.finfo(scores.dtype).min)
    best = int(scores.argmax())
    count = min(restarts, len(raw))
    if count == len(raw) or float(scores.std()) == 0.0:
        starts = raw[torch.randperm(len(raw))[:count]]
    else:
        starts, _ = initialize_q_batch(raw.unsqueeze(-2), scores, n=count)
        starts = starts.squeeze(-2)
    if not (starts == raw[best]).all(-1).any():  # always start from the best raw point too
        starts = torch.cat([raw[best : best + 1], starts[: count - 1]])
    return starts, raw[best], cut


class Adam:
    """torch.optim.Adam's update (no weight decay, no AMSGrad), without torch.optim.

    torch.optim's `Optimizer` imports torch._dynamo the first time one is built (1.3–2 s on
    this machine: the first MCBO decision of a process paid it) and dispatches each step
    through hooks and wrappers (≈ 2.5 ms a step, a fifth of a one-thread η-net step at tens of
    observations). This is the arithmetic of its single-tensor path (the one it takes for CPU
    tensors) in the same order, so the iterates are bitwise torch's there
    (tests/test_mcbo_speed.py); on CUDA torch takes its multi-tensor path, which rounds
    differently in the last bits.

    Args:
        params: leaf tensors with requires_grad; updated in place from their `.grad`.
        lr: step size; betas, eps: as torch's (defaults the same).
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = [0] * len(self.params)  # per tensor, as torch's (one without grad waits)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            grad = p.grad
            self.steps[i] += 1
            step = float(self.steps[i])
            self.exp_avg[i].lerp_(grad, 1 - beta1)
            self.exp_avg_sq[i].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step_size = self.lr / (1 - beta1**step)
            denom = (self.exp_avg_sq[i].sqrt() / (1 - beta2**step) ** 0.5).add_(self.eps)
            p.addcdiv_(self.exp_avg[i], denom, value=-step_size)


def ascend(
    fn: Objective,
    x0: torch.Tensor,
    lower: torch.Tensor,
    upper: torch.Tensor,
    *,
    steps: int,
    lr: float,
    deadline: Deadline | None = None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Projected Adam ascent of a separable batched function from many starts at once.

    Args:
        fn: (b, D) -> (b,), each row independent (the sum is ascended).
        x0: (b, D) starts; lower/upper: (D,) or (b, D) bounds.

    Returns:
        best point per row (b, D), its value (b,), and whether the deadline cut the run short.
    """
    x = torch.maximum(torch.minimum(x0.detach(), upper), lower).clone().requires_grad_(True)
    optimizer = Adam([x], lr=lr)  # not torch.optim's: see `Adam`
    best_x = x.detach().clone()
    best_v = torch.full(x.shape[:1], -math.inf, dtype=x.dtype, device=x.device)
    timed_out = False
    for _ in range(steps):
        if deadline is not None and deadline.expired():
            timed_out = True
            break
        optimizer.zero_grad()
        value = fn(x)
        with torch.no_grad():  # the value at x before the step: keep the best seen
            better = value.detach() > best_v
            best_x[better] = x.detach()[better]
            best_v = torch.where(better, value.detach(), best_v)
        if not value.requires_grad:  # flat in x (no data yet): nowhere to climb
            break
        (-value.sum()).backward()
        optimizer.step()
        with torch.no_grad():
            x.copy_(torch.maximum(torch.minimum(x, upper), lower))
    with torch.no_grad():
        value = fn(x)
        better = value > best_v
        best_x[better] = x.detach()[better]
        best_v = torch.where(better, value, best_v)
    return best_x, best_v, timed_out


@dataclass
class JointResult:
    """The best point of each of K boxes searched together.

    Attributes:
        x: (K, D) best point per box.
        value: (K,) f there.
        timed_out: the optimizer was stopped by its time limit (or the raw phase was cut).
        seconds: wall-clock time spent.
        restarts: L-BFGS-B starts run (all boxes together).
    """

    x: torch.Tensor
    value: torch.Tensor
    timed_out: bool
    seconds: float
    restarts: int


def maximize_joint(
    fn: Objective,
    lower: torch.Tensor,
    upper: torch.Tensor,
    *,
    restarts: int,
    raw_per_box: int,
    maxiter: int,
    timeout: float,
    seed: int,
    initial: list[torch.Tensor | None] | None = None,
    chunk: int = 1024,
) -> JointResult:
    """Maximize one f over each of K boxes of the same space, all in one batched search.

    The boxes are the regions of one proposal written in a common coordinate system (a soft
    intervention's full action vector: the actions outside a region's support are boxes of
    width 0), so one call of f scores points of every region, and one L-BFGS-B run — BoTorch's
    `gen_candidates_scipy`, with per-start bounds — climbs from starts in all of them at once.
    Against one `maximize` per region this pays the fixed cost of an acquisition call (torch's
    per-operation overhead, a rollout through every node) once per step instead of K times.

    Starts: `raw_per_box` scrambled-Sobol points per box are scored (one batched call per
    `chunk`); each box's best raw point and its `initial` points (warm starts) start a climb,
    and BoTorch's Boltzmann rule picks `restarts` more among all raw points, so the boxes whose
    raw points score high get more of the climbs.

    Args:
        fn: (b, D) -> (b,), differentiable, independent across the batch.
        lower, upper: (K, D) the boxes.
        restarts: starts picked by the Boltzmann rule across all boxes (besides the per-box ones).
        raw_per_box: Sobol points scored per box.
        maxiter: L-BFGS-B iteration cap.
        timeout: seconds for the whole call (the raw phase may use half).
        seed: seeds the Sobol points and BoTorch's random choices.
        initial: per box, (k, D) extra starts inside the box, or None.
        chunk: points per call of f in the raw phase.
    """
    from botorch.generation.gen import gen_candidates_scipy

    started = time.monotonic()
    boxes, dim = lower.shape
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        warnings.simplefilter("ignore", OptimizationWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        engine = torch.quasirandom.SobolEngine(dim, scramble=True, seed=seed)
        u = engine.draw(raw_per_box, dtype=torch.float64).to(lower)  # (m, D), shared by boxes
        raw = lower.unsqueeze(1) + (upper - lower).unsqueeze(1) * u  # (K, m, D)
        owner = torch.arange(boxes, device=lower.device).repeat_interleave(raw_per_box)
        raw = raw.reshape(-1, dim)
        scores, cut = [], False
        with torch.no_grad():
            for part in raw.split(chunk):
                if scores and time.monotonic() - started > timeout / 2:
                    cut = True
                    break
                scores.append(fn(part))
        score = torch.cat(scores)
        score = torch.where(torch.isfinite(score), score, torch.finfo(score.dtype).min)
        raw, owner = raw[: len(score)], owner[: len(score)]
        # every box's best raw point (boxes the cut left unscored start from their lower corner)
        best_x = lower.clone()
        best_v = torch.full((boxes,), -math.inf, dtype=lower.dtype, device=lower.device)
        best_v = best_v.scatter_reduce(0, owner, score, "amax")
        for k in range(boxes):
            mine = (owner == k).nonzero().flatten()
            if len(mine):
                best_x[k] = raw[mine[int(score[mine].argmax())]]
        starts, start_owner = [best_x], [torch.arange(boxes, device=lower.device)]
        if restarts > 0 and len(raw) > restarts and float(score.std()) > 0.0:
            picked, _ = initialize_q_batch(raw.unsqueeze(-2), score, n=restarts)
            picked = picked.squeeze(-2)
            # the owner of each picked point: the raw row it equals
            match = (picked.unsqueeze(1) == raw.unsqueeze(0)).all(-1).float().argmax(-1)
            starts.append(picked)
            start_owner.append(owner[match])
        for k, extra in enumerate(initial or []):
            if extra is not None and len(extra):
                extra = torch.minimum(torch.maximum(extra.to(lower), lower[k]), upper[k])
                starts.append(extra)
                start_owner.append(torch.full((len(extra),), k, device=lower.device))
        x0, who = torch.cat(starts), torch.cat(start_owner)
        with torch.no_grad():
            v0 = fn(x0)
        v0 = torch.where(torch.isfinite(v0), v0, -math.inf)
        best_v, best_x = _per_box_best(best_v, best_x, v0, x0, who)
        remaining = timeout - (time.monotonic() - started)
        if remaining <= 0 or not depends_on_input(fn, x0[:1]):
            return JointResult(best_x, best_v, cut or remaining <= 0, _since(started), 0)
        try:
            x, values = gen_candidates_scipy(
                x0.unsqueeze(-2),
                _FunctionAcquisition(fn),
                lower_bounds=lower[who].unsqueeze(-2),
                upper_bounds=upper[who].unsqueeze(-2),
                options={"maxiter": maxiter},
                timeout_sec=remaining,
            )
        except OptimizationGradientError:  # NaN gradients: as in `maximize`, the best start
            return JointResult(best_x, best_v, cut, _since(started), len(x0))
    x = torch.minimum(torch.maximum(x.reshape(-1, dim).detach(), lower[who]), upper[who])
    values = torch.where(torch.isfinite(values.detach()), values.detach(), -math.inf)
    best_v, best_x = _per_box_best(best_v, best_x, values.reshape(-1), x, who)
    seconds = _since(started)
    return JointResult(best_x, best_v, cut or seconds >= timeout, seconds, len(x0))


def _per_box_best(
    best_v: torch.Tensor,
    best_x: torch.Tensor,
    values: torch.Tensor,
    points: torch.Tensor,
    owner: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(K,), (K, D) best so far, updated with (n,) values at (n, D) points owned by box owner."""
    best_v, best_x = best_v.clone(), best_x.clone()
    for i in range(len(values)):
        k = int(owner[i])
        if float(values[i]) > float(best_v[k]):
            best_v[k], best_x[k] = values[i], points[i]
    return best_v, best_x


def _since(started: float) -> float:
    return time.monotonic() - started
