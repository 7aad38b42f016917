"""The experiment spec: one declarative YAML file per experiment, read into pydantic models.

A spec says everything the agent needs to run a system it has never seen: the nodes of the causal
graph and their parents, the actions (bounds, cost, which nodes they feed or set), the reward,
constraints, the model and policy settings. Unknown fields are errors, so typos surface; every
error names the offending field (`nodes[2].parents: unknown node 'X9'`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import networkx as nx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.errors import SpecError
from core.hyperfit import PriorName
from core.kernels import KernelName

SPEC_SCHEMA = "cbo-agent/experiment"
SPEC_VERSION = 1
_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError("bounds must be finite")
    if not low < high:
        raise ValueError(f"lower bound {low} must be below upper bound {high}")
    return bounds


class NodeSpec(_Strict):
    """A scalar variable of the causal graph, observed every round.

    `bounds` is the node's typical value range; it scales the node's value where it is an input
    of its children's models (values may fall outside). `valid_range`, if given, is what the
    sensor can physically report: readings outside it are rejected as faulty. `noise_std` is the
    known standard deviation of its observation noise; omit it to have the model learn it.
    """

    name: str = Field(pattern=_NAME_PATTERN)
    parents: list[str] = []
    bounds: tuple[float, float]
    valid_range: tuple[float, float] | None = None
    noise_std: float | None = Field(default=None, ge=0)

    _bounds = field_validator("bounds")(_check_bounds)
    _valid_range = field_validator("valid_range")(
        lambda value: None if value is None else _check_bounds(value)
    )


class ActionSpec(_Strict):
    """A knob the agent can turn.

    Soft interventions: the action is an extra input of each node in `targets` (0 = none).
    Hard interventions: the action sets its single target node, do(X = value).
    Cost of using it in a round: `cost` + `cost_per_unit` · |value|.
    """

    name: str = Field(pattern=_NAME_PATTERN)
    targets: list[str] = Field(min_length=1)
    bounds: tuple[float, float]
    cost: float = Field(default=1.0, ge=0)
    cost_per_unit: float = Field(default=0.0, ge=0)

    _bounds = field_validator("bounds")(_check_bounds)


class RewardSpec(_Strict):
    """The quantity to maximize: a node of the graph, or a known function g of components.

    Decomposed rewards (paper 003): `components` are nodes observed separately, each with its own
    GP, and the reward node's value is g(components) — it has no model of its own and its parents
    must be exactly the components. g is either
      linear:      Σ_j w_j · f_j, each weight a number or an expression in the action names
                   (known weights g_j(x));
      expression:  any arithmetic in the component names (`core.expression`), e.g. a perceived
                   temperature; `derivative_bounds` gives B_j ≥ |∂g/∂f_j| over the components'
                   ranges (needed by D-GP-UCB's nonlinear variance bound).
    """

    node: str
    components: list[str] = []
    aggregation: Literal["linear", "expression"] | None = None
    weights: list[float | str] | None = None
    expression: str | None = None
    derivative_bounds: list[float] | None = None

    @property
    def decomposed(self) -> bool:
        return bool(self.components)


class ConstraintSpec(_Strict):
    """Limits every proposal respects.

    max_interventions: at most this many actions used in one round (cardinality).
    budget_per_round / budget_total: caps on the cost of one round and of the whole experiment.
    """

    max_interventions: int | None = Field(default=None, ge=1)
    budget_per_round: float | None = Field(default=None, gt=0)
    budget_total: float | None = Field(default=None, gt=0)


class ModelSpec(_Strict):
    """Settings of every node's GP (see `core.gp.GPConfig`)."""

    kernel: KernelName = "matern52"
    priors: PriorName = "gamma"
    refit_every: int | None = Field(default=5, ge=1)
    misfit_z: float | None = Field(default=4.0, gt=0)
    window: int | None = Field(default=None, ge=2)


class PolicySpec(_Strict):
    """Which decision rule proposes interventions, and its settings (checked by the policy)."""

    name: str = "mcbo"
    settings: dict[str, Any] = {}


class InitialDesignSpec(_Strict):
    """Random admissible interventions run before the policy takes over."""

    rounds: int = Field(default=0, ge=0)
    seed: int = 0


class ScheduleSpec(_Strict):
    """How the agent paces an experiment on a live system.

    max_rounds: stop proposing after this many rounds (None: run until the budget is spent).
    pipeline: rounds in flight at once; pending actions enter the model as pending points.
    ack_timeout_s / ack_retries: re-publish an unacknowledged action (same id) this many times,
        then expire its round and release its budget.
    round_timeout_s: after the ack, close the round with whatever readings arrived by then
        (readings arriving later still teach the model).
    min_interval_s: at least this long between two actions (an actuator rate limit).
    """

    max_rounds: int | None = Field(default=None, ge=1)
    pipeline: int = Field(default=1, ge=1, le=64)
    ack_timeout_s: float = Field(default=10.0, gt=0)
    ack_retries: int = Field(default=3, ge=0)
    round_timeout_s: float = Field(default=30.0, gt=0)
    min_interval_s: float = Field(default=0.0, ge=0)


class ExperimentSpec(_Strict):
    """One experiment: graph, actions, reward, constraints, model and policy."""

    schema_: Literal["cbo-agent/experiment"] = Field(default=SPEC_SCHEMA, alias="schema")
    version: Literal[1] = SPEC_VERSION
    name: str = Field(pattern=_NAME_PATTERN)
    description: str = ""
    intervention: Literal["soft", "hard"]
    nodes: list[NodeSpec] = Field(min_length=1)
    actions: list[ActionSpec] = Field(min_length=1)
    target_sets: list[list[str]] | None = None
    candidates: list[list[float]] | None = None
    reward: RewardSpec
    constraints: ConstraintSpec = ConstraintSpec()
    model: ModelSpec = ModelSpec()
    policy: PolicySpec = PolicySpec()
    initial_design: InitialDesignSpec = InitialDesignSpec()
    schedule: ScheduleSpec = ScheduleSpec()

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _check_references(self) -> ExperimentSpec:
        problems = [
            *self._graph_problems(),
            *self._action_problems(),
            *self._target_set_problems(),
            *self._candidate_problems(),
        ]
        if self.reward.node not in self.node_names:
            problems.append(f"reward.node: unknown node {self.reward.node!r}")
        else:
            problems += self._reward_problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # ------------------------------------------------------------------ derived structure
    @property
    def node_names(self) -> list[str]:
        return [node.name for node in self.nodes]

    @property
    def action_names(self) -> list[str]:
        return [action.name for action in self.actions]

    def node(self, name: str) -> NodeSpec:
        return self.nodes[self.node_names.index(name)]

    def action(self, name: str) -> ActionSpec:
        return self.actions[self.action_names.index(name)]

    def graph(self) -> nx.DiGraph:
        """The DAG over nodes (edges parent -> child)."""
        graph = nx.DiGraph()
        graph.add_nodes_from(self.node_names)
        graph.add_edges_from((p, node.name) for node in self.nodes for p in node.parents)
        return graph

    def topological_order(self) -> list[str]:
        """Nodes in a topological order that keeps the spec's order where the graph allows."""
        rank = {name: i for i, name in enumerate(self.node_names)}
        return list(nx.lexicographical_topological_sort(self.graph(), key=rank.__getitem__))

    def allowed_target_sets(self) -> list[tuple[str, ...]]:
        """Hard: the declared target sets. Soft: every action together (values may be 0)."""
        if self.intervention == "hard":
            return [tuple(s) for s in self.target_sets or []]
        return [tuple(self.action_names)]

    # ------------------------------------------------------------------ checks
    def _graph_problems(self) -> list[str]:
        problems = []
        names = self.node_names
        for dup in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"nodes: duplicate node name {dup!r}")
        for i, node in enumerate(self.nodes):
            for parent in node.parents:
                if parent not in names:
                    problems.append(f"nodes[{i}].parents: unknown node {parent!r}")
                elif parent == node.name:
                    problems.append(f"nodes[{i}].parents: {node.name!r} cannot be its own parent")
        if not problems:
            try:
                cycle = nx.find_cycle(self.graph())
            except nx.NetworkXNoCycle:
                cycle = None
            if cycle:
                path = " -> ".join([edge[0] for edge in cycle] + [cycle[0][0]])
                problems.append(f"nodes: the graph has a cycle ({path})")
        return problems

    def _action_problems(self) -> list[str]:
        problems = []
        names = self.action_names
        for dup in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"actions: duplicate action name {dup!r}")
        for i, action in enumerate(self.actions):
            for target in action.targets:
                if target not in self.node_names:
                    problems.append(f"actions[{i}].targets: unknown node {target!r}")
            if self.intervention == "hard":
                if len(action.targets) != 1:
                    problems.append(f"actions[{i}].targets: a hard action sets exactly one node")
                elif action.targets[0] == self.reward.node:
                    problems.append(f"actions[{i}].targets: the reward node cannot be set")
        return problems

    def _reward_problems(self) -> list[str]:
        reward = self.reward
        given = [
            name
            for name in ("aggregation", "weights", "expression", "derivative_bounds")
            if getattr(reward, name) is not None
        ]
        if not reward.decomposed:
            return [
                f"reward.{name}: only a decomposed reward (with components) takes it"
                for name in given
            ]
        problems = []
        unknown = [c for c in reward.components if c not in self.node_names]
        if unknown:
            return [f"reward.components: unknown nodes {unknown}"]
        if sorted(self.node(reward.node).parents) != sorted(reward.components):
            problems.append(
                f"reward.components: must be exactly the parents of {reward.node!r} "
                f"({self.node(reward.node).parents})"
            )
        if reward.aggregation is None:
            problems.append("reward.aggregation: say 'linear' or 'expression'")
        elif reward.aggregation == "linear":
            problems += self._linear_reward_problems()
        else:
            problems += self._expression_reward_problems()
        bounds = reward.derivative_bounds
        if bounds is not None and (
            len(bounds) != len(reward.components)
            or any(not (b >= 0 and math.isfinite(b)) for b in bounds)
        ):
            problems.append(
                "reward.derivative_bounds: one finite, non-negative bound per component"
            )
        return problems

    def _linear_reward_problems(self) -> list[str]:
        from core.expression import ExpressionError, compile_expression

        reward = self.reward
        if reward.expression is not None:
            return ["reward.expression: a linear reward uses weights, not an expression"]
        weights = reward.weights or []
        if len(weights) != len(reward.components):
            return [
                f"reward.weights: one weight per component ({len(reward.components)}), "
                f"got {len(weights)}"
            ]
        problems = []
        for i, weight in enumerate(weights):
            if isinstance(weight, str):
                try:
                    compile_expression(weight, self.action_names)
                except ExpressionError as error:
                    problems.append(f"reward.weights[{i}]: {error}")
            elif not math.isfinite(weight):
                problems.append(f"reward.weights[{i}]: must be finite")
        return problems

    def _expression_reward_problems(self) -> list[str]:
        from core.expression import ExpressionError, compile_expression

        reward = self.reward
        if reward.weights is not None:
            return ["reward.weights: an expression reward takes no weights"]
        if not reward.expression:
            return ["reward.expression: required for aggregation 'expression'"]
        try:
            compile_expression(reward.expression, reward.components)
        except ExpressionError as error:
            return [f"reward.expression: {error}"]
        return []

    def _target_set_problems(self) -> list[str]:
        if self.intervention == "soft":
            if self.target_sets is not None:
                return ["target_sets: only hard interventions declare target sets"]
            return []
        if not self.target_sets:
            return [
                "target_sets: hard interventions need at least one target set ([] allows "
                "an observational round)"
            ]
        problems = []
        for i, targets in enumerate(self.target_sets):
            for name in targets:
                if name not in self.action_names:
                    problems.append(f"target_sets[{i}]: unknown action {name!r}")
            if len(set(targets)) != len(targets):
                problems.append(f"target_sets[{i}]: an action appears twice")
        return problems

    def _candidate_problems(self) -> list[str]:
        if self.candidates is None:
            return []
        if self.intervention == "hard":
            return ["candidates: a finite candidate set is for soft interventions"]
        if not self.candidates:
            return ["candidates: the list is empty"]
        problems = []
        for i, point in enumerate(self.candidates):
            if len(point) != len(self.actions):
                problems.append(
                    f"candidates[{i}]: expected {len(self.actions)} values "
                    f"(one per action), got {len(point)}"
                )
                continue
            for action, value in zip(self.actions, point, strict=True):
                low, high = action.bounds
                if not (math.isfinite(value) and low <= value <= high):
                    problems.append(
                        f"candidates[{i}]: {action.name}={value} outside [{low}, {high}]"
                    )
        return problems[:20]


def _describe(error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors():
        loc = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        problems.extend(f"{loc.lstrip('.')}: {m}" if loc else m for m in message.split("; "))
    return problems


def parse_spec(data: Any, source: str = "<spec>") -> ExperimentSpec:
    """Validate a mapping (already parsed YAML/JSON) into an ExperimentSpec.

    Raises:
        SpecError: listing every problem with the field it concerns.
    """
    if not isinstance(data, dict):
        raise SpecError(source, [f"the spec must be a mapping, got {type(data).__name__}"])
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(source, _describe(error)) from None


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate a YAML spec file.

    Raises:
        SpecError: for unreadable files, YAML syntax errors (with line and column) and every
            validation problem.
    """
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise SpecError(source, [f"cannot read: {error.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError(
            source, [f"{where}invalid YAML ({getattr(error, 'problem', error)})"]
        ) from None
    return parse_spec(data, source)
