"""The contract every simulated environment keeps.

Vocabulary (shared with the experiment spec, `core.spec`):
  node      a scalar variable of the causal graph, observed every round; one node is the reward.
  action    a knob the agent can turn. Soft interventions: an action is an extra input of the
            nodes it `targets` (value 0 means "no intervention"). Hard interventions: an action
            sets its single target node, do(X = value), cutting it from its parents.
  target set (hard interventions only) an allowed combination of actions used together; the
            empty set means a purely observational round.

An *intervention* is a mapping action name -> value in declared units. Soft: a missing action is
0. Hard: the keys are exactly the actions used this round and must form an allowed target set.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

Intervention = Mapping[str, float]


@dataclass(frozen=True)
class NodeInfo:
    """A node of the environment's DAG.

    Attributes:
        name: unique node name.
        parents: names of parent nodes (must come earlier in `Environment.nodes`).
        noise_std: standard deviation of the node's additive noise as the *model* should assume
            it (known noise, as in the papers); 0 for a noiseless node.
        bounds: (low, high) typical range of the node's value, used to scale GP inputs of its
            children. Values may fall outside; the range only needs to be representative.
        shape: an array node's shape (paper 002): its reading is an array, `bounds` holding
            for each element; None for a scalar node.
    """

    name: str
    parents: tuple[str, ...]
    noise_std: float
    bounds: tuple[float, float]
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ActionInfo:
    """An action (actuator) of the environment.

    Attributes:
        name: unique action name.
        targets: soft: the nodes whose structural equation takes this action as an input;
            hard: a single node that the action sets.
        bounds: (low, high) admissible values in declared units.
        cost: fixed cost of using the action in one round (soft: a nonzero value; hard: being
            in the target set).
        cost_per_unit: additional cost per unit of |value| (e.g. vaccine doses per unit rate).
    """

    name: str
    targets: tuple[str, ...]
    bounds: tuple[float, float]
    cost: float = 1.0
    cost_per_unit: float = 0.0


@dataclass(frozen=True)
class Optimum:
    """The best intervention and its expected reward E[y | a*]."""

    intervention: dict[str, float]
    value: float


@dataclass(eq=False)  # identity semantics: environments are hashable and cache per instance
class Environment(ABC):
    """A simulated system: a DAG of scalar nodes, actions, a reward node and an oracle.

    Subclasses declare the structure in `__post_init__`-free class attributes or via the
    constructor and implement `_sample` and `expected_reward`.
    """

    name: str
    intervention_type: Literal["soft", "hard"]
    nodes: tuple[NodeInfo, ...]
    actions: tuple[ActionInfo, ...]
    reward_node: str
    target_sets: tuple[tuple[str, ...], ...] = ()
    description: str = ""
    # Decomposed reward (paper 003): the reward node is a known deterministic function g of
    # these component nodes, each observed with its own noise. Empty: the reward is a plain node.
    reward_components: tuple[str, ...] = ()
    # A finite set of admissible joint actions, (N, len(actions)) in `actions` order, for
    # discrete domains (a grid, a set of sensor locations); None means the box of the bounds.
    candidates: torch.Tensor | None = None
    _node_index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._node_index = {node.name: i for i, node in enumerate(self.nodes)}
        self._check_structure()

    # ----------------------------------------------------------------- structure
    def _check_structure(self) -> None:
        seen: set[str] = set()
        for node in self.nodes:
            missing = [p for p in node.parents if p not in seen]
            if missing:
                raise ValueError(
                    f"{self.name}: node {node.name} has parents {missing} that do "
                    "not precede it (nodes must be in topological order)"
                )
            seen.add(node.name)
        if self.reward_node not in seen:
            raise ValueError(f"{self.name}: reward node {self.reward_node!r} is not a node")
        for action in self.actions:
            unknown = [t for t in action.targets if t not in seen]
            if unknown:
                raise ValueError(f"{self.name}: action {action.name} targets unknown {unknown}")
            if self.intervention_type == "hard" and len(action.targets) != 1:
                raise ValueError(f"{self.name}: hard action {action.name} must set one node")

    @property
    def action_names(self) -> tuple[str, ...]:
        return tuple(action.name for action in self.actions)

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.nodes)

    def action(self, name: str) -> ActionInfo:
        for action in self.actions:
            if action.name == name:
                return action
        raise KeyError(f"{self.name}: no action named {name!r}")

    def validate(self, intervention: Intervention) -> dict[str, float]:
        """Check names, bounds and (hard) target sets; return a plain dict of floats.

        Raises:
            ValueError: naming the offending action and why.
        """
        values = {str(k): float(v) for k, v in intervention.items()}
        for name, value in values.items():
            if name not in self.action_names:
                raise ValueError(f"{self.name}: unknown action {name!r}")
            low, high = self.action(name).bounds
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(f"{self.name}: action {name}={value} outside [{low}, {high}]")
        if self.candidates is not None:
            self._check_candidate(values)
        if self.intervention_type == "hard":
            allowed = {frozenset(s) for s in self.target_sets}
            if frozenset(values) not in allowed:
                raise ValueError(
                    f"{self.name}: {sorted(values)} is not an allowed target set "
                    f"(allowed: {[sorted(s) for s in self.target_sets]})"
                )
        return values

    def _check_candidate(self, values: dict[str, float]) -> None:
        point = torch.tensor(
            [values.get(name, 0.0) for name in self.action_names], dtype=self.candidates.dtype
        )
        span = torch.tensor([a.bounds[1] - a.bounds[0] for a in self.actions], dtype=point.dtype)
        gap = ((self.candidates - point).abs() / span).amax(-1).min()
        if gap > 1e-9:
            raise ValueError(
                f"{self.name}: {values} is not one of the {len(self.candidates)} "
                "admissible candidates"
            )

    def cost(self, intervention: Intervention) -> float:
        """Cost of an intervention: fixed cost of each used action plus its per-unit cost."""
        total = 0.0
        for name, value in intervention.items():
            action = self.action(name)
            used = self.intervention_type == "hard" or value != 0.0
            total += (action.cost if used else 0.0) + action.cost_per_unit * abs(float(value))
        return total

    # ----------------------------------------------------------------- dynamics
    def step(
        self, intervention: Intervention, generator: torch.Generator | None = None
    ) -> dict[str, Any]:
        """Apply an intervention once; return one noisy reading of every node (a float, or for
        an array node a float64 numpy array of its shape)."""
        values = self.validate(intervention)
        sample = self._sample(values, 1, generator)
        shaped = {node.name for node in self.nodes if node.shape is not None}
        return {
            name: sample[name][0].detach().numpy().copy()
            if name in shaped
            else float(sample[name][0])
            for name in self.node_names
        }

    def step_with_spread(
        self, intervention: Intervention, generator: torch.Generator | None = None
    ) -> tuple[dict[str, Any], dict[str, tuple[float, int]]]:
        """`step`, and for each node whose reading is a mean over replications the variance of
        that mean and their count (none here; paper 001's domains override it)."""
        return self.step(intervention, generator), {}

    def sample(
        self, intervention: Intervention, num: int, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """`num` independent noisy readings of every node: name -> (num,) float64 tensor."""
        return self._sample(self.validate(intervention), num, generator)

    @abstractmethod
    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        """Draw `num` samples of every node under a validated intervention."""

    @abstractmethod
    def expected_reward(self, intervention: Intervention) -> float:
        """The oracle: the objective regret is defined on (deterministic).

        For a plain reward node, E[y | intervention] (closed form or quadrature). For a decomposed
        reward (paper 003), g(E[f_1 | a], ..., E[f_J | a]), the noiseless composed objective.
        """

    @abstractmethod
    def _compute_optimum(self) -> Optimum:
        """Search for the best intervention (called once; the result is cached)."""

    @functools.cached_property
    def optimum(self) -> Optimum:
        """max over admissible interventions of E[y | a], computed once and cached."""
        return self._compute_optimum()

    @abstractmethod
    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """The paper's initial design: the interventions run before the policy takes over."""

    # ----------------------------------------------------------------- decomposed rewards
    @property
    def reward_kind(self) -> Literal["node", "linear", "general"]:
        """How the reward arises: a plain node, or g of components (paper 003)."""
        return "node"

    def compose_reward(self, components: torch.Tensor) -> torch.Tensor:
        """g(f_1, ..., f_J): (..., J) component values -> (...) reward; torch-differentiable."""
        raise NotImplementedError(f"{self.name}: the reward is a plain node, not decomposed")

    def reward_derivative_bounds(self) -> list[float]:
        """B_j ≥ |∂g/∂f_j| over the components' ranges (paper 003, Alg. 4)."""
        raise NotImplementedError(f"{self.name}: the reward is a plain node, not decomposed")
