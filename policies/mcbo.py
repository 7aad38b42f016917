"""MCBO (paper 004, Alg. 1/2, Eq. 11–12): optimism propagated through the causal network.

Every node i not set by the intervention is hallucinated in topological order,

    x̃_i = μ_i(z̃_i, a_i) + β·σ_i(z̃_i, a_i)·η_i + ω̃_i,     η_i ∈ [−1, 1],

at its hallucinated parents z̃_i (μ, σ the posterior mean and latent std of node i's GP, ω̃_i a
draw of its known noise), and the action a and the hallucination η jointly maximize the Monte-
Carlo mean of the reward x̃_Y. The reward node takes η_Y ≡ +1: x̃_Y is increasing in η_Y and
β·σ_Y ≥ 0, so +1 is its exact maximizer (the paper's noiseless optimizer leaves η_Y free and
finds the same value; the authors' noisy code fixes it to +1).

Two parameterizations of η (setting `eta`; "auto" picks per target set, see `eta_mode`):

- "constant" (noiseless networks, as in the paper — and, exactly as expressive, any network or
  target set in which no hallucinated node has a noisy parent, e.g. noisy Dropwave, whose only
  free η sits on a root): one η_i per node, optimized jointly with the action values by
  BoTorch's `optimize_acqf` (multi-start L-BFGS-B; SLSQP under a budget constraint) over
  [a; η]. With noise, the MC mean uses fixed scrambled-Sobol base samples (`mc_samples`), so
  the objective is deterministic.
- "network" (a hallucinated node has noisy inputs): η_i(z) is a small ReLU network of the
  node's inputs (`policies._eta_nets`). `nn_restarts` initializations are trained together
  in one batched computation by Adam on fresh MC estimates (`mc_samples` noise draws per
  step; one intra-op thread, and `policies._optimize.Adam`, torch's update without torch.optim
  — see `solve`), for up to `steps` (stopping rule below): up to `warm_starts` of them are the
  previous rounds' best nets and actions for this region, the rest random nets started near
  a constant η whose [a; η] are picked (Boltzmann rule) from `raw_samples` Sobol points
  scored with the constant-η objective — a network with zero output weights *is* a constant
  η, so the screen gives the search the constant mode's global coverage. Every restart is
  then rescored with `rescore_samples` common noise draws and the best is kept.

  Stopping rule (issue 17): at most `steps` Adam steps, stopped early on a plateau of the
  acquisition estimate. Every `stop_every` steps (and once before the first) all restarts are
  scored on `stop_samples` common noise draws, fixed for the whole training (a stream of their
  own: the training's draws are those of a fixed-count run), so two checks differ only by what
  the nets and actions learned. When the best restart's estimate has not risen by more than
  `stop_tol` standard errors (its Monte-Carlo standard error over those draws) for
  `stop_patience` checks in a row, training stops. The per-step objective cannot serve: on
  fresh draws its noise (PSAGraph: sd ≈ 0.07 per step at 32 draws) is a hundred times the
  improvement left after ≈ 16 steps (≈ 0.001, measured at common draws). The authors stopped
  with BoTorch's `ExpMAStoppingCriterion` on that noisy objective, with `minimize=True` under
  a *maximizing* SGD — after ≈ 11 steps of improvement (digest §7.4), mostly random search.
  `stop_patience: 0` keeps the fixed count (`steps`), cut short only by the wall-clock cap.

An array node that feeds scalar nodes (issue 15) is not hallucinated: its value is one of S
posterior sample paths (Matheron's rule, `NetworkModel.field_draws`, fitted first when due),
drawn once per proposal and paired with the S noise draws, so the MC mean runs over the field's
epistemic uncertainty as over the noise; its children hallucinate at the sampled field. A
sampled field is random given a, so "auto" treats it as a noisy node.

β: `beta` (default 0.5, the middle of the paper's grid {0.05, 0.5, 5}), or `beta_schedule`
(see `policies._beta`).

Shrinking lengthscales (`lengthscale_decay` p; off by default). The node GPs' lengthscales are
MAP estimates refit from the policy's own data; where the data never showed a short-scale
feature the fit is smooth there, σ small, and no constant β makes a look worthwhile (issue 19:
ToyGraph's optimum at do(X1 ≈ −3.2), hidden behind the fitted trend and the +π mode). After
Berkenkamp et al. (2019, "No-regret Bayesian optimization with unknown hyperparameters"), the
proposal sees every node's lengthscales capped at ℓ_0·g(t)⁻¹ with g(t) = t^p (the fitted value
where it is shorter: the MAP estimate under a cap that shrinks as A-GP-UCB's lengthscales do;
their adaptive choice of g(t) is not implemented), so the function class the optimism covers
grows with t, and β grows with the RKHS norm bound of that
class, ×g(t)^(d/2) (d the widest node input). The cap acts on a view of the model
(`NetworkModel.with_lengthscale_caps`), refactorized once per proposal: what the model learns
and reports is unchanged. Measured in docs/benchmarks.md (issue 19, third pass).

Finite candidate sets are scored exhaustively with a constant η per
candidate, optimized for all candidates at once by projected Adam (η_Y = +1 in closed form; no
optimization when the reward is the only hallucinated node).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Literal

import torch
from pydantic import Field

from core.network import NetworkModel, NodeQuery
from core.threads import this_thread_only
from policies._beta import BetaSchedule, beta_at
from policies._eta_nets import EtaNets
from policies._optimize import Adam, Deadline, ascend, raw_starts, sobol_normals
from policies._search import Problem, Scorer, SearchPolicy, SearchSettings, Solution
from policies._supports import Region


class MCBOSettings(SearchSettings):
    """MCBO settings (the shared search settings in `policies._search.SearchSettings`).

    Attributes:
        beta: σ-multiplier of the optimism (μ + β·σ·η); the paper's grid is {0.05, 0.5, 5}.
        beta_schedule: grow β with the rounds (see `policies._beta`); None keeps it constant.
        eta: "constant" η per node, "network" η_i(z), or "auto" (network iff a hallucinated
            node has a noisy ancestor in the graph the target set cuts; see `eta_mode`).
        mc_samples: noise draws per evaluation (constant mode, fixed QMC) or per gradient step
            (network mode); the paper uses 32 (128 on noisy Dropwave).
        nn_restarts: initializations trained together in network mode (up to `warm_starts`
            of them the previous rounds' solutions). Cost per step ∝ nn_restarts·mc_samples·n²;
            16 and 64 steps keep PSAGraph (4 target sets, 6 nodes) near 4 s at n = 126
            (the fixed 64 steps, before the plateau rule).
        steps: Adam steps in network mode, at most (the plateau rule below may stop sooner).
        stop_every: network mode: steps between two checks of the plateau rule (module
            docstring, "Stopping rule"); each check is one forward pass at `stop_samples`.
        stop_samples: common noise draws, fixed for one training, on which every check scores
            the restarts.
        stop_tol: a check improves when the best restart's estimate rose by more than this many
            of its Monte-Carlo standard errors (at `stop_samples`) since the last improvement.
        stop_patience: training stops after this many checks in a row without improvement; 0
            turns the rule off (always `steps` steps). With 8/64/0.1/1, PSAGraph's trainings
            stop after 16 steps in most rounds (docs/benchmarks.md, issue 17, psa17b).
        learning_rate: Adam step size in network mode (action logits and net weights).
        rescore_samples: common noise draws scoring every restart at the end (paper: 1000).
        hidden_factor: η-net hidden width = hidden_factor · input width (authors: 4).
        candidate_steps: projected-Adam steps of the per-candidate η.
        lengthscale_decay: p of the shrinking lengthscales (Berkenkamp et al. 2019, A-GP-UCB):
            each node's GP lengthscales are capped at `lengthscale_start`·t^(−p) in the
            proposal's view of the model (t = rounds learned, the initial design included) and
            β is multiplied by t^(p·d/2), d the widest node input (the RKHS norm's growth
            under lengthscales shrunk by g = t^p is ≤ g^(d/2)). None: the fitted lengthscales
            and β as set. See the module docstring.
        lengthscale_start: ℓ_0 of the cap, unit-cube units; 1/3 is the mode of the Gamma(3, 6)
            lengthscale prior (`model.priors: gamma`).
    """

    beta: float = Field(default=0.5, ge=0)
    beta_schedule: BetaSchedule | None = None
    eta: Literal["auto", "constant", "network"] = "auto"
    mc_samples: int = Field(default=32, ge=1)
    nn_restarts: int = Field(default=16, ge=1)
    steps: int = Field(default=64, ge=0)
    stop_every: int = Field(default=8, ge=1)
    stop_samples: int = Field(default=64, ge=1)
    stop_tol: float = Field(default=0.1, ge=0)
    stop_patience: int = Field(default=1, ge=0)
    learning_rate: float = Field(default=0.05, gt=0)
    rescore_samples: int = Field(default=256, ge=1)
    hidden_factor: int = Field(default=4, ge=1)
    candidate_steps: int = Field(default=50, ge=0)
    lengthscale_decay: float | None = Field(default=None, gt=0, le=1)
    lengthscale_start: float = Field(default=1.0 / 3.0, gt=0)


class MCBOPolicy(SearchPolicy):
    """Model-based causal BO: optimistic hallucinated rollouts through the network."""

    name = "mcbo"
    Settings = MCBOSettings
    handles_field_parents = True  # a field parent's sample paths are passed on (see below)

    def problem(self, model: NetworkModel, seed: int, deadline: Deadline) -> Problem:
        growth = 1.0
        decay = self.settings.lengthscale_decay
        if decay is not None:
            t = max(len(model.history), 1)
            cap = self.settings.lengthscale_start * t**-decay
            model = model.with_lengthscale_caps(dict.fromkeys(model.order, cap))
            width = max(model.inputs[node].width for node in model.order)
            growth = t ** (decay * width / 2)
        return _MCBOProblem(self, model, seed, deadline, growth)

    def eta_mode(
        self, model: NetworkModel, set_actions: tuple[str, ...] = ()
    ) -> Literal["constant", "network"]:
        """The η parameterization for one target set (soft: the whole network).

        "auto": "network" iff some hallucinated node (not set, not the reward) has a noisy
        ancestor in the graph cut by the intervention. Otherwise every η_i sees inputs that
        are fixed given a, and a constant η is exactly as expressive (the paper's argument for
        noiseless networks, A.3, applied node by node) — and L-BFGS-B optimizes it far better.
        """
        if self.settings.eta != "auto":
            return self.settings.eta
        fixed = model.set_nodes(dict.fromkeys(set_actions, 0.0))
        # nodes whose value varies with the noise given a; a field is one of its sample paths
        noisy: set[str] = set(model.array_shapes)
        for node in model.order:
            if node in fixed:
                continue
            parents = model.inputs[node].parents
            if model.known_noise_std(node) > 0 or any(p in noisy for p in parents):
                noisy.add(node)
        reward = model.reward_node
        for node in model.order:
            if node in fixed or node == reward:
                continue
            if any(p in noisy for p in model.inputs[node].parents):
                return "network"
        return "constant"


class _MCBOProblem(Problem):
    def __init__(
        self,
        policy: MCBOPolicy,
        model: NetworkModel,
        seed: int,
        deadline: Deadline,
        growth: float = 1.0,
    ) -> None:
        super().__init__(policy, model, seed)
        self.deadline = deadline
        self.beta = growth * beta_at(self.settings.beta, self.settings.beta_schedule, model)
        self.noise = {node: model.known_noise_std(node) for node in model.order}
        self.column = {node: j for j, node in enumerate(model.order)}
        self.noisy = any(std > 0 for std in self.noise.values())
        # field parents (issue 15): S sample paths, paired with the S noise draws; enough paths
        # for the network mode's training (mc_samples) and its rescoring chunks (64)
        self.fields = None
        if model.array_shapes:
            paths = max(self.settings.mc_samples, min(self.settings.rescore_samples, 64))
            self.fields = model.field_draws(paths, seed)
        random = self.noisy or self.fields is not None
        count = self.settings.mc_samples if random else 1
        self.eps = sobol_normals(
            count, len(model.order), seed, dtype=self.dtype, device=self.device
        )
        self.info: dict[str, Any] = {"beta": self.beta}
        if self.fields is not None:
            self.info["fields_refitted"] = self.fields.refitted
            self.info["field_fit_seconds"] = self.fields.fit_seconds
            self.upkeep_seconds = self.fields.fit_seconds

    # ------------------------------------------------------------------ structure
    def eta_nodes(self, set_actions: tuple[str, ...]) -> list[str]:
        """Hallucinated nodes with a free η: not set by the intervention, not the reward."""
        fixed = self.model.set_nodes(dict.fromkeys(set_actions, 0.0))
        reward = self.model.reward_node
        return [n for n in self.model.order if n != reward and n not in fixed]

    def extra_bounds(self, region: Region) -> tuple[torch.Tensor, torch.Tensor]:
        count = len(self.eta_nodes(region.set_actions))
        ones = torch.ones(count, dtype=self.dtype, device=self.device)
        return -ones, ones

    # ------------------------------------------------------------------ constant η
    def optimistic_reward(
        self,
        actions: torch.Tensor,
        eta: torch.Tensor,
        set_actions: tuple[str, ...],
        beta: float,
        eps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """MC mean of the hallucinated reward with a constant η per node.

        Args:
            actions: (b, A) action vectors; eta: (b, E) in `eta_nodes` order.
            eps: (S, nodes) standard-normal noise draws (default: the fixed QMC draws).

        Returns:
            (b,) mean over the S draws of x̃_Y.
        """
        eps = self.eps if eps is None else eps
        index = {node: e for e, node in enumerate(self.eta_nodes(set_actions))}
        reward = self.model.reward_node

        def sampler(query: NodeQuery) -> torch.Tensor:
            node = query.node
            shift = self.noise[node] * eps[:, self.column[node]].unsqueeze(-1)
            if node == reward:
                return query.mean + beta * query.std + shift
            return query.mean + beta * query.std * eta[:, index[node]] + shift

        batch = actions.unsqueeze(0)  # draws broadcast in: (1, b, A) -> (S, b) downstream
        fields = None if self.fields is None else self.fields.first(eps.shape[0])
        values = self.model.rollout(batch, sampler, set_actions=set_actions, fields=fields)
        return values[reward].mean(0)

    def evaluate(self, region: Region, x: torch.Tensor) -> torch.Tensor:
        dim = region.dim
        return self.optimistic_reward(
            region.embed(x[:, :dim]), x[:, dim:], region.set_actions, self.beta
        )

    def mean_value(self, actions: torch.Tensor, set_actions: tuple[str, ...]) -> torch.Tensor:
        eta = actions.new_zeros(actions.shape[0], len(self.eta_nodes(set_actions)))
        return self.optimistic_reward(actions, eta, set_actions, 0.0)

    def evaluate_candidates(self, actions: torch.Tensor) -> torch.Tensor:
        count = len(self.eta_nodes(()))
        n = actions.shape[0]
        if count == 0 or self.beta == 0.0:  # η has no effect: closed form
            eta = actions.new_zeros(n, count)
            return self.optimistic_reward(actions, eta, (), self.beta)
        starts = torch.cat([actions.new_ones(n, count), actions.new_zeros(n, count)])
        both = torch.cat([actions, actions])
        with torch.enable_grad():
            _, values, timed_out = ascend(
                lambda eta: self.optimistic_reward(both, eta, (), self.beta),
                starts,
                -torch.ones_like(starts[0]),
                torch.ones_like(starts[0]),
                steps=self.settings.candidate_steps,
                lr=0.1,
                deadline=self.deadline,
            )
        self.info["candidate_timed_out"] = timed_out
        return torch.maximum(values[:n], values[n:])

    def joint_evaluator(
        self, set_actions: tuple[str, ...]
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """[a (A); η (E)] -> the optimistic reward, for every region with these `set_actions`:
        constant η only (network η trains its own nets per region)."""
        if self.policy.eta_mode(self.model, set_actions) != "constant":
            return None
        actions = len(self.model.spec.action_names)

        def evaluate(x: torch.Tensor) -> torch.Tensor:
            return self.optimistic_reward(x[:, :actions], x[:, actions:], set_actions, self.beta)

        return evaluate

    # ------------------------------------------------------------------ solving
    def solve(
        self, region: Region, scorer: Scorer, deadline: Deadline, timeout: float, seed: int
    ) -> Solution:
        mode = self.policy.eta_mode(self.model, region.set_actions)
        if mode == "constant":
            solution = super().solve(region, scorer, deadline, timeout, seed)
        else:
            # One intra-op thread: a training step is hundreds of small operations (tensors of
            # R·S·n ≈ 10⁴–10⁵ elements), and a second OpenMP thread only adds a barrier to each;
            # on a loaded machine, where that thread waits for a core, the same proposal took
            # 5–30× the wall time of one thread (docs/benchmarks.md, issue 17, mcbo17). The
            # result does not depend on the count. Regions trained side by side
            # (`SearchPolicy._search_threads`) already run with one each.
            with this_thread_only(1):
                solution = self._train(region, scorer, deadline, timeout, seed)
        solution.info["eta"] = mode
        return solution

    def solves_in_threads(self, region: Region) -> bool:
        """Network-η regions train by Adam in torch alone, each with its own generator and
        nets: they may train side by side (`SearchPolicy._search_threads`)."""
        return self.policy.eta_mode(self.model, region.set_actions) == "network"

    def _train(
        self, region: Region, scorer: Scorer, deadline: Deadline, timeout: float, seed: int
    ) -> Solution:
        """Network-η: batched Adam over R restarts of (action logits, η nets), then rescoring."""
        settings = self.settings
        started = time.monotonic()
        generator = torch.Generator().manual_seed(seed)
        restarts = settings.nn_restarts
        nodes = self.eta_nodes(region.set_actions)
        widths = {node: max(self.model.inputs[node].width, 1) for node in nodes}
        nets = EtaNets(
            widths,
            restarts,
            settings.hidden_factor,
            generator,
            dtype=self.dtype,
            device=self.device,
        )
        lower, span = region.lower.to(self.dtype), (region.upper - region.lower).to(self.dtype)
        u = 0.001 + 0.998 * torch.rand(restarts, region.dim, generator=generator)
        logits = torch.logit(u.to(self.dtype)).to(self.device)
        warm = 0
        for memory in self.policy.recall(region)[:restarts]:
            if isinstance(memory, dict) and nets.load(warm, memory["nets"]):
                share = ((memory["values"] - lower) / span).clamp(0.001, 0.999)
                logits[warm] = torch.logit(share)
                warm += 1
        if settings.raw_samples and warm < restarts:
            self._screened_starts(region, scorer, nets, nodes, logits, warm, seed, timeout / 4)
        logits.requires_grad_(True)
        optimizer = Adam([logits, *nets.parameters()], lr=settings.learning_rate)

        def values_of() -> torch.Tensor:
            return region.feasible(lower + span * torch.sigmoid(logits))

        plateau = _Plateau(self, region, scorer, nets, values_of, seed)
        steps, timed_out = 0, False
        for _ in range(settings.steps):
            if deadline.expired() or time.monotonic() - started > timeout:
                timed_out = True
                break
            if plateau.due(steps) and plateau.reached():
                break
            eps = torch.randn(settings.mc_samples, len(self.column), generator=generator)
            values = values_of()
            acquisition = self._network_reward(region, values, nets, eps.to(values))
            objective = scorer(region, acquisition, values)
            if not objective.requires_grad:  # flat (no data yet): nothing to learn from
                break
            optimizer.zero_grad()
            (-objective.sum()).backward()
            optimizer.step()
            steps += 1
        with torch.no_grad():
            values = values_of()
            eps = torch.randn(settings.rescore_samples, len(self.column), generator=generator)
            acquisition = self._network_reward(region, values, nets, eps.to(values), chunk=64)
            score = scorer(region, acquisition, values)
        score = torch.where(torch.isfinite(score), score, -math.inf)
        best = int(torch.argmax(score))
        self.info.update(
            steps=steps, nn_restarts=restarts, warm_started=warm, plateau_checks=plateau.checks
        )
        memory = {"values": values[best].detach().clone(), "nets": nets.export(best)}
        return Solution(
            values[best].detach(),
            float(score[best]),
            float(acquisition[best]),
            timed_out,
            memory,
        )

    def _screened_starts(
        self,
        region: Region,
        scorer: Scorer,
        nets: EtaNets,
        nodes: list[str],
        logits: torch.Tensor,
        first: int,
        seed: int,
        timeout: float,
    ) -> None:
        """Start the fresh restarts from the best of `raw_samples` Sobol points of [a; η].

        The points are scored with the constant-η objective (fixed QMC noise), and BoTorch's
        Boltzmann rule picks among them, as in the L-BFGS-B path: a handful of purely random
        starts cover a multimodal action space (Dropwave's rings) far worse than a screen.
        """
        dim = region.dim
        lo_extra, hi_extra = self.extra_bounds(region)
        lower = torch.cat([region.lower.to(self.dtype), lo_extra])
        upper = torch.cat([region.upper.to(self.dtype), hi_extra])
        if len(lower) == 0:
            return
        with torch.no_grad():
            starts, _, _ = raw_starts(
                lambda x: scorer(region, self.evaluate(region, x), x[:, :dim]),
                lower,
                upper,
                self.settings.raw_samples,
                logits.shape[0] - first,
                timeout,
                seed,
                lambda x: torch.cat([region.feasible(x[:, :dim]), x[:, dim:]], dim=-1),
                256,
            )
        count = starts.shape[0]
        span = (region.upper - region.lower).to(self.dtype)
        share = ((starts[:, :dim] - region.lower.to(self.dtype)) / span).clamp(0.001, 0.999)
        logits[first : first + count] = torch.logit(share)
        nets.start_constant(first, starts[:, dim:], nodes)

    def _network_reward(
        self,
        region: Region,
        values: torch.Tensor,
        nets: EtaNets,
        eps: torch.Tensor,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """(R, F) values, (S, nodes) noise draws -> (R,) MC mean of x̃_Y under network η."""
        if chunk is not None and eps.shape[0] > chunk:
            parts = [
                self._network_reward(region, values, nets, part) * len(part)
                for part in eps.split(chunk)
            ]
            return torch.stack(parts).sum(0) / eps.shape[0]
        return self._network_draws(region, values, nets, eps).mean(0)

    def _network_draws(
        self, region: Region, values: torch.Tensor, nets: EtaNets, eps: torch.Tensor
    ) -> torch.Tensor:
        """(R, F) values, (S, nodes) noise draws -> (S, R) x̃_Y per draw under network η."""
        reward = self.model.reward_node
        beta = self.beta
        bounds = {node: self.model.node_input_bounds(node) for node in nets.params}

        def sampler(query: NodeQuery) -> torch.Tensor:
            node = query.node
            shift = self.noise[node] * eps[:, self.column[node]].unsqueeze(-1)
            if node == reward:
                return query.mean + beta * query.std + shift
            low, high = bounds[node][:, 0], bounds[node][:, 1]
            if low.numel():
                z = (query.inputs - low) / (high - low)
            else:
                z = query.mean.new_zeros((*query.mean.shape, 1))
            return query.mean + beta * query.std * nets.eta(node, z) + shift

        actions = region.embed(values)
        batch = actions.unsqueeze(0)  # draws broadcast in: (1, b, A) -> (S, b) downstream
        fields = None if self.fields is None else self.fields.first(eps.shape[0])
        rollout = self.model.rollout(batch, sampler, set_actions=region.set_actions, fields=fields)
        return rollout[reward]

    def diagnostics(self) -> dict[str, Any]:
        return dict(self.info)


class _Plateau:
    """The plateau rule of the η-net training (module docstring, "Stopping rule").

    Every `stop_every` steps all restarts are scored on `stop_samples` common noise draws (a
    generator of their own, so the training's draws are unchanged); the rule is reached when the
    best score has not risen by more than `stop_tol` Monte-Carlo standard errors for
    `stop_patience` checks in a row.
    """

    def __init__(
        self,
        problem: _MCBOProblem,
        region: Region,
        scorer: Scorer,
        nets: EtaNets,
        values_of: Callable[[], torch.Tensor],
        seed: int,
    ) -> None:
        settings = problem.settings
        self.problem, self.region, self.scorer = problem, region, scorer
        self.nets, self.values_of = nets, values_of
        self.every, self.patience, self.tol = (
            settings.stop_every,
            settings.stop_patience,
            settings.stop_tol,
        )
        self.eps: torch.Tensor | None = None
        if self.patience > 0:
            # fields pair draw s with sample path s: no more draws than the paths drawn
            count = settings.stop_samples
            if problem.fields is not None:
                count = min(count, problem.fields.count)
            generator = torch.Generator().manual_seed(seed + 1)
            self.eps = torch.randn(count, len(problem.column), generator=generator)
        self.record = -math.inf
        self.stale = 0
        self.checks = 0

    def due(self, steps: int) -> bool:
        return self.eps is not None and steps % self.every == 0

    @torch.no_grad()
    def reached(self) -> bool:
        """Score the restarts now; True when the rule says stop."""
        assert self.eps is not None
        values = self.values_of()
        draws = self.problem._network_draws(self.region, values, self.nets, self.eps.to(values))
        score = self.scorer(self.region, draws.mean(0), values)
        score = torch.where(torch.isfinite(score), score, -math.inf)
        best = int(torch.argmax(score))
        value = float(score[best])
        # the standard error of the best restart's score over the common draws: the scorer of
        # each draw's reward (linear in it, but for cost-aware mode's clamp at 0)
        per_draw = self.scorer(self.region, draws[:, best : best + 1], values[best : best + 1])
        se = float(per_draw.std()) / math.sqrt(per_draw.shape[0]) if len(per_draw) > 1 else 0.0
        self.checks += 1
        if value > self.record + self.tol * se or not math.isfinite(self.record):
            self.record, self.stale = value, 0
            return False
        self.stale += 1
        return self.stale >= self.patience
