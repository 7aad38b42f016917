"""CMA-ES (Hansen's `cma` package): the standard black-box policy-search baseline of paper 000.

Each round plays one candidate of the current generation: the strategy asks for λ candidates
(`popsize`, default 4 + ⌊3 ln D⌋) in the unit cube of the actions' bounds, the policy proposes
them one by one, and once every candidate's reward is in the history the strategy is told
−reward (CMA-ES minimizes) and asks for the next generation. A candidate whose round ended
without a reward is proposed again after the generation's others. The strategy starts at the
best point observed so far (the centre of the box without data) with step size `sigma0`.

Under a block limit (`constraints.max_interventions` with a `parameters` vector: at most k blocks
of θ changed from its default), every candidate the strategy asks for is projected onto the
admissible set before it is played — its k blocks that moved farthest from the default kept, the
others set back to it (`policies._blocks.nearest_units`) — and the strategy is told the projected
candidates, the points actually played (pycma takes solutions other than the ones it asked for,
a repair, and bounds their Mahalanobis length itself).

The strategy's state lives in this object: after a restart of the agent a new strategy starts
from the best observed point, which loses the covariance learned before (the history itself is
kept by the agent and seeds the start).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import cma
import numpy as np
import torch
from pydantic import Field

from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies._additive_ucb import action_bounds, check_parameter_experiment
from policies._blocks import keep_units, nearest_units
from policies.base import (
    Constraints,
    NothingAffordable,
    Policy,
    PolicySettings,
    Proposal,
    intervention_cost,
)


class CMAESSettings(PolicySettings):
    """CMA-ES settings."""

    sigma0: float = Field(
        default=0.3, gt=0, le=1, description="Initial step size, a fraction of each action's span."
    )
    popsize: int | None = Field(
        default=None, ge=2, description="Candidates per generation λ. null: 4 + ⌊3 ln D⌋."
    )


class CMAESPolicy(Policy):
    """Covariance matrix adaptation evolution strategy over a parameter vector, one candidate
    per round."""

    name = "cmaes"
    Settings = CMAESSettings
    handles_block_limits = True  # each candidate projected onto the admissible set

    def __init__(self, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(spec, settings)
        check_parameter_experiment(spec, self.name)
        self.bounds = action_bounds(spec)
        self.dim = len(spec.action_names)
        self._strategy: cma.CMAEvolutionStrategy | None = None
        self._generation: list[np.ndarray] = []  # unit-cube candidates of the generation
        self._limit: int | None = None  # blocks of θ a candidate may change (None: no limit)
        self.generations = 0

    def _unit(self, values: torch.Tensor) -> np.ndarray:
        lower, span = self.bounds[:, 0], self.bounds[:, 1] - self.bounds[:, 0]
        return ((values - lower) / span).numpy()

    def _declared(self, unit: np.ndarray) -> list[float]:
        """Declared values of a unit-cube candidate; under a block limit the units it leaves
        alone hold the default exactly (not its round trip through the unit cube)."""
        lower, span = self.bounds[:, 0], self.bounds[:, 1] - self.bounds[:, 0]
        clipped = torch.tensor(np.clip(unit, 0.0, 1.0), dtype=torch.float64)
        values = (lower + clipped * span).tolist()
        if self._limit is None:
            return values
        return keep_units(self.spec, values, nearest_units(self.spec, values, self._limit))

    def _ask(self) -> list[np.ndarray]:
        """The next generation, each candidate projected onto the block limit (if any)."""
        assert self._strategy is not None
        asked = list(self._strategy.ask())
        if self._limit is None:
            return asked
        return [self._unit(torch.tensor(self._declared(x), dtype=torch.float64)) for x in asked]

    def _key(self, values) -> tuple[float, ...]:
        return tuple(round(float(v), 9) for v in values)

    def _start(self, model: NetworkModel) -> None:
        names, reward = self.spec.action_names, model.reward_node
        best, x0 = -math.inf, np.full(self.dim, 0.5)
        for record in model.history:
            if reward in record.readings and record.readings[reward] > best:
                best = record.readings[reward]
                x0 = self._unit(torch.tensor([record.intervention.get(n, 0.0) for n in names]))
        options = {
            "bounds": [0.0, 1.0],
            "seed": self.spec.initial_design.seed + 1,  # cma treats seed 0 as "unseeded"
            "verbose": -9,
        }
        if self.settings.popsize is not None:
            options["popsize"] = self.settings.popsize
        self._strategy = cma.CMAEvolutionStrategy(
            np.clip(x0, 0.0, 1.0), self.settings.sigma0, options
        )
        self._generation = self._ask()

    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        if self._strategy is None:
            self._limit = constraints.max_blocks
            self._start(model)
        assert self._strategy is not None
        rewards, played = self._rewards(model)
        if all(r is not None for r in rewards):
            self._strategy.tell(self._generation, [-float(r) for r in rewards])
            self.generations += 1
            self._generation = self._ask()
            rewards, played = self._rewards(model)
        missing = [k for k, r in enumerate(rewards) if r is None]
        unplayed = [k for k in missing if self._keys[k] not in played]
        pick = (unplayed or missing)[0]
        intervention = dict(
            zip(self.spec.action_names, self._declared(self._generation[pick]), strict=True)
        )
        cost = intervention_cost(self.spec, intervention)
        if cost > constraints.round_cap * (1 + 1e-12) + 1e-12:
            raise NothingAffordable(f"a round costs {cost:g}, {constraints.round_cap:g} is left")
        return Proposal(
            intervention,
            math.nan,
            cost,
            tuple(self.spec.action_names),
            {
                "generation": self.generations,
                "candidate": pick,
                "popsize": len(self._generation),
                "sigma": float(self._strategy.sigma),
            },
        )

    def _rewards(self, model: NetworkModel) -> tuple[list[float | None], set[tuple[float, ...]]]:
        """The current generation's rewards (None: not read yet) and every played point."""
        self._keys = [self._key(self._declared(x)) for x in self._generation]
        names, reward = self.spec.action_names, model.reward_node
        seen: dict[tuple[float, ...], float] = {}
        played: set[tuple[float, ...]] = set()
        for record in model.history:
            key = self._key(record.intervention.get(n, 0.0) for n in names)
            played.add(key)
            if reward in record.readings:
                seen[key] = float(record.readings[reward])
        return [seen.get(k) for k in self._keys], played
