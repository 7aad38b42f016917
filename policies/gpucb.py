"""GP-UCB (Srinivas et al. 2010; paper 004's graph-blind baseline, its Fig. 1a).

One GP from the action vector to the reward (`NetworkModel.flat_model`: hard interventions are
encoded as a value and a do-bit per action), maximizing

    UCB(a) = μ(a) + β·σ(a),

σ the latent std. β has MCBO's meaning (a σ-multiplier, default 0.5, optional schedule in
`policies._beta`). Note that BoTorch's `UpperConfidenceBound(beta)` computes μ + √β·σ, so the
paper's GP-UCB grid β ∈ {0.05, 0.5, 5} — run through BoTorch — corresponds to β ∈ {0.22, 0.71,
2.24} here. The flat GP's noise is the reward node's known noise (the authors' code used 1e-6
even on noisy tasks).

Under a block limit (`constraints.max_interventions` with a `parameters` vector: at most k blocks
of θ changed from its default), the optimum found without the limit is the target and, starting
from the default, the block whose target values raise UCB most moves, k times at most
(`policies._blocks.greedy_units`, as `addgpucb` does).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from core.network import NetworkModel
from policies._beta import BetaSchedule, beta_at
from policies._blocks import greedy_units, keep_units
from policies._optimize import Deadline, seed_from
from policies._search import Problem, SearchPolicy, SearchSettings
from policies._supports import Region
from policies.base import Constraints, NothingAffordable, Proposal, intervention_cost


class GPUCBSettings(SearchSettings):
    """GP-UCB settings (the shared search settings in `policies._search.SearchSettings`).

    Attributes:
        beta: σ-multiplier (μ + β·σ, not BoTorch's √β).
        beta_schedule: grow β with the rounds (see `policies._beta`); None keeps it constant.
    """

    beta: float = Field(default=0.5, ge=0)
    beta_schedule: BetaSchedule | None = None


class GPUCBPolicy(SearchPolicy):
    """Upper confidence bound of one actions → reward GP that ignores the graph. Its noise is
    Var(Y | a): the reward node's `noise_std` only when no node upstream of the reward is noisy,
    else learned."""

    name = "gpucb"
    handles_arrays = True
    handles_block_limits = True  # greedy by UCB from the unconstrained optimum (module doc)
    handles_field_parents = True
    Settings = GPUCBSettings

    def problem(self, model: NetworkModel, seed: int, deadline: Deadline) -> Problem:
        return _UCBProblem(self, model, seed)

    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        proposal = super().propose(model, constraints, rng)
        if constraints.max_blocks is None:
            return proposal
        return self._within_blocks(model, proposal, constraints, rng)

    def _within_blocks(
        self,
        model: NetworkModel,
        proposal: Proposal,
        constraints: Constraints,
        rng: torch.Generator,
    ) -> Proposal:
        """The proposal kept to `constraints.max_blocks` blocks of θ changed from its default
        (a block-limited spec has θ as its only action: `core.spec`'s check)."""
        problem = _UCBProblem(self, model, seed_from(rng))
        names = self.spec.action_names

        def score(batch: list[list[float]]) -> list[float]:
            with torch.no_grad():
                x = torch.tensor(batch, dtype=problem.dtype, device=problem.device)
                return problem.ucb(x, (), problem.beta).tolist()

        target = [proposal.intervention[n] for n in names]
        assert constraints.max_blocks is not None
        chosen = greedy_units(self.spec, target, constraints.max_blocks, score)
        kept = keep_units(self.spec, target, chosen)
        intervention = dict(zip(names, kept, strict=True))
        cost = intervention_cost(self.spec, intervention)
        if cost > constraints.round_cap * (1 + 1e-12) + 1e-12:
            raise NothingAffordable(f"a round costs {cost:g}, {constraints.round_cap:g} is left")
        diagnostics = {**proposal.diagnostics, "blocks_changed": chosen}
        value = score([kept])[0]
        used = tuple(n for n in names if intervention[n] != 0.0)
        return Proposal(intervention, value, cost, used, diagnostics)


class _UCBProblem(Problem):
    def __init__(self, policy: GPUCBPolicy, model: NetworkModel, seed: int) -> None:
        super().__init__(policy, model, seed)
        self.gp = model.flat_model()
        self.beta = beta_at(self.settings.beta, self.settings.beta_schedule, model)

    def ucb(self, actions: torch.Tensor, set_actions: tuple[str, ...], beta: float) -> torch.Tensor:
        """(b, A) -> (b,) μ + β·σ of the flat GP."""
        x = self.model.flat_encode(actions, set_actions)
        post = self.gp.posterior(x.unsqueeze(0), members=[0])
        mean = post.mean[0]
        if beta == 0.0:
            return mean
        return mean + beta * post.variance[0].clamp_min(1e-24).sqrt()

    def evaluate(self, region: Region, x: torch.Tensor) -> torch.Tensor:
        return self.ucb(region.embed(x[:, : region.dim]), region.set_actions, self.beta)

    def evaluate_candidates(self, actions: torch.Tensor) -> torch.Tensor:
        return self.ucb(actions, (), self.beta)

    def mean_value(self, actions: torch.Tensor, set_actions: tuple[str, ...]) -> torch.Tensor:
        return self.ucb(actions, set_actions, 0.0)

    def diagnostics(self) -> dict[str, Any]:
        return {"beta": self.beta}
