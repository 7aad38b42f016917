"""Hyperband (Li et al. 2017; paper 001's HB baseline): η = 3, R = 81, Optuna's
`HyperbandPruner` over trials of one θ at growing fidelity.

A Hyperband *configuration* is a θ drawn by Optuna's seeded `RandomSampler` (an
`optuna.Study` driven by ask/tell, in memory). Its resource r ∈ {1, η, …, R} is a trial
length: r units of τ_max / R interactions, rounded up to the next fidelity level of the spec
(𝒯 is finite, so every proposal is admissible; paper 001 leaves τ_min open and its code uses
τ_max / 2 units, which no finite 𝒯 admits). Each round runs the current configuration once,
for q_max replications, at the next level its resources need; the mean is reported to Optuna
at the largest resource that level covers, and Optuna's successive-halving rule of the
configuration's bracket (five brackets for R / r_min = 81 = 3⁴) decides at every rung it
passed whether the configuration goes on (a longer trial, run from scratch: trials do not
resume) or stops. A configuration that reaches R is complete; then a new θ is asked for.

Optuna's brackets are asynchronous (ASHA-style promotion against the values seen so far at a
rung), which is what fits a loop of one trial per round: a synchronous bracket would have to
run all of its n configurations before promoting any.

State: the study lives in the policy object; the rounds it issued are matched to
`model.history` in order (a round whose reward reading never arrived stops its configuration
as failed). A restarted agent starts new brackets: the trials before it still inform the
recommendation argmax_θ μ(θ, τ_max) of the (θ, τ) GP, which Hyperband itself never uses. When
the next level of the configuration does not fit the round cap, the configuration is dropped
and a new one starts at the cheapest level; nothing affordable at all ends the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field

from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies._fidelity import _fidelity
from policies.base import (
    Constraints,
    NothingAffordable,
    Policy,
    PolicySettings,
    Proposal,
)

__all__ = ["Hyperband"]

_TOL = 1e-12


class HyperbandSettings(PolicySettings):
    """Settings of Hyperband."""

    eta: int = Field(default=3, ge=2, description="Reduction factor η of successive halving.")
    max_resource: int = Field(
        default=81, ge=1, description="R: resources of a configuration run at τ_max."
    )
    replications: int | None = Field(
        default=None,
        ge=1,
        description="Replications q of every trial (one of the spec's); null: q_max.",
    )


@dataclass
class _Issued:
    """A round this policy proposed: the Optuna trial and the resource its level covers."""

    trial: Any  # optuna.trial.Trial
    resource: int
    last: bool  # the configuration reaches R with this round


class Hyperband(Policy):
    """Hyperband over θ with the fidelity τ as its resource, via Optuna's pruner."""

    name = "hyperband"
    Settings = HyperbandSettings

    def __init__(self, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(spec, settings)
        # Imported here: the registry imports every policy module, and Optuna takes a second.
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self.fidelity = _fidelity(spec)
        q = self.settings.replications
        if q is None:
            q = self.fidelity.q_max
        elif q not in self.fidelity.replications:
            raise ValueError(
                f"hyperband: replications {q} is not one of the spec's {self.fidelity.replications}"
            )
        self.q = int(q)
        self.rungs = self.resource_levels()
        self.study = optuna.create_study(
            study_name=f"hyperband-{spec.name}",  # the pruner's brackets hash this name
            direction="maximize",
            sampler=optuna.samplers.RandomSampler(seed=spec.initial_design.seed),
            pruner=optuna.pruners.HyperbandPruner(
                min_resource=1,
                max_resource=self.settings.max_resource,
                reduction_factor=self.settings.eta,
            ),
        )
        self._issued: list[_Issued] = []
        self._base: int | None = None  # len(model.history) at the first proposal
        self._current: Any = None  # the running configuration's trial
        self._reached = 0  # the largest resource it has been reported at
        self._reported = 0  # issued rounds whose row has been read

    def resource_levels(self) -> list[tuple[float, int]]:
        """(τ, largest resource r it covers) for each level some r ∈ {1, η, …, R} needs, in
        increasing τ: r units of τ_max / R, rounded up to the next level of 𝒯."""
        eta, top = self.settings.eta, self.settings.max_resource
        resources = sorted({min(eta**k, top) for k in range(int(math.log(top, eta)) + 2)})
        covered: dict[float, int] = {}
        for r in resources:
            wanted = self.fidelity.tau_max * r / top
            tau = min(t for t in self.fidelity.levels if t >= wanted * (1 - _TOL))
            covered[tau] = max(covered.get(tau, 0), r)
        return sorted(covered.items())

    # ------------------------------------------------------------------ the loop
    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        self._learn(model)
        cost = {tau: self.fidelity.cost(tau, self.q) for tau, _ in self.rungs}
        cap = constraints.round_cap * (1 + _TOL) + _TOL
        cheapest, first_resource = self.rungs[0]
        if cost[cheapest] > cap:
            raise NothingAffordable(
                f"hyperband: the cheapest trial costs {cost[cheapest]:g}, over the round cap "
                f"{constraints.round_cap:g}"
            )
        step = self._next_level()
        if step is not None and cost[step[0]] > cap:
            # The configuration's next level no longer fits: drop it, start a cheap one.
            self.study.tell(self._current, state=self._optuna.trial.TrialState.PRUNED)
            self._current, step = None, None
        if step is None:
            self._current = self.study.ask(self._space())
            self._reached = 0
            step = (cheapest, first_resource)
        tau, resource = step
        last = resource >= self.settings.max_resource
        self._issued.append(_Issued(self._current, resource, last))
        theta = self._current.params
        intervention = {name: 0.0 for name in self.spec.action_names}
        intervention.update({name: float(theta[name]) for name in self.spec.parameter_names})
        intervention[self.fidelity.action] = float(tau)
        intervention[self.fidelity.replications_action] = float(self.q)
        used = tuple(n for n, v in intervention.items() if v != 0.0)
        info = {
            "policy": self.name,
            "tau": float(tau),
            "replications": self.q,
            "configuration": self._current.number,
            "resource": resource,
        }
        return Proposal(intervention, math.nan, cost[tau], used, info)

    def _space(self) -> dict[str, Any]:
        dists = self._optuna.distributions
        return {
            name: dists.FloatDistribution(*self.spec.action(name).bounds)
            for name in self.spec.parameter_names
        }

    def _next_level(self) -> tuple[float, int] | None:
        """(τ, resource) of the running configuration's next round; None when none runs."""
        if self._current is None:
            return None
        for tau, resource in self.rungs:
            if resource > self._reached:
                return tau, resource
        return None

    def _learn(self, model: NetworkModel) -> None:
        """Report the readings of the rounds issued since the last call to Optuna."""
        if self._base is None:
            self._base = len(model.history)
        reward = self.spec.reward.node
        done = self._base + self._reported
        for index in range(done, min(len(model.history), self._base + len(self._issued))):
            issued = self._issued[index - self._base]
            row = model.history[index]
            self._reported += 1
            if issued.trial is not self._current:
                continue  # a configuration already stopped (never: one round at a time)
            states = self._optuna.trial.TrialState
            if reward not in row.readings:
                self.study.tell(issued.trial, state=states.FAIL)
                self._current = None
                continue
            value = float(row.readings[reward])
            issued.trial.report(value, issued.resource)
            self._reached = issued.resource
            if issued.last:
                self.study.tell(issued.trial, value)
                self._current = None
            elif issued.trial.should_prune():
                self.study.tell(issued.trial, state=states.PRUNED)
                self._current = None
