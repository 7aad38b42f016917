"""The search every acquisition policy shares: regions, budgets, cost-awareness, the time cap.

A policy supplies a `Problem` — its acquisition for one proposal — and `SearchPolicy.propose`
does the rest:

1. Finite `candidates` (soft specs): the admissible ones are scored in one batched call and the
   best is returned.
2. Otherwise `policies._supports.admissible_regions` lists the supports/target sets that fit
   the cardinality limit and the round cap, each with its box and linear budget. When there are
   more than `max_regions`, each is screened with `screen_samples` random feasible points (one
   batched acquisition call per target set) and only the `max_regions` best are optimized.
3. When the policy can score points of every region in one call (`Problem.joint_evaluator`:
   MCBO with a constant η, whose soft regions share one rollout), all regions are searched
   together: one raw phase over every region's box, one batched L-BFGS-B from starts in all of
   them (each region's best raw point, its warm starts, and `restarts` more picked across all
   regions), capped at `joint_maxiter` iterations (`SearchPolicy._search_joint`). A call of the
   acquisition costs nearly the same for 1 point as for 200 (torch's per-operation overhead
   through every node), so this costs about what one region searched alone did.
   Otherwise each region is optimized (`Problem.solve`, by default BoTorch's multi-start
   L-BFGS-B) with a fair share of the remaining wall-clock budget `max_seconds`; the best region
   wins. When the cap runs out, the remaining regions are skipped, and
   `diagnostics["timed_out"]` says so.
4. The winner is made feasible (clamped to its box, pulled inside the budget), soft values within
   1e-9 of the span from 0 are snapped to 0 (they would pay an action's fixed cost for nothing),
   and its exact cost is computed with `policies.base.intervention_cost`.

Cost-aware mode (`cost_aware: true`, paper 001's rule, its Eq. 7: value of information per unit
cost, ν/(q·τ)): the search maximizes improvement per unit cost,

    score(a) = max(α(a) − α₀, 0) / max(cost(a), cost_floor),

where α is the policy's acquisition and α₀ its baseline: 0 for EI-FN (EI already measures an
improvement), and for MCBO / GP-UCB the incumbent, the best β = 0 (posterior-mean) value among the
interventions already run — so the numerator is an optimistic improvement, as KG's is an
expected one. cost(a) is the region's fixed cost plus per-unit costs (for soft interventions an
upper bound: a value that ends at 0 pays nothing). When no point improves on the baseline (every
score 0), the search falls back to the plain acquisition, like BESD's exploitation fallback.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import Field

from core.network import NetworkModel
from core.spec import ExperimentSpec
from core.threads import this_thread_only
from policies._optimize import Deadline, maximize, maximize_joint, seed_from
from policies._supports import Region, admissible_candidates, admissible_regions
from policies.base import (
    Constraints,
    NothingAffordable,
    Policy,
    PolicySettings,
    Proposal,
    intervention_cost,
)

Scorer = Callable[[Region, torch.Tensor, torch.Tensor], torch.Tensor]
_SNAP = 1e-9


class SearchSettings(PolicySettings):
    """Settings every acquisition policy shares.

    Attributes:
        max_seconds: wall-clock cap of one proposal; the best point found so far is returned
            when it runs out (diagnostics["timed_out"]). A field model's fit that the proposal
            had to run first (the service normally fits fields beside the loop) is not counted
            (diagnostics["field_fit_seconds"], the cap in force in diagnostics["cap_seconds"]).
        restarts: L-BFGS-B starts per region (chosen from the raw samples by BoTorch).
        raw_samples: Sobol points scored per region to choose the starts.
        maxiter: L-BFGS-B iteration cap per region.
        cost_aware: maximize improvement per unit cost instead of the acquisition.
        cost_floor: smallest cost divided by in cost-aware mode; None: the cheapest positive
            `cost` among the actions (1 if all are free). A round is never free — it uses an
            opportunity to act — so a free option (an observational round, a zero action) is
            scored as if it cost as much as the cheapest paid action, instead of dominating
            everything with any positive improvement.
        max_regions: at most this many supports/target sets are optimized one by one; more are
            screened (regions searched together are all searched).
        max_enumerate: cap on the soft supports listed (see `policies._supports`).
        screen_samples: random points per region when screening.
        warm_starts: best solutions remembered per region and reused as starts next round.
        joint_maxiter: L-BFGS-B iteration cap when all regions are searched together (see
            `SearchPolicy._search_joint`): one acquisition call then serves every region, so the
            time of a proposal is about this many calls, warm starts carry last round's optima
            and the raw phase spreads the starts over the regions.
        region_threads: regions solved at once, in threads, where the problem allows it
            (`Problem.solves_in_threads`: MCBO's η-net training); 1 solves them one by one.
    """

    max_seconds: float = Field(default=10.0, gt=0)
    restarts: int = Field(default=8, ge=1)
    raw_samples: int = Field(default=256, ge=1)
    maxiter: int = Field(default=100, ge=1)
    cost_aware: bool = False
    cost_floor: float | None = Field(default=None, gt=0)
    max_regions: int = Field(default=16, ge=1)
    max_enumerate: int = Field(default=4096, ge=1)
    screen_samples: int = Field(default=32, ge=1)
    warm_starts: int = Field(default=2, ge=0)
    joint_maxiter: int = Field(default=30, ge=1)
    region_threads: int = Field(default=2, ge=1)


@dataclass
class Solution:
    """The best point of one region.

    Attributes:
        values: (F,) the action values.
        score: what was maximized (the acquisition, or improvement per cost).
        acquisition: the plain acquisition value there.
        timed_out: the region's optimizer hit its time limit.
        memory: what to remember for a warm start next round (policy-specific).
    """

    values: torch.Tensor
    score: float
    acquisition: float
    timed_out: bool = False
    memory: Any = None
    info: dict[str, Any] = field(default_factory=dict)


def plain_scorer(region: Region, acquisition: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return acquisition


def ratio_scorer(baseline: float, floor: float) -> Scorer:
    """Improvement over `baseline` per unit cost (see the module docstring)."""

    def score(region: Region, acquisition: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return (acquisition - baseline).clamp_min(0.0) / region.cost(values).clamp_min(floor)

    return score


class Problem(ABC):
    """A policy's acquisition for one proposal.

    `evaluate` scores points x = [free action values (F); extra variables (E)] of a region,
    batched over rows and differentiable; extra variables (MCBO's η) have `extra_bounds`.
    """

    def __init__(self, policy: SearchPolicy, model: NetworkModel, seed: int) -> None:
        self.policy = policy
        self.settings = policy.settings
        self.model = model
        self.seed = seed
        self.dtype, self.device = model.dtype, model.device

    def extra_bounds(self, region: Region) -> tuple[torch.Tensor, torch.Tensor]:
        empty = torch.zeros(0, dtype=self.dtype, device=self.device)
        return empty, empty

    @abstractmethod
    def evaluate(self, region: Region, x: torch.Tensor) -> torch.Tensor:
        """(b, F + E) -> (b,) acquisition values."""

    @abstractmethod
    def evaluate_candidates(self, actions: torch.Tensor) -> torch.Tensor:
        """(N, A) full soft action vectors -> (N,) acquisition values."""

    baseline_is_zero: bool = False  # the acquisition is itself an improvement (EI): α₀ = 0
    # Seconds the problem's construction spent on model upkeep (fitting a field model that had
    # never been fitted, or was due and not fitted beside the decision): kept out of the cap.
    upkeep_seconds: float = 0.0

    def mean_value(self, actions: torch.Tensor, set_actions: tuple[str, ...]) -> torch.Tensor:
        """(N, A) -> (N,) the β = 0 (posterior-mean) value, for the cost-aware baseline α₀."""
        raise NotImplementedError(f"{type(self).__name__} has no posterior-mean value")

    def evaluate_raw(self, region: Region, x: torch.Tensor) -> torch.Tensor:
        """A cheaper stand-in for `evaluate` that only ranks raw samples (default: evaluate)."""
        return self.evaluate(region, x)

    def solves_in_threads(self, region: Region) -> bool:
        """Whether `solve` of this region may run in a thread beside another region's (pure
        torch, no state shared between regions; default no: BoTorch's L-BFGS-B goes through
        scipy)."""
        return False

    def initial_points(self, region: Region, timeout: float) -> torch.Tensor | None:
        """(k, F + E) extra L-BFGS-B starts (e.g. EI-FN's posterior-mean maximizer)."""
        return None

    def diagnostics(self) -> dict[str, Any]:
        return {}

    def joint_evaluator(
        self, set_actions: tuple[str, ...]
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """f: (b, A + E) -> (b,), the acquisition at full action vectors [A] and the extra
        variables [E] of every region with these `set_actions`, or None when the policy cannot
        score the regions' points together (then each region is searched on its own)."""
        return None

    def solve(
        self, region: Region, scorer: Scorer, deadline: Deadline, timeout: float, seed: int
    ) -> Solution:
        """Maximize scorer(acquisition) over the region with BoTorch's optimize_acqf."""
        lo_extra, hi_extra = self.extra_bounds(region)
        lower = torch.cat([region.lower.to(self.dtype), lo_extra])
        upper = torch.cat([region.upper.to(self.dtype), hi_extra])
        dim = region.dim

        def objective(x: torch.Tensor) -> torch.Tensor:
            return scorer(region, self.evaluate(region, x), x[:, :dim])

        started = time.monotonic()
        starts = [self.initial_points(region, timeout / 5)]
        recalled = self.policy.recall(region)
        starts += [torch.atleast_2d(x) for x in recalled if isinstance(x, torch.Tensor)]
        starts = [s for s in starts if s is not None and s.shape[-1] == len(lower)]
        initial = self._admissible_starts(region, torch.cat(starts)) if starts else None
        settings = self.settings
        result = maximize(
            objective,
            lower,
            upper,
            restarts=settings.restarts,
            raw_samples=settings.raw_samples,
            maxiter=settings.maxiter,
            timeout=max(timeout - (time.monotonic() - started), 1e-3),
            seed=seed,
            initial=initial,
            inequality_constraints=region.inequality_constraints(),
            project=lambda x: torch.cat([region.feasible(x[:, :dim]), x[:, dim:]], dim=-1),
            raw_fn=lambda x: scorer(region, self.evaluate_raw(region, x), x[:, :dim]),
        )
        x = result.x.unsqueeze(0).clone()
        x[:, :dim] = region.feasible(x[:, :dim])
        with torch.no_grad():
            acquisition = self.evaluate(region, x)
            score = scorer(region, acquisition, x[:, :dim])
        return Solution(x[0, :dim], float(score[0]), float(acquisition[0]), result.timed_out, x[0])

    @staticmethod
    def _admissible_starts(region: Region, starts: torch.Tensor) -> torch.Tensor | None:
        """Keep the starts that satisfy the region's budget (BoTorch requires feasible starts)."""
        dim = region.dim
        starts = starts.clone()
        starts[:, :dim] = torch.maximum(torch.minimum(starts[:, :dim], region.upper), region.lower)
        if region.binding:
            keep = region.cost(starts[:, :dim]) <= region.cap - 1e-9
            starts = starts[keep]
        return starts if len(starts) else None


class SearchPolicy(Policy):
    """A policy that maximizes an acquisition over the admissible regions (module docstring)."""

    Settings = SearchSettings
    reads_model = True

    def __init__(self, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(spec, settings)
        self._memory: dict[tuple, deque] = {}

    @abstractmethod
    def problem(self, model: NetworkModel, seed: int, deadline: Deadline) -> Problem:
        """The acquisition for this proposal."""

    # ------------------------------------------------------------------ warm starts
    def recall(self, region: Region) -> list[Any]:
        return list(self._memory.get(region.key, ()))

    def remember(self, region: Region, memory: Any) -> None:
        if memory is None or self.settings.warm_starts == 0:
            return
        slot = self._memory.setdefault(region.key, deque(maxlen=self.settings.warm_starts))
        slot.appendleft(memory)

    # ------------------------------------------------------------------ proposal
    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        deadline = Deadline(self.settings.max_seconds)
        problem = self.problem(model, seed_from(rng), deadline)
        # `max_seconds` caps the search, not the model's upkeep: a field fit the problem had to
        # run (the service normally runs it beside the decision, `NetworkModel.prepare_fields`)
        # would otherwise eat the whole cap and leave the search one restart (issue 15)
        deadline.exclude(problem.upkeep_seconds)
        if self.spec.candidates is not None:
            return self._propose_candidate(model, constraints, problem, deadline)
        regions = admissible_regions(
            model, constraints, max_enumerate=self.settings.max_enumerate, generator=rng
        )
        diagnostics: dict[str, Any] = {"policy": self.name, "regions": len(regions)}
        scorer: Scorer = plain_scorer
        if self.settings.cost_aware:
            baseline = 0.0 if problem.baseline_is_zero else self._baseline(model, problem)
            scorer = ratio_scorer(baseline, self._cost_floor())
            diagnostics["cost_baseline"] = baseline
        joint = self._joint(problem, regions, scorer) is not None
        if len(regions) > self.settings.max_regions and not joint:
            # searched one by one, each region costs a whole optimization: only the best few
            regions = self._screen(problem, regions, rng)
            diagnostics["screened_to"] = len(regions)
        diagnostics["joint"] = joint
        best, solved, timed_out = self._search(problem, regions, scorer, deadline, rng)
        if self.settings.cost_aware and best[1].score <= 0.0:
            diagnostics["cost_aware_fallback"] = True
            best, more, late = self._search(problem, regions, plain_scorer, deadline, rng)
            solved, timed_out = solved + more, timed_out or late
        region, solution = best
        diagnostics.update(
            problem.diagnostics(),
            **solution.info,
            regions_optimized=solved,
            timed_out=timed_out,
            acquisition=solution.acquisition,
            seconds=deadline.elapsed(),
            cap_seconds=deadline.cap,
        )
        return self._proposal(region, solution, constraints, diagnostics)

    def _search(
        self,
        problem: Problem,
        regions: list[Region],
        scorer: Scorer,
        deadline: Deadline,
        rng: torch.Generator,
    ) -> tuple[tuple[Region, Solution], int, bool]:
        joint = self._joint(problem, regions, scorer)
        if joint is not None:
            return self._search_joint(problem, regions, joint, deadline, rng)
        threads = min(self.settings.region_threads, len(regions))
        if threads > 1 and all(problem.solves_in_threads(region) for region in regions):
            return self._search_threads(problem, regions, scorer, deadline, rng, threads)
        best: tuple[Region, Solution] | None = None
        timed_out = False
        solved = 0
        for i, region in enumerate(regions):
            if best is not None and deadline.expired():
                timed_out = True
                break
            timeout = deadline.share(len(regions) - i)
            solution = problem.solve(region, scorer, deadline, timeout, seed_from(rng))
            solved += 1
            timed_out |= solution.timed_out
            self.remember(region, solution.memory)
            if best is None or solution.score > best[1].score:
                best = (region, solution)
        assert best is not None
        return best, solved, timed_out

    def _search_threads(
        self,
        problem: Problem,
        regions: list[Region],
        scorer: Scorer,
        deadline: Deadline,
        rng: torch.Generator,
        threads: int,
    ) -> tuple[tuple[Region, Solution], int, bool]:
        """The regions solved `threads` at a time, in threads of their own.

        For solves that are many small torch operations (MCBO's η-net training at tens of
        observations: a step's tensors are a few thousand elements, so its time is per-operation
        overhead, much of it outside the interpreter lock — measured on psagraph: 4× fewer rows
        per step saved a fifth of the time), two regions at once use the second core that
        torch's own thread pool leaves idle at these sizes. Each region gets the seed and the
        remembered starts the sequential search would give it, and the results are compared in
        the same order, so the proposal does not depend on which thread finishes first.
        """
        seeds = [seed_from(rng) for _ in regions]
        timeout = deadline.remaining() * threads / len(regions)

        def solve(region: Region, seed: int) -> Solution:
            # the threads are the parallelism: no pool under them — in these threads only
            # (`torch.set_num_threads` would hand 1 to any thread that starts meanwhile)
            with this_thread_only(1):
                return problem.solve(region, scorer, deadline, timeout, seed)

        with ThreadPoolExecutor(threads, thread_name_prefix="region") as pool:
            solutions = list(pool.map(solve, regions, seeds))
        best: tuple[Region, Solution] | None = None
        for region, solution in zip(regions, solutions, strict=True):
            self.remember(region, solution.memory)
            if best is None or solution.score > best[1].score:
                best = (region, solution)
        assert best is not None
        return best, len(regions), any(s.timed_out for s in solutions)

    def _joint(
        self, problem: Problem, regions: list[Region], scorer: Scorer
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The joint evaluator when the regions can be searched together: more than one, the
        same set nodes (every soft region), no budget that binds (the box is the region) and the
        plain acquisition (cost-aware scores divide by a per-region cost)."""
        if len(regions) < 2 or scorer is not plain_scorer:
            return None
        if len({r.set_actions for r in regions}) != 1 or any(r.binding for r in regions):
            return None
        return problem.joint_evaluator(regions[0].set_actions)

    def _search_joint(
        self,
        problem: Problem,
        regions: list[Region],
        evaluate: Callable[[torch.Tensor], torch.Tensor],
        deadline: Deadline,
        rng: torch.Generator,
    ) -> tuple[tuple[Region, Solution], int, bool]:
        """Every region in one batched search (`policies._optimize.maximize_joint`).

        A region's points are full action vectors whose columns outside its support are held
        at 0 (a box of width 0), followed by the extra variables; its warm starts, remembered
        in its own coordinates [F; E], are written into the same space.
        """
        settings = self.settings
        actions = regions[0].num_actions
        lo_extra, hi_extra = problem.extra_bounds(regions[0])
        lower, upper, initial = [], [], []
        for region in regions:
            columns = region.columns.to(problem.device)
            low = torch.zeros(actions, dtype=problem.dtype, device=problem.device)
            high = low.clone()
            low[columns], high[columns] = region.lower.to(low), region.upper.to(low)
            lower.append(torch.cat([low, lo_extra]))
            upper.append(torch.cat([high, hi_extra]))
            recalled = [m for m in self.recall(region) if isinstance(m, torch.Tensor)]
            starts = None
            if recalled:
                mine = torch.stack([m.to(low) for m in recalled])  # (k, F + E)
                starts = torch.zeros(len(mine), actions + len(lo_extra)).to(low)
                starts[:, columns] = mine[:, : region.dim]
                starts[:, actions:] = mine[:, region.dim :]
            initial.append(starts)
        result = maximize_joint(
            evaluate,
            torch.stack(lower),
            torch.stack(upper),
            restarts=settings.restarts,
            raw_per_box=max(settings.raw_samples, settings.restarts),
            maxiter=settings.joint_maxiter,
            timeout=max(deadline.remaining(), 1e-3),
            seed=seed_from(rng),
            initial=initial,
        )
        best: tuple[Region, Solution] | None = None
        for k, region in enumerate(regions):
            x = result.x[k]
            values = x[region.columns.to(x.device)]
            value = float(result.value[k])
            memory = torch.cat([values, x[actions:]])
            solution = Solution(values, value, value, result.timed_out, memory)
            solution.info.update(joint_restarts=result.restarts)
            self.remember(region, memory)
            if best is None or solution.score > best[1].score:
                best = (region, solution)
        assert best is not None
        return best, len(regions), result.timed_out

    def _screen(
        self, problem: Problem, regions: list[Region], rng: torch.Generator
    ) -> list[Region]:
        """Keep the `max_regions` regions whose best random point scores highest."""
        k = self.settings.screen_samples
        scores = []
        with torch.no_grad():
            for region in regions:
                values = region.sample(k, rng)
                lo, hi = problem.extra_bounds(region)
                u = torch.rand(k, lo.shape[0], generator=rng, dtype=lo.dtype).to(lo.device)
                x = torch.cat([values, lo + (hi - lo) * u], dim=-1)
                scores.append(float(problem.evaluate(region, x).max()))
        order = sorted(range(len(regions)), key=lambda i: -scores[i])
        return [regions[i] for i in order[: self.settings.max_regions]]

    def _baseline(self, model: NetworkModel, problem: Problem) -> float:
        """The best β = 0 value among past interventions (0 without history)."""
        groups: dict[tuple[str, ...], list[torch.Tensor]] = {}
        hard = self.spec.intervention == "hard"
        for record in model.history:
            key = tuple(record.intervention) if hard else ()
            groups.setdefault(key, []).append(model.action_vector(record.intervention))
        best = -math.inf
        with torch.no_grad():
            for key, rows in groups.items():
                best = max(best, float(problem.mean_value(torch.stack(rows), key).max()))
        return best if math.isfinite(best) else 0.0

    def _proposal(
        self,
        region: Region,
        solution: Solution,
        constraints: Constraints,
        diagnostics: dict[str, Any],
    ) -> Proposal:
        values = region.feasible(solution.values.unsqueeze(0))[0]
        if not region.hard:
            span = region.upper - region.lower
            near_zero = values.abs() <= _SNAP * span
            can_zero = (region.lower <= 0) & (region.upper >= 0)
            values = torch.where(near_zero & can_zero, torch.zeros_like(values), values)
        full = region.embed(values)
        names = self.spec.action_names
        keep = region.actions if region.hard else names
        intervention = {name: float(full[names.index(name)]) for name in keep}
        cost = intervention_cost(self.spec, intervention)
        if cost > constraints.round_cap * (1 + 1e-12) + 1e-12:
            raise RuntimeError(f"{self.name}: proposal cost {cost} exceeds the round cap")
        used = tuple(n for n in keep if region.hard or intervention[n] != 0.0)
        return Proposal(intervention, solution.score, cost, used, diagnostics)

    def _propose_candidate(
        self,
        model: NetworkModel,
        constraints: Constraints,
        problem: Problem,
        deadline: Deadline,
    ) -> Proposal:
        points = admissible_candidates(model, constraints)
        with torch.no_grad():  # in chunks: memory grows with candidates × MC samples × data
            values = torch.cat([problem.evaluate_candidates(part) for part in points.split(256)])
        score = values
        diagnostics: dict[str, Any] = {"policy": self.name, "candidates": len(points)}
        if self.settings.cost_aware:
            costs = torch.tensor(
                [intervention_cost(self.spec, self._as_intervention(p)) for p in points],
                dtype=values.dtype,
                device=values.device,
            )
            baseline = 0.0 if problem.baseline_is_zero else self._baseline(model, problem)
            score = (values - baseline).clamp_min(0.0) / costs.clamp_min(self._cost_floor())
            if float(score.max()) <= 0.0:
                score = values
                diagnostics["cost_aware_fallback"] = True
        best = int(torch.argmax(score))
        intervention = self._as_intervention(points[best])
        diagnostics.update(
            problem.diagnostics(),
            acquisition=float(values[best]),
            timed_out=deadline.expired(),
            seconds=deadline.elapsed(),
        )
        used = tuple(n for n, v in intervention.items() if v != 0.0)
        cost = intervention_cost(self.spec, intervention)
        if cost > constraints.round_cap * (1 + 1e-12) + 1e-12:
            raise NothingAffordable(f"{self.name}: candidate cost {cost} exceeds the round cap")
        return Proposal(intervention, float(score[best]), cost, used, diagnostics)

    def _cost_floor(self) -> float:
        if self.settings.cost_floor is not None:
            return self.settings.cost_floor
        return min((a.cost for a in self.spec.actions if a.cost > 0), default=1.0)

    def _as_intervention(self, point: torch.Tensor) -> dict[str, float]:
        return dict(zip(self.spec.action_names, point.tolist(), strict=True))
