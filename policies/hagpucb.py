"""HA-GP-UCB (paper 000, Alg. 4): learn the additive structure, then additive GP-UCB.

Phase 1 (structure learning) plays finite-difference Hessian stencils (`core.structure`): `t0`
base points drawn uniformly (seeded by the spec's `initial_design.seed`), each stencil of
1 + D + D(D−1)/2 points played `c1` times. These are real episodes: they are charged to the
budget and count in the regret like any other round. The policy asks for the first stencil
point the history does not hold yet (a point whose round ended without a reward is asked again
once every other point is played), so an expired round or a restart loses nothing. The points
are not built up front (`policies._stencil_plan`: two rows per base, a point made when it is
asked for, a record of the history matched against the rows), so the constructor rounds
2·T0·D values instead of every coordinate of every point (at D = 414, 85,906 points: a
minute and 3.5 GB before, docs/benchmarks.md).

Then the summed Hessian estimates are thresholded at c_h (`core.structure.cutoff` when the
reward node's `noise_std` is known, else the same formula with the noise estimated from the
estimates themselves: the dependency graph is sparse, so the median |Σ Ĥ_ab| over the pairs
queried is a non-edge's, 0.6745 of the noise's standard deviation), at most `max_edges` edges
are kept (the largest), and the groups are the maximal cliques. Phase 2 is
`policies._additive_ucb` on them, with every round played so far (phase 1 included) in its GP.

The zeroth-order Hessian costs D²/2 episodes per base point, so it suits D up to a few tens — at
D = 50 one stencil is 1,276 rounds. Under a block limit (`constraints.max_interventions` with
the `parameters` vector: at most k blocks of θ changed from its default per round) every stencil
is centred at the default θ, each coordinate stepping up, or down where a step up would leave
its box, so the base changes no block, a single step one, a pair at most two; with k = 1 only
the pairs inside one block are queried (those across blocks would change two) and the entries
across blocks stay 0: no edge joins two blocks. The T0 base points are then all the default
(T0·C1 plays of one stencil).

**The surrogate Hessian (paper 000's own phase 1, its Sec. 4.5).** With `controller` set (the
name of a differentiable controller the devices run, `sim/controllers.py`, found through the
entry-point group `cbo_agent.controllers`), phase 1 plays no
episode: the agent computes H_π = ∂²π/∂θ_a∂θ_b of the policy's output on its own copy of the
controller (`core.structure.surrogate_hessian`, `torch.func.hessian`; the HOM policies in the
relaxation the paper uses for this phase only, Sinkhorn–Knopp role assignment and sigmoid
role-interaction edges). T0 points θ are drawn uniformly in the box (seeded by
`initial_design.seed`), each queried C1 times, a query being the mean of Σ_k |∂²π_k| over
`states` states. The states are drawn, seeded, from the states the devices' controller visited:
with `visited_states` = N, the traces the devices send with each episode's return (protocol
`cbo.reading` version 4, stored by the agent and replayed on a restart: `observe_states`); until
they hold N states every decision is *phase 0*, θ uniform in the box (real episodes, charged and
learnt by phase 2's GP), and the first decision after runs phase 1 on all of them
(docs/protocol.md, "Visited states"). Without it, from `states_file` (a `.npy` array (S, agents,
obs) recorded by the devices and handed to the agent with the spec) or, without one, uniformly
in the controller's box of typical observations. H_π has no observation noise, so c_h is
relative: the entries above `tolerance` × the largest summed entry are edges (the paper "kept
all detected edges"; a structural zero is an exact 0 of the autodiff), then the `max_edges` cap.
A saturated unit (tanh of a large input) has a vanishing curvature: its edges fall under any
cut-off at those states, so the states should be typical ones, and more of them (`states`,
`c1`) or more θ (`t0`) help. The Hessian is taken in the unit cube of the bounds, like the
stencils'.
The whole of phase 1 then runs inside the first decision (the HOM's 414 parameters: 32 s for the
default 4 states in one unlocked trial at load 5 on the 2-core machine, the Hessian dense: 84,255
of its 85,491 pairs nonzero, so the cap decides) and every round is a round of phase 2.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from core.network import NetworkModel
from core.spec import ExperimentSpec
from core.structure import (
    MAX_EDGES,
    Pairs,
    Structure,
    all_pairs,
    cutoff,
    hessian_from_stencil,
    structure_from_hessian,
    surrogate_hessian,
)
from policies._additive_ucb import (
    AdditiveUCB,
    AdditiveUCBSettings,
    action_bounds,
    check_parameter_experiment,
)
from policies._controllers import Controller, controller
from policies._stencil_plan import Entry, StencilPlan, key
from policies.base import Constraints, NothingAffordable, Policy, Proposal, intervention_cost

_MAD = 0.6745  # median |N(0, 1)|


class HAGPUCBSettings(AdditiveUCBSettings):
    """HA-GP-UCB settings: phase 1's stencils or surrogate and cut-off, then additive GP-UCB's."""

    t0: int = Field(
        default=1, ge=1, description="T0: base points of phase 1 (surrogate: the points θ drawn)."
    )
    c1: int = Field(
        default=1,
        ge=1,
        description="C1: plays of each base point's stencil (surrogate: queries per θ).",
    )
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
    controller: str | None = Field(
        default=None,
        description="The differentiable controller the devices run (an environment's name, "
        "e.g. mpe-tag-hom): phase 1 is then its surrogate Hessian ∂²π/∂θ², no episodes. "
        "null: finite differences of the reward.",
    )
    states: int = Field(
        default=4, ge=1, le=1024, description="Surrogate Hessian: states per query."
    )
    states_file: str | None = Field(
        default=None,
        description="Surrogate Hessian: a .npy array (S, agents, obs) of states the devices "
        "visited, drawn from for the queries (a path relative to the agent's working "
        "directory). null: uniform in the controller's state box.",
    )
    visited_states: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description="Surrogate Hessian: wait for this many states visited by the devices' "
        "controller (rows T summed over the traces of protocol cbo.reading version 4), playing "
        "θ uniform in the box meanwhile (phase 0), then draw the queries' states from them. "
        "0: no waiting, states from states_file or the controller's box.",
    )
    tolerance: float = Field(
        default=1e-12,
        gt=0,
        lt=1,
        description="Surrogate Hessian: the cut-off c_h as a fraction of the largest summed entry.",
    )


class HAGPUCBPolicy(Policy):
    """Hessian-aware additive GP-UCB: the structure from finite differences of the reward, or
    from the surrogate Hessian of the devices' controller."""

    name = "hagpucb"
    Settings = HAGPUCBSettings
    handles_block_limits = True  # phase 1 within it (module docstring), phase 2 greedy

    def __init__(self, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(spec, settings)
        check_parameter_experiment(spec, self.name)
        self.dim = len(spec.action_names)
        self.bounds = action_bounds(spec)
        self.structure: Structure | None = None
        self._ucb: AdditiveUCB | None = None
        self.controller: Controller | None = None
        self._states: torch.Tensor | None = None  # the recorded states, (S, agents, obs)
        self._pairs: Pairs = all_pairs(self.dim)
        self._directions: torch.Tensor | None = None
        self._phase_one_facts: dict[str, Any] = {}  # phase 1's timing, for the first proposal
        self._plan: StencilPlan | None = None  # None: the surrogate's phase 1 plays no episode
        self._visited: list[torch.Tensor] = []  # the devices' traces, each (T, agents, obs)
        self._visited_rows = 0  # Σ T over them
        if self.settings.visited_states and self.settings.controller is None:
            raise ValueError(
                f"{self.name}: policy.settings.visited_states: needs a controller (the "
                "surrogate Hessian is the only phase 1 that uses states)"
            )
        if self.settings.controller is not None:
            self.controller, self._states = self._surrogate_setup()
        else:
            self._plan = self._phase_one_plan()

    @property
    def phase_one_rounds(self) -> int:
        """Episodes of phase 1: T0 · C1 · (1 + D + the pairs queried); 0 with a controller."""
        return 0 if self._plan is None else len(self._plan)

    def _surrogate_setup(self) -> tuple[Controller, torch.Tensor | None]:
        """The controller and the recorded states; a user mistake is a ValueError naming it."""
        s = self.settings
        assert s.controller is not None
        try:
            found = controller(s.controller)
        except KeyError as error:
            raise ValueError(f"{self.name}: policy.settings.{error.args[0]}") from None
        if s.visited_states and s.states_file is not None:
            raise ValueError(
                f"{self.name}: policy.settings: visited_states and states_file both name the "
                "states of the surrogate Hessian; set one"
            )
        if found.dim != self.dim:
            raise ValueError(
                f"{self.name}: policy.settings.controller: {found.name} has {found.dim} "
                f"parameters, the spec's θ {self.dim}"
            )
        if s.states_file is None:
            return found, None
        path = Path(s.states_file)
        try:
            states = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise ValueError(
                f"{self.name}: policy.settings.states_file: cannot read {path}: {error}"
            ) from None
        shape = (found.agents, found.obs)
        if states.ndim != 3 or states.shape[1:] != shape or states.shape[0] < 1:
            raise ValueError(
                f"{self.name}: policy.settings.states_file: {path} holds an array of shape "
                f"{list(states.shape)}, not [S, {shape[0]}, {shape[1]}]"
            )
        if not np.isfinite(states).all():
            raise ValueError(f"{self.name}: policy.settings.states_file: {path} holds NaN or inf")
        return found, torch.as_tensor(states, dtype=torch.float64)

    def states_shape(self) -> tuple[int, int] | None:
        """(agents, obs) of the controller's states where phase 1 waits for visited ones."""
        if self.controller is None or not self.settings.visited_states:
            return None
        return self.controller.agents, self.controller.obs

    def observe_states(self, round: int, states: Any) -> None:
        """Keep a device's trace (numpy (T, agents, obs)) for the surrogate Hessian's queries;
        those arriving after phase 1 ran are kept too, but the structure is not learnt again."""
        trace = torch.as_tensor(np.asarray(states, dtype=np.float64))
        self._visited.append(trace)
        self._visited_rows += int(trace.shape[0])

    def _phase_one_plan(self) -> StencilPlan:
        """The stencils of phase 1 (`policies._stencil_plan`: no point is built here)."""
        s = self.settings
        g = torch.Generator().manual_seed(self.spec.initial_design.seed)
        lower, span = self.bounds[:, 0], self.bounds[:, 1] - self.bounds[:, 0]
        limit = self.spec.constraints.max_interventions
        if limit is not None:  # one stencil at the default θ (module docstring)
            assert self.spec.parameters is not None
            reference = torch.tensor(self.spec.parameters.reference, dtype=torch.float64)
            base = (reference - lower) / span
            self._directions = torch.where(base + s.step <= 1.0, 1.0, -1.0).to(torch.float64)
            self._pairs = self._admissible_pairs(limit)
            steps = self._directions * s.step * span  # declared units
            # untouched coordinates hold the default exactly
            low, high = reference.unsqueeze(0), (reference + steps).unsqueeze(0)
            return StencilPlan(low, high, s.t0 * s.c1, self._pairs)
        bases = [
            torch.rand(self.dim, generator=g, dtype=torch.float64) * (1.0 - s.step)
            for _ in range(s.t0)
        ]  # unit cube; the stencil steps every coordinate up by h
        low = torch.stack([lower + base * span for base in bases])
        high = torch.stack([lower + (base + s.step) * span for base in bases])
        return StencilPlan(low, high, s.c1, self._pairs)

    def _admissible_pairs(self, limit: int) -> Pairs:
        """The pairs whose stencil point changes at most `limit` blocks of θ."""
        assert self.spec.parameters is not None
        unit_of = torch.empty(self.dim, dtype=torch.long)
        for k, (start, stop) in enumerate(self.spec.parameters.units.values()):
            unit_of[start:stop] = k
        rows, cols = all_pairs(self.dim)
        keep = (unit_of[rows] == unit_of[cols]) | (limit >= 2)
        return rows[keep], cols[keep]

    # ------------------------------------------------------------------ propose
    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        if self.structure is None and self.controller is not None:
            if self._visited_rows < self.settings.visited_states:
                return self._phase_zero_proposal(constraints, rng)
            self._learn_surrogate_structure()
        if self.structure is None:
            assert self._plan is not None
            rewards, played = self._phase_one_progress(model)
            if len(rewards) < self._plan.bases * self._plan.size:
                return self._phase_one_proposal(rewards, played, constraints)
            self._learn_structure(rewards)
        assert self._ucb is not None and self.structure is not None
        proposal = self._ucb.propose(model, constraints, rng)
        proposal.diagnostics.update(
            phase=2,
            edges=[list(e) for e in self.structure.edges],
            edges_dropped=self.structure.dropped,
            **self._phase_one_facts,
        )
        self._phase_one_facts = {}  # reported once, with the first decision of phase 2
        return proposal

    def _phase_zero_proposal(self, constraints: Constraints, rng: torch.Generator) -> Proposal:
        """While fewer than `visited_states` states have arrived: θ uniform in the box, an
        episode like any other (charged, in phase 2's GP), whose states the device sends back."""
        lower, upper = self.bounds[:, 0], self.bounds[:, 1]
        theta = lower + torch.rand(self.dim, generator=rng, dtype=torch.float64) * (upper - lower)
        intervention = dict(zip(self.spec.action_names, theta.tolist(), strict=True))
        cost = intervention_cost(self.spec, intervention)
        if cost > constraints.round_cap * (1 + 1e-12) + 1e-12:
            raise NothingAffordable(f"a round costs {cost:g}, {constraints.round_cap:g} is left")
        diagnostics = {
            "phase": 0,
            "visited_states": self._visited_rows,
            "waiting_for": self.settings.visited_states,
        }
        return Proposal(intervention, math.nan, cost, tuple(self.spec.action_names), diagnostics)

    def _phase_one_progress(self, model: NetworkModel) -> tuple[dict[Entry, float], set[Entry]]:
        """Each stencil point's reward (the mean where it was played several times), by entry
        of the plan, and the entries played (with or without a reward)."""
        assert self._plan is not None
        names, reward = self.spec.action_names, model.reward_node
        seen: dict[Entry, list[float]] = {}
        played: set[Entry] = set()
        for record in model.history:
            entries = self._plan.match(key(record.intervention.get(n, 0.0) for n in names))
            played.update(entries)
            if reward in record.readings:
                for entry in entries:
                    seen.setdefault(entry, []).append(float(record.readings[reward]))
        return {entry: sum(v) / len(v) for entry, v in seen.items()}, played

    def _phase_one_proposal(
        self, rewards: dict[Entry, float], played: set[Entry], constraints: Constraints
    ) -> Proposal:
        """The first point of the plan not played yet, else the first without a reward."""
        plan = self._plan
        assert plan is not None
        pick = _first_index_not_in(plan, played)
        if pick is None:
            pick = _first_index_not_in(plan, set(rewards))
        assert pick is not None  # some entry has no reward
        left = len(plan) - plan.repeats * len(rewards)
        intervention = dict(zip(self.spec.action_names, plan.point(pick).tolist(), strict=True))
        cost = intervention_cost(self.spec, intervention)
        if cost > constraints.round_cap * (1 + 1e-12) + 1e-12:
            raise NothingAffordable(f"a round costs {cost:g}, {constraints.round_cap:g} is left")
        return Proposal(
            intervention,
            math.nan,
            cost,
            tuple(self.spec.action_names),
            {"phase": 1, "query": pick, "queries": len(plan), "left": left},
        )

    def _learn_structure(self, rewards: dict[Entry, float]) -> None:
        s, plan = self.settings, self._plan
        assert plan is not None
        table = [[rewards[(base, j)] for j in range(plan.size)] for base in range(plan.bases)]
        # one row per stencil played, in the plan's order: each base's row `repeats` times
        values = torch.tensor(table, dtype=torch.float64).repeat_interleave(plan.repeats, dim=0)
        total = sum(
            hessian_from_stencil(v, self.dim, s.step, self._pairs, self._directions) for v in values
        )
        assert isinstance(total, torch.Tensor)
        self.structure = structure_from_hessian(
            total, self._threshold(total, len(values)), max_edges=s.max_edges
        )
        self._ucb = AdditiveUCB(self.spec, self.structure.groups, s)

    def _learn_surrogate_structure(self) -> None:
        """Phase 1 from the controller's surrogate Hessian (module docstring)."""
        s, found = self.settings, self.controller
        assert found is not None
        started = time.perf_counter()
        g = torch.Generator().manual_seed(self.spec.initial_design.seed)
        lower, span = self.bounds[:, 0], self.bounds[:, 1] - self.bounds[:, 0]
        low, high = found.state_bounds
        total = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        pool = self._states
        if s.visited_states:  # the devices' own traces (list copied: the join appends)
            pool = torch.cat(list(self._visited))
        for _ in range(s.t0):
            theta = lower + torch.rand(self.dim, generator=g, dtype=torch.float64) * span
            for _ in range(s.c1):
                if pool is not None:
                    pick = torch.randint(len(pool), (s.states,), generator=g)
                    states = pool[pick]
                else:
                    shape = (s.states, found.agents, found.obs)
                    unit = torch.rand(shape, generator=g, dtype=torch.float64)
                    states = low + (high - low) * unit
                total += surrogate_hessian(found.actions, theta, states)
        total *= span[:, None] * span[None, :]  # ∂²π in the unit cube of the bounds
        largest = float(total.max())
        self.structure = structure_from_hessian(
            total, s.tolerance * largest if largest > 0 else 0.0, max_edges=s.max_edges
        )
        self._ucb = AdditiveUCB(self.spec, self.structure.groups, s)
        self._phase_one_facts = {
            "structure_from": f"surrogate:{found.name}",
            "structure_seconds": time.perf_counter() - started,
            "hessian_queries": s.t0 * s.c1,
            "states_from": (
                "visited"
                if s.visited_states
                else "states_file"
                if self._states is not None
                else "box"
            ),
        }

    def _threshold(self, total: torch.Tensor, queries: int) -> float:
        """c_h: the paper's, with the known or the estimated noise (see the module docstring)."""
        s = self.settings
        std = self.spec.node(self.spec.reward.node).noise_std
        rows, cols = self._pairs  # the entries queried (the others are 0 by construction)
        magnitude = total[rows, cols].abs()
        floor = 1e-9 * float(magnitude.max()) if magnitude.numel() else 0.0
        if std is not None and std > 0:
            return max(cutoff(queries, float(std), s.step, self.dim, s.delta), floor)
        if magnitude.numel() == 0:
            return 0.0
        # the std of one summed entry, estimated robustly; c_h = that · √(2 log(2D²/δ))
        spread = float(magnitude.median()) / _MAD
        return max(spread * math.sqrt(2.0 * math.log(2.0 * self.dim**2 / s.delta)), floor)


def _first_index_not_in(plan: StencilPlan, entries: set[Entry]) -> int | None:
    """The first index of the plan whose entry is not in `entries` (a base's repeats share its
    entries, so only its first play is looked at); the scan is bounded by len(entries)."""
    for base in range(plan.bases):
        j = 0
        while j < plan.size and (base, j) in entries:
            j += 1
        if j < plan.size:
            return plan.first_index((base, j))
    return None
