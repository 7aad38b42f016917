"""HA-GP-UCB (paper 000, Alg. 4): learn the additive structure, then additive GP-UCB.

Phase 1 (structure learning) plays finite-difference Hessian stencils (`core.structure`): `t0`
base points drawn uniformly (seeded by the spec's `initial_design.seed`), each stencil of
1 + D + D(D−1)/2 points played `c1` times. These are real episodes: they are charged to the
budget and count in the regret like any other round. The policy asks for the first stencil
point the history does not hold yet (a point whose round ended without a reward is asked again
once every other point is played), so an expired round or a restart loses nothing.

Then the summed Hessian estimates are thresholded at c_h (`core.structure.cutoff` when the
reward node's `noise_std` is known, else the same formula with the noise estimated from the
estimates themselves: the dependency graph is sparse, so the median |Σ Ĥ_ab| over all pairs is
a non-edge's, 0.6745 of the noise's standard deviation), at most `max_edges` edges are kept (the
largest), and the groups are the maximal cliques. Phase 2 is `policies._additive_ucb` on them,
with every round played so far (phase 1 included) in its GP.

The zeroth-order Hessian replaces the paper's surrogate ∂²π/∂θ² (which needs a differentiable
policy on the agent's side); it costs D²/2 episodes per base point, so it suits D up to a few
tens — at D = 50 one stencil is 1,276 rounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from pydantic import Field

from core.network import NetworkModel
from core.spec import ExperimentSpec
from core.structure import (
    MAX_EDGES,
    Structure,
    cutoff,
    hessian_from_stencil,
    stencil,
    stencil_size,
    structure_from_hessian,
)
from policies._additive_ucb import (
    AdditiveUCB,
    AdditiveUCBSettings,
    action_bounds,
    check_parameter_experiment,
)
from policies.base import Constraints, NothingAffordable, Policy, Proposal, intervention_cost

_MAD = 0.6745  # median |N(0, 1)|


class HAGPUCBSettings(AdditiveUCBSettings):
    """HA-GP-UCB settings: phase 1's stencils and cut-off, then additive GP-UCB's."""

    t0: int = Field(default=1, ge=1, description="T0: base points of phase 1.")
    c1: int = Field(default=1, ge=1, description="C1: plays of each base point's stencil.")
    step: float = Field(
        default=0.3,
        gt=0,
        le=0.5,
        description="Finite-difference step h, a fraction of each action's span.",
    )
    delta: float = Field(
        default=0.05, gt=0, lt=1, description="δ of the cut-off c_h (false-edge probability)."
    )
    max_edges: int = Field(
        default=MAX_EDGES,
        ge=0,
        description="At most this many edges (the largest |Σ Ĥ|) are kept; the paper's additive "
        "GP stayed tractable up to about 1,500.",
    )


class HAGPUCBPolicy(Policy):
    """Hessian-aware additive GP-UCB with zeroth-order structure learning."""

    name = "hagpucb"
    Settings = HAGPUCBSettings

    def __init__(self, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(spec, settings)
        check_parameter_experiment(spec, self.name)
        self.dim = len(spec.action_names)
        self.bounds = action_bounds(spec)
        self.structure: Structure | None = None
        self._ucb: AdditiveUCB | None = None
        self._points = self._phase_one_points()  # (T0·C1·Q, D) declared units, in play order
        self._keys = [self._key(p) for p in self._points.tolist()]

    @property
    def phase_one_rounds(self) -> int:
        """Episodes of phase 1: T0 · C1 · (1 + D + D(D−1)/2)."""
        return int(self._points.shape[0])

    def _phase_one_points(self) -> torch.Tensor:
        s = self.settings
        g = torch.Generator().manual_seed(self.spec.initial_design.seed)
        lower, span = self.bounds[:, 0], self.bounds[:, 1] - self.bounds[:, 0]
        blocks = []
        for _ in range(s.t0):
            base = torch.rand(self.dim, generator=g, dtype=torch.float64) * (1.0 - s.step)
            unit = stencil(base, s.step)
            blocks += [lower + unit * span] * s.c1
        return torch.cat(blocks)

    @staticmethod
    def _key(values) -> tuple[float, ...]:
        return tuple(round(float(v), 9) for v in values)

    # ------------------------------------------------------------------ propose
    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        if self.structure is None:
            rewards = self._phase_one_rewards(model)
            missing = [k for k, r in enumerate(rewards) if r is None]
            if missing:
                return self._phase_one_proposal(model, missing, constraints)
            self._learn_structure(rewards, model)
        assert self._ucb is not None and self.structure is not None
        proposal = self._ucb.propose(model, constraints, rng)
        proposal.diagnostics.update(
            phase=2,
            edges=[list(e) for e in self.structure.edges],
            edges_dropped=self.structure.dropped,
        )
        return proposal

    def _phase_one_rewards(self, model: NetworkModel) -> list[float | None]:
        """Each stencil point's reward (the mean where it was played several times)."""
        names, reward = self.spec.action_names, model.reward_node
        seen: dict[tuple[float, ...], list[float]] = {}
        played: set[tuple[float, ...]] = set()
        for record in model.history:
            key = self._key(record.intervention.get(n, 0.0) for n in names)
            played.add(key)
            if reward in record.readings:
                seen.setdefault(key, []).append(float(record.readings[reward]))
        self._played = played
        return [sum(seen[k]) / len(seen[k]) if k in seen else None for k in self._keys]

    def _phase_one_proposal(
        self, model: NetworkModel, missing: list[int], constraints: Constraints
    ) -> Proposal:
        unplayed = [k for k in missing if self._keys[k] not in self._played]
        pick = (unplayed or missing)[0]
        intervention = dict(zip(self.spec.action_names, self._points[pick].tolist(), strict=True))
        cost = intervention_cost(self.spec, intervention)
        if cost > constraints.round_cap * (1 + 1e-12) + 1e-12:
            raise NothingAffordable(f"a round costs {cost:g}, {constraints.round_cap:g} is left")
        return Proposal(
            intervention,
            math.nan,
            cost,
            tuple(self.spec.action_names),
            {"phase": 1, "query": pick, "queries": self.phase_one_rounds, "left": len(missing)},
        )

    def _learn_structure(self, rewards: list[float | None], model: NetworkModel) -> None:
        s = self.settings
        q = stencil_size(self.dim)
        values = torch.tensor(rewards, dtype=torch.float64).reshape(-1, q)
        total = sum(hessian_from_stencil(v, self.dim, s.step) for v in values)
        assert isinstance(total, torch.Tensor)
        self.structure = structure_from_hessian(
            total, self._threshold(total, len(values)), max_edges=s.max_edges
        )
        self._ucb = AdditiveUCB(self.spec, self.structure.groups, s)

    def _threshold(self, total: torch.Tensor, queries: int) -> float:
        """c_h: the paper's, with the known or the estimated noise (see the module docstring)."""
        s = self.settings
        std = self.spec.node(self.spec.reward.node).noise_std
        rows, cols = torch.triu_indices(self.dim, self.dim, offset=1)
        magnitude = total[rows, cols].abs()
        floor = 1e-9 * float(magnitude.max()) if magnitude.numel() else 0.0
        if std is not None and std > 0:
            return max(cutoff(queries, float(std), s.step, self.dim, s.delta), floor)
        if magnitude.numel() == 0:
            return 0.0
        # the std of one summed entry, estimated robustly; c_h = that · √(2 log(2D²/δ))
        spread = float(magnitude.median()) / _MAD
        return max(spread * math.sqrt(2.0 * math.log(2.0 * self.dim**2 / s.delta)), floor)
