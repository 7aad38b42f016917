"""The experiment spec: one declarative YAML file per experiment, read into pydantic models.

A spec says everything the agent needs to run a system it has never seen: the nodes of the causal
graph and their parents, the actions (bounds, cost, which nodes they feed or set), the reward,
constraints, the model and policy settings. Unknown fields are errors, so typos surface; every
error names the offending field (`nodes[2].parents: unknown node 'X9'`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import networkx as nx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.errors import SpecError
from core.hyperfit import PriorName
from core.kernels import KernelName
from core.plain_errors import plain_problems, unknown_name

SPEC_SCHEMA = "cbo-agent/experiment"
SPEC_VERSION = 1
_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
# The most elements an array node may have: what one reading carries (connectors.arrays keeps
# the same number; tests/test_spec_arrays.py checks they agree).
MAX_FIELD_ELEMENTS = 8_192
_DEVICE_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"  # an MQTT topic level: connectors.topics' rule
DEFAULT_DEVICE_PREFIX = "sim-"  # with no `devices`, the one device is `cbo-agent sim`'s default


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
    """A scalar variable of the causal graph, observed every round."""

    name: str = Field(
        pattern=_NAME_PATTERN,
        description="The node's name, as readings and other nodes' `parents` name it: 1 to 64 "
        "letters, digits, `_`, `.` or `-`, starting with a letter or `_`.",
    )
    parents: list[str] = Field(
        default=[],
        description="Names of the nodes whose values are inputs of this node's model (its "
        "parents in the causal graph). Empty for a root node.",
    )
    bounds: tuple[float, float] = Field(
        description="The node's typical range `[low, high]`; it scales the node's value where "
        "it is an input of its children's models. Readings may fall outside it.",
    )
    valid_range: tuple[float, float] | None = Field(
        default=None,
        description="What the sensor can physically report, `[low, high]`: readings outside it "
        "are rejected as faulty (`out_of_range`). Without it, only readings more than 10⁶ widths "
        "of `bounds` away are rejected.",
    )
    noise_std: float | None = Field(
        default=None,
        ge=0,
        description="The known standard deviation of the node's observation noise; leave it out "
        "to have the model learn it.",
    )
    shape: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=3,
        description="An array node (paper 002): its reading is an array of this shape, `[t]` "
        f"(a sensor vector) or `[c, h, w]` (a field), at most {MAX_FIELD_ELEMENTS} elements, "
        "sent as `cbo.reading` version 3. `bounds` and `valid_range` then hold for each "
        "element. An array node has no parents and is fed by the soft actions that target it; it "
        "is a component of a decomposed reward, a parent of scalar nodes, or both. A scalar "
        "child's GP sees the field through a fixed map (`core.field_features`): the field "
        "flattened when it has at most 16 elements, else at most 16 block means (each channel "
        "of a `[c, h, w]` field kept). null: a scalar node.",
    )

    _bounds = field_validator("bounds")(_check_bounds)

    @field_validator("shape")
    @classmethod
    def _check_shape(cls, shape: list[int] | None) -> list[int] | None:
        if shape is None:
            return None
        if any(n < 1 for n in shape):
            raise ValueError("every dimension must be at least 1")
        if math.prod(shape) > MAX_FIELD_ELEMENTS:
            raise ValueError(f"{math.prod(shape)} elements > limit of {MAX_FIELD_ELEMENTS}")
        return shape

    @property
    def is_array(self) -> bool:
        return self.shape is not None

    _valid_range = field_validator("valid_range")(
        lambda value: None if value is None else _check_bounds(value)
    )


class ActionSpec(_Strict):
    """A knob the agent can turn. Using it in a round costs `cost` + `cost_per_unit` · |value|."""

    name: str = Field(
        pattern=_NAME_PATTERN,
        description="The action's name: the key of `intervention` in the actions the agent "
        "publishes (see docs/protocol.md).",
    )
    targets: list[str] = Field(
        min_length=1,
        description="The nodes it acts on. Soft interventions: the action's value is an extra "
        "input of each of these nodes' models (0: not used). Hard interventions: exactly one "
        "node, which the action sets, do(node = value).",
    )
    bounds: tuple[float, float] = Field(
        description="The values the action may take, `[low, high]`. An action whose bounds "
        "exclude 0 cannot be switched off in a soft experiment: it is used every round.",
    )
    cost: float = Field(
        default=1.0,
        ge=0,
        description="Fixed cost of using the action in a round (soft: a nonzero value; hard: "
        "being in the chosen target set).",
    )
    cost_per_unit: float = Field(
        default=0.0, ge=0, description="Cost per unit of |value| on top of `cost`."
    )

    _bounds = field_validator("bounds")(_check_bounds)


MAX_PARAMETERS = 1000


class ParametersSpec(_Strict):
    """A parameter vector θ of dimension D (paper 000): the parameters of a controller the
    devices run, one round being one episode with θ.

    It stands for D soft actions named `{name}.0` … `{name}.{D-1}` (added to `actions` when the
    spec is read, so every policy, the ledger and recovery see them as actions), published
    together in one action message (docs/protocol.md, `vectors`). A round that sets θ costs
    `cost` once, whatever its values.
    """

    name: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,47}$",
        description="The vector's name; its coordinates are the actions `{name}.0` … "
        "`{name}.{D-1}`.",
    )
    dimension: int = Field(
        ge=1, le=MAX_PARAMETERS, description=f"D, the number of parameters (1 to {MAX_PARAMETERS})."
    )
    bounds: tuple[float, float] = Field(
        description="`[low, high]` of every coordinate (see `coordinate_bounds` for per-"
        "coordinate ones)."
    )
    coordinate_bounds: list[tuple[float, float]] | None = Field(
        default=None,
        description="Optional, one `[low, high]` per coordinate, overriding `bounds`.",
    )
    targets: list[str] = Field(
        min_length=1, description="The nodes whose models take θ as input (usually the reward)."
    )
    cost: float = Field(default=1.0, ge=0, description="Cost of one round (one episode).")
    blocks: dict[str, tuple[int, int]] = Field(
        default={},
        description="Optional named blocks of coordinates (the controller's sub-networks), each "
        "a half-open range `[start, stop)`; they may not overlap. Policies may use them as a "
        "given decomposition (`addgpucb`).",
    )
    default: float | list[float] = Field(
        default=0.0,
        description="θ's default, one number for every coordinate or one per coordinate: with "
        "`constraints.max_interventions`, a round changes at most that many blocks from it "
        "(a coordinate outside every block is a block of its own) and the others keep it.",
    )

    _bounds = field_validator("bounds")(_check_bounds)

    @field_validator("coordinate_bounds")
    @classmethod
    def _each_bounds(cls, value: list[tuple[float, float]] | None):
        if value is not None:
            for pair in value:
                _check_bounds(pair)
        return value

    @model_validator(mode="after")
    def _check_shape(self) -> ParametersSpec:
        problems = []
        if self.coordinate_bounds is not None and len(self.coordinate_bounds) != self.dimension:
            problems.append(
                f"coordinate_bounds: one pair per coordinate ({self.dimension}), "
                f"got {len(self.coordinate_bounds)}"
            )
        taken: list[tuple[int, int, str]] = []
        for block, (start, stop) in self.blocks.items():
            if not 0 <= start < stop <= self.dimension:
                problems.append(
                    f"blocks.{block}: [{start}, {stop}) is not within [0, {self.dimension})"
                )
                continue
            for other_start, other_stop, other in taken:
                if start < other_stop and other_start < stop:
                    problems.append(f"blocks.{block}: overlaps block {other!r}")
            taken.append((start, stop, block))
        if isinstance(self.default, list) and len(self.default) != self.dimension:
            problems.append(
                f"default: one value per coordinate ({self.dimension}), got {len(self.default)}"
            )
        elif not problems:  # the bounds are whole
            outside = [
                i
                for i, value in enumerate(self.reference)
                if not self.coordinate_bound(i)[0] <= value <= self.coordinate_bound(i)[1]
            ]
            if outside:
                problems.append(f"default: outside the bounds at coordinates {outside[:5]}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def coordinate_names(self) -> list[str]:
        return [f"{self.name}.{i}" for i in range(self.dimension)]

    def coordinate_bound(self, i: int) -> tuple[float, float]:
        return self.coordinate_bounds[i] if self.coordinate_bounds else self.bounds

    @property
    def reference(self) -> list[float]:
        """θ's default, one value per coordinate."""
        if isinstance(self.default, list):
            return [float(v) for v in self.default]
        return [float(self.default)] * self.dimension

    @property
    def units(self) -> dict[str, tuple[int, int]]:
        """What a block limit counts: the blocks, and every coordinate outside them as a block
        named after its action, as half-open ranges in θ's order."""
        covered = {i for start, stop in self.blocks.values() for i in range(start, stop)}
        lone = {f"{self.name}.{i}": (i, i + 1) for i in range(self.dimension) if i not in covered}
        return dict(sorted({**self.blocks, **lone}.items(), key=lambda item: item[1]))

    def changed_units(self, values: Mapping[str, float]) -> list[str]:
        """The units (`units`) where `values` (action name -> value) differ from the default;
        a coordinate missing from `values` counts as 0."""
        reference = self.reference
        names = self.coordinate_names
        return [
            unit
            for unit, (start, stop) in self.units.items()
            if any(float(values.get(names[i], 0.0)) != reference[i] for i in range(start, stop))
        ]


def _expand_parameters(data: Any) -> Any:
    """Add the D coordinate actions of a `parameters` section to `actions` (before validation)."""
    if not isinstance(data, dict) or not isinstance(data.get("parameters"), dict):
        return data
    try:
        params = ParametersSpec.model_validate(data["parameters"])
    except ValidationError:
        return data  # the field's own validation reports it
    actions = data.get("actions")
    declared = list(actions) if isinstance(actions, list) else []
    prefix = f"{params.name}."
    if any(isinstance(a, dict) and str(a.get("name", "")).startswith(prefix) for a in declared):
        declared = [
            a
            for a in declared
            if not (isinstance(a, dict) and str(a.get("name", "")).startswith(prefix))
        ]  # a spec written back (spec.model_dump) already holds them: rebuild them
    expanded = [
        {
            "name": name,
            "targets": list(params.targets),
            "bounds": list(params.coordinate_bound(i)),
            "cost": 0.0,
        }
        for i, name in enumerate(params.coordinate_names)
    ]
    return {**data, "actions": declared + expanded}


class RewardSpec(_Strict):
    """The quantity to maximize: a node of the graph, or a known function g of components.

    A decomposed reward (paper 003) names `components`, nodes observed separately, each with
    its own GP; the reward node's value is g(components): it has no model of its own, and its
    parents must be exactly the components. g is `linear`, Σ_j w_j · f_j with each weight a
    number or an expression in the action names (known weights g_j(x)), or an `expression` in
    the component names (`core.expression`), e.g. a perceived temperature, or a registered
    `function` (`core.field_metrics`). A component may be an array node (paper 002): an
    expression then reduces it with sum, mean, var, amax or amin, e.g. `-var(field)`.
    """

    node: str = Field(description="The node whose value is the reward.")
    components: list[str] = Field(
        default=[],
        description="Decomposed reward only: the nodes the reward is computed from (exactly the "
        "parents of `node`). Empty: the reward is the node's own reading.",
    )
    aggregation: Literal["linear", "expression", "function"] | None = Field(
        default=None,
        description="Decomposed reward only: how g combines the components, `linear` "
        "(`weights`), `expression` or a registered `function`.",
    )
    weights: list[float | str] | None = Field(
        default=None,
        description="`linear` only: one weight per component, a number or an arithmetic "
        "expression in the action names.",
    )
    expression: str | None = Field(
        default=None,
        description="`expression` only: g as arithmetic in the component names (+ - * / **, "
        "exp, log, sqrt, ...).",
    )
    function: str | None = Field(
        default=None,
        description="`function` only: the name of a registered metric of the components "
        "(`environmental_sse`, `weighted_variance`; see `core.field_metrics`).",
    )
    derivative_bounds: list[float] | None = Field(
        default=None,
        description="Optional, one per component: B_j ≥ |∂g/∂f_j| over the components' ranges, "
        "for D-GP-UCB's variance bound with a nonlinear g.",
    )
    optimum: Literal["fixed", "per_round"] = Field(
        default="fixed",
        description="What a simulator's oracle `optimum` is (docs/protocol.md, `cbo.oracle`). "
        "`fixed`: max_a E[y | a] of a stationary system, one number for the experiment: an "
        "oracle stating another is refused (`oracle_optimum_changed`). `per_round`: for a "
        "system that drifts, the optimum of the message's own round, f*_t; the regret of round "
        "t is f*_t − E[y_t | a_t] and `cbo_cumulative_regret` is the dynamic regret.",
    )

    @property
    def decomposed(self) -> bool:
        return bool(self.components)


class ConstraintSpec(_Strict):
    """Limits every proposal respects."""

    max_interventions: int | None = Field(
        default=None,
        ge=1,
        description="At most this many actions used in one round (soft: nonzero values; hard: "
        "the size of the target set); with a `parameters` vector, at most this many of its "
        "blocks changed from `parameters.default`. null: no limit.",
    )
    budget_per_round: float | None = Field(
        default=None, gt=0, description="Cap on the cost of one round. null: no cap."
    )
    budget_total: float | None = Field(
        default=None,
        gt=0,
        description="Cap on the cost of the whole experiment; it ends when nothing affordable "
        "is left. Never overspent, also across restarts. null: no cap.",
    )


class FidelitySpec(_Strict):
    """Trials of a chosen length τ on q parallel units (paper 001): a multi-fidelity experiment.

    Two of the spec's actions carry the trial's length and its replication count; every other
    action is a parameter of θ. A round's action holds θ, τ and q; the device runs q
    replications of length τ and reports their mean (and their variance, or how many it ran:
    docs/protocol.md). A round costs `setup_cost + unit_cost · q · τ`; the actions' own costs
    are not used. The recommendation is argmax_θ μ(θ, τ_max), τ_max the largest level.
    """

    action: str = Field(description="The action whose value is the trial's length τ.")
    levels: list[float] = Field(
        min_length=1,
        description="The finite fidelity set 𝒯: the lengths τ a trial may have (positive; the "
        "largest is τ_max, the fidelity the recommendation is made for).",
    )
    replications_action: str = Field(
        description="The action whose value is the number of replications q."
    )
    replications: list[int] = Field(
        min_length=1, description="The replication set 𝒬: the counts q a round may ask for."
    )
    setup_cost: float = Field(default=0.0, ge=0, description="Fixed cost of every round.")
    unit_cost: float = Field(
        default=1.0, gt=0, description="Cost per replication per unit of τ (q·τ by default)."
    )

    @field_validator("levels")
    @classmethod
    def _positive_levels(cls, levels: list[float]) -> list[float]:
        if any(not (math.isfinite(t) and t > 0) for t in levels):
            raise ValueError("every level must be a positive number")
        if len(set(levels)) != len(levels):
            raise ValueError("levels must differ")
        return sorted(levels)

    @field_validator("replications")
    @classmethod
    def _positive_counts(cls, counts: list[int]) -> list[int]:
        if any(q < 1 for q in counts) or len(set(counts)) != len(counts):
            raise ValueError("replications must be distinct counts of at least 1")
        return sorted(counts)

    @property
    def tau_max(self) -> float:
        return max(self.levels)

    @property
    def q_max(self) -> int:
        return max(self.replications)

    @property
    def q_min(self) -> int:
        return min(self.replications)

    def cost(self, tau: float, replications: float) -> float:
        """The cost of q replications of length τ: setup + unit · q · τ."""
        return self.setup_cost + self.unit_cost * float(replications) * float(tau)


class ChangeSpec(_Strict):
    """A Page-Hinkley test on each node's standardized predictive residuals (see
    `core.gp.change`)."""

    threshold: float = Field(
        default=30.0,
        gt=0,
        description="Alarm when the cumulative excess of z² over its expectation (1, plus "
        "`slack`) passes this. Larger: fewer false alarms, later detection.",
    )
    slack: float = Field(
        default=1.0,
        ge=0,
        description="Excess of z² per reading tolerated before it counts toward an alarm.",
    )
    keep: int = Field(
        default=10,
        ge=1,
        description="Readings a node keeps on an alarm, at least: the most recent (more when "
        "the test dates the change earlier: all readings since it).",
    )
    warmup: int = Field(
        default=20,
        ge=1,
        description="Readings a node learns (and again after every alarm) before its test runs.",
    )


class ModelSpec(_Strict):
    """Settings of every node's Gaussian process (see `core.gp.GPConfig`)."""

    kernel: KernelName = Field(
        default="matern52", description="Covariance function: `matern52` or `rbf`."
    )
    priors: PriorName = Field(
        default="gamma",
        description="Hyperparameter priors: `gamma` (BoTorch's classic Gamma priors) or "
        "`dim_scaled` (BoTorch's dimension-scaled log-normal lengthscale prior).",
    )
    refit_every: int | None = Field(
        default=5,
        ge=1,
        description="Refit a node's hyperparameters after this many new observations. null: "
        "only on a misfit.",
    )
    misfit_z: float | None = Field(
        default=4.0,
        gt=0,
        description="Also refit a node when a reading lies more than this many predictive "
        "standard deviations from its prediction. null: never.",
    )
    window: int | None = Field(
        default=None,
        ge=2,
        description="Keep at most this many observations per node, forgetting the oldest. null: "
        "keep all.",
    )
    capacity: int | None = Field(
        default=None,
        ge=2,
        description="Exact up to this many observations per node; past it a node keeps its "
        "`budget` most informative observations (the largest leave-one-out information), each "
        "reading then costing O(budget²) and memory staying flat. The switch is logged "
        "(`gp.bounded`). null: keep all. Excludes `window`.",
    )
    budget: int | None = Field(
        default=None,
        ge=2,
        description="Observations a node keeps once past its `capacity` (at most the capacity). "
        "null: the capacity.",
    )

    time_scale: float | None = Field(
        default=None,
        gt=0,
        description="Make every node's GP time-aware: the round a reading was taken is one more "
        "input of its kernel, scaled by this many rounds (`core.gp.temporal`), its lengthscale "
        "learned by the refits with the others, and the policies ask for the posterior at the "
        "round they propose. Readings older than a few learned lengthscales stop informing the "
        "present: for a system that drifts. Bound it with `window`, not `capacity` (old rows "
        "are far in time from every other and would look informative). null: stationary.",
    )
    period: float | None = Field(
        default=None,
        gt=0,
        description="With `time_scale`: a periodic factor in time of this many rounds (52 for "
        "a year of weekly rounds). The round also enters every node's GP as a point on a circle, "
        "(cos 2πt/period, sin 2πt/period), so that readings a whole period ago inform the "
        "present as much as the decay of `time_scale` lets them: last year's same season "
        "informs this one (`core.gp.temporal`; with `kernel: rbf` and equal lengthscales of "
        "the two columns it is the product with the exp-sine-squared kernel). null: none.",
    )
    change: ChangeSpec | None = Field(
        default=None,
        description="A change detector over each node's standardized predictive residuals "
        "(`core.gp.change`): on an alarm the node forgets its readings from before the change "
        "and refits. Each node's test (its statistic, warmup and alarms) and the rows it kept "
        "are in the model snapshot, so a restart continues them. null: none (a misfit still "
        "makes a refit due).",
    )

    @model_validator(mode="after")
    def _check_bound(self) -> ModelSpec:
        if self.capacity is not None and self.window is not None:
            raise ValueError("model.window and model.capacity exclude each other: set one")
        if self.time_scale is not None and self.capacity is not None:
            raise ValueError(
                "model.time_scale and model.capacity exclude each other: bound a time-aware "
                "model with model.window"
            )
        if self.period is not None and self.time_scale is None:
            raise ValueError("model.period needs a model.time_scale (the decay in time)")
        if self.budget is not None and (self.capacity is None or self.budget > self.capacity):
            raise ValueError("model.budget needs a model.capacity at least as large")
        return self


class PolicySpec(_Strict):
    """Which decision rule proposes interventions, and its settings."""

    name: str = Field(
        default="mcbo",
        description="The policy: `mcbo`, `eifn`, `eicbo` (hard interventions only), `gpucb`, "
        "`dgpucb` (a decomposed reward only) or `random` (`cbo-agent bench regret --list` lists "
        "them).",
    )
    settings: dict[str, Any] = Field(
        default={},
        description="The policy's settings (e.g. `beta`, `max_seconds`), checked by the policy: "
        "an unknown setting is an error.",
    )


def default_design_rounds(actions: int, max_rounds: int | None) -> int:
    """Random rounds before the policy when the spec does not say: 2·(actions + 1), a common
    rule for Bayesian optimization's initial design, but at most a third of `max_rounds`."""
    rounds = 2 * (actions + 1)
    if max_rounds is not None:
        rounds = min(rounds, max(max_rounds // 3, 1))
    return rounds


class InitialDesignSpec(_Strict):
    """Random admissible interventions run before the policy takes over.

    A model with no data cannot tell one intervention from another, so the first rounds explore
    at random; the policy decides from then on.
    """

    rounds: int | None = Field(
        default=None,
        ge=0,
        description="How many rounds are drawn at random before the policy decides. Left out: "
        "2 × (number of actions + 1), at most a third of `schedule.max_rounds`. 0: the policy "
        "decides from the first round.",
    )
    seed: int = Field(
        default=0,
        description="Seeds the experiment's random numbers: the design's draws and the policy's "
        "random starts.",
    )


class ScheduleSpec(_Strict):
    """How the agent paces an experiment on a live system."""

    max_rounds: int | None = Field(
        default=None,
        ge=1,
        description="Stop proposing after this many rounds; the service exits once they are "
        "closed (see `--keep-serving`). null: run until the budget is spent, or forever.",
    )
    pipeline: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Rounds in flight at once; the actions of rounds still waiting for readings "
        "enter the model as pending points.",
    )
    ack_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds to wait for an actuator's ack before publishing the action again "
        "(same id).",
    )
    ack_retries: int = Field(
        default=3,
        ge=0,
        description="Re-publications of an unacknowledged action; after them its round expires "
        "(at `expires_at`) and its budget is released.",
    )
    round_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds after the ack to wait for the round's readings; then the round "
        "closes with what arrived (later readings still teach the model).",
    )
    min_interval_s: float = Field(
        default=0.0,
        ge=0,
        description="At least this many seconds between two actions (an actuator rate limit).",
    )


class DeviceSpec(_Strict):
    """A device that serves the experiment: what it may say, under which identity."""

    id: str = Field(
        pattern=_DEVICE_ID_PATTERN,
        description="The device's id: its MQTT login (the broker's ACL lets a login publish only "
        "under `{prefix}/{experiment}/{id}/...`) and the `device_id` of its messages.",
    )
    actuator: bool = Field(
        default=False,
        description="The device the actions go to (`{prefix}/{experiment}/{id}/action`); only "
        "its acks count. Exactly one device of an experiment is its actuator.",
    )
    nodes: list[str] = Field(
        default=[],
        description="The nodes (and reward components) this device may report readings of; a "
        "reading of any other node from it is rejected (`node_not_bound`).",
    )
    oracle: bool = Field(
        default=False,
        description="Whether the device may send oracle messages (a simulator's E[y | a] and "
        "optimum, for true regret); from any other device they are rejected.",
    )


@functools.lru_cache(maxsize=256)
def _default_device(experiment: str, nodes: tuple[str, ...]) -> DeviceSpec:
    """The one device of a spec without `devices` (frozen, so one instance serves every call:
    the agent looks a message's device up for every message it receives)."""
    default_id = f"{DEFAULT_DEVICE_PREFIX}{experiment}"[:64]
    return DeviceSpec(id=default_id, actuator=True, nodes=list(nodes), oracle=True)


class ExperimentSpec(_Strict):
    """One experiment: graph, actions, reward, constraints, model, policy and schedule."""

    schema_: Literal["cbo-agent/experiment"] = Field(
        default=SPEC_SCHEMA,
        alias="schema",
        description="The file format, `cbo-agent/experiment`.",
    )
    version: Literal[1] = Field(default=SPEC_VERSION, description="The file format's version, 1.")
    name: str = Field(
        pattern=_NAME_PATTERN,
        description="The experiment's id: its MQTT topics are `{prefix}/{name}/...` and its rows "
        "in the store carry it.",
    )
    description: str = Field(default="", description="Free text for people.")
    intervention: Literal["soft", "hard"] = Field(
        description="`soft`: actions are extra inputs of their target nodes, whose mechanisms "
        "still act; `hard`: an action sets its node, do(X = x)."
    )
    nodes: list[NodeSpec] = Field(
        min_length=1, description="The causal graph's nodes, each with its parents."
    )
    actions: list[ActionSpec] = Field(
        default=[],
        description="What the agent can set (at least one action, or `parameters`).",
    )
    parameters: ParametersSpec | None = Field(
        default=None,
        description="A parameter vector θ of dimension D (paper 000) that stands for D actions "
        "`{name}.0` … `{name}.{D-1}`, published in one message. null: none.",
    )
    target_sets: list[list[str]] | None = Field(
        default=None,
        description="Hard interventions only: the sets of actions allowed together in a round "
        "(`[]` allows an observational round).",
    )
    candidates: list[list[float]] | None = Field(
        default=None,
        description="Soft interventions only: a finite list of action vectors (one value per "
        "action, in `actions`' order) to choose from instead of the whole box.",
    )
    reward: RewardSpec = Field(description="What to maximize.")
    fidelity: FidelitySpec | None = Field(
        default=None,
        description="Multi-fidelity trials (paper 001): which actions carry the trial length τ "
        "and the replication count q, their finite sets and the cost model. null: none.",
    )
    constraints: ConstraintSpec = Field(
        default=ConstraintSpec(), description="Cardinality and budget limits."
    )
    model: ModelSpec = Field(default=ModelSpec(), description="The nodes' Gaussian processes.")
    policy: PolicySpec = Field(default=PolicySpec(), description="The decision rule.")
    initial_design: InitialDesignSpec = Field(
        default=InitialDesignSpec(), description="Random rounds before the policy decides."
    )
    schedule: ScheduleSpec = Field(
        default=ScheduleSpec(), description="Round limit, pipelining, timeouts, rate limit."
    )
    devices: list[DeviceSpec] | None = Field(
        default=None,
        description="The devices that serve the experiment, each with what it may say (docs/"
        "protocol.md, Device identity). null: one device, `sim-{name}` (the id `cbo-agent sim` "
        "takes by default), the actuator, reporting every node and the oracle.",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        return _expand_parameters(data)

    @model_validator(mode="after")
    def _check_references(self) -> ExperimentSpec:
        problems = [
            *self._parameter_problems(),
            *self._graph_problems(),
            *self._action_problems(),
            *self._target_set_problems(),
            *self._candidate_problems(),
            *self._fidelity_problems(),
            *self._array_problems(),
            *self._device_problems(),
        ]
        if self.reward.node not in self.node_names:
            problems.append(
                f"reward.node: {unknown_name('node', self.reward.node, self.node_names)}"
            )
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

    @property
    def served_by(self) -> list[DeviceSpec]:
        """The devices of the experiment: `devices`, or the default simulator device."""
        if self.devices is not None:
            return list(self.devices)
        return [_default_device(self.name, tuple(self.node_names))]

    @property
    def actuator_id(self) -> str:
        """The id of the device the actions go to (the one actuator)."""
        return next(device.id for device in self.served_by if device.actuator)

    def device(self, device_id: str) -> DeviceSpec | None:
        """The declared device of that id, or None."""
        return next((d for d in self.served_by if d.id == device_id), None)

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

    @property
    def design_rounds(self) -> int:
        """Rounds of the random initial design: `initial_design.rounds`, else the default."""
        if self.initial_design.rounds is not None:
            return self.initial_design.rounds
        return default_design_rounds(len(self.actions), self.schedule.max_rounds)

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
                    problems.append(f"nodes[{i}].parents: {unknown_name('node', parent, names)}")
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
                    problems.append(
                        f"actions[{i}].targets: {unknown_name('node', target, self.node_names)}"
                    )
            if self.intervention == "hard":
                if len(action.targets) != 1:
                    problems.append(f"actions[{i}].targets: a hard action sets exactly one node")
                elif action.targets[0] == self.reward.node:
                    problems.append(f"actions[{i}].targets: the reward node cannot be set")
        return problems

    def _parameter_problems(self) -> list[str]:
        if not self.actions:
            return ["actions: declare at least one action (or a `parameters` vector)"]
        params = self.parameters
        if params is None:
            return []
        problems = []
        if self.intervention != "soft":
            problems.append("parameters: a parameter vector is a soft intervention")
        if self.constraints.max_interventions is not None and self.action_names != (
            self.parameter_vector
        ):
            problems.append(
                "constraints.max_interventions: with a parameter vector it limits the blocks of "
                "θ changed per round; not with other actions beside θ"
            )
        if self.candidates is not None:
            problems.append("candidates: not with a parameter vector")
        for target in params.targets:
            if target not in self.node_names:
                problems.append(
                    f"parameters.targets: {unknown_name('node', target, self.node_names)}"
                )
        return problems

    @property
    def parameter_vector(self) -> list[str]:
        """The coordinate actions of `parameters` (empty without one)."""
        return self.parameters.coordinate_names if self.parameters is not None else []

    def _reward_problems(self) -> list[str]:
        reward = self.reward
        given = [
            name
            for name in ("aggregation", "weights", "expression", "function", "derivative_bounds")
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
            problems.append("reward.aggregation: say 'linear', 'expression' or 'function'")
        elif reward.aggregation == "linear":
            problems += self._linear_reward_problems()
        elif reward.aggregation == "function":
            problems += self._function_reward_problems()
        else:
            problems += self._expression_reward_problems()
        if reward.aggregation != "function" and reward.function is not None:
            problems.append("reward.function: only aggregation 'function' takes it")
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
        if self.composite_reward:
            from core.field_reward import FieldReward

            try:
                FieldReward(self).check()
            except (ExpressionError, ValueError) as error:
                return [f"reward.expression: {error}"]
            return []
        try:
            compile_expression(reward.expression, reward.components)
        except ExpressionError as error:
            return [f"reward.expression: {error}"]
        return []

    def _function_reward_problems(self) -> list[str]:
        from core.field_metrics import FIELD_METRICS

        reward = self.reward
        problems = [
            f"reward.{name}: a function reward takes no {name}"
            for name in ("weights", "expression")
            if getattr(reward, name) is not None
        ]
        if reward.function is None:
            problems.append("reward.function: required for aggregation 'function'")
        elif reward.function not in FIELD_METRICS:
            problems.append(
                f"reward.function: {unknown_name('metric', reward.function, list(FIELD_METRICS))}"
            )
        if not problems:
            from core.field_reward import FieldReward

            try:
                FieldReward(self).check()
            except (ValueError, RuntimeError) as error:
                problems.append(f"reward.function: {reward.function} on the components: {error}")
        return problems

    # ------------------------------------------------------------------ array nodes
    @property
    def array_nodes(self) -> dict[str, tuple[int, ...]]:
        """Array node name -> shape, in spec order."""
        return {node.name: tuple(node.shape) for node in self.nodes if node.shape is not None}

    def _array_problems(self) -> list[str]:
        arrays = self.array_nodes
        if not arrays:
            return []
        problems = []
        if self.intervention != "soft" or self.fidelity is not None:
            problems.append("nodes: array nodes are for soft experiments without fidelity")
        fed = {name for action in self.actions for name in action.targets}
        children = {p for node in self.nodes for p in node.parents if node.shape is None}
        reward = self.reward
        for i, node in enumerate(self.nodes):
            if node.name not in arrays:
                continue
            if node.parents:
                problems.append(
                    f"nodes[{i}].parents: an array node has no parents (the soft actions that "
                    "target it are its inputs)"
                )
            elif node.name not in fed:
                problems.append(
                    f"nodes[{i}]: the array node {node.name!r} has no soft action targeting it "
                    "(its model's inputs are those actions)"
                )
            # No "; " in a message: the problems of one validator are joined by it
            if node.name not in children and node.name not in reward.components:
                problems.append(
                    f"nodes[{i}]: the array node {node.name!r} feeds nothing (make it a reward "
                    "component or a parent of a scalar node)"
                )
        if reward.node in arrays:
            problems.append(
                "reward.node: an array node cannot be the reward, make it a "
                "component of a decomposed reward"
            )
        elif set(arrays) & set(reward.components) and reward.aggregation == "linear":
            problems.append("reward.aggregation: arrays need 'expression' or 'function'")
        return problems

    @property
    def composite_reward(self) -> bool:
        """Whether the reward is g over array components or a registered metric (paper 002's
        composite reward, `core.field_reward`), not a scalar node's reading or a scalar g."""
        return bool(set(self.array_nodes) & set(self.reward.components)) or (
            self.reward.aggregation == "function"
        )

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
                    problems.append(
                        f"target_sets[{i}]: {unknown_name('action', name, self.action_names)}"
                    )
            if len(set(targets)) != len(targets):
                problems.append(f"target_sets[{i}]: an action appears twice")
        return problems

    @property
    def parameter_names(self) -> list[str]:
        """The actions of θ: every action but a fidelity experiment's τ and q."""
        if self.fidelity is None:
            return self.action_names
        levers = {self.fidelity.action, self.fidelity.replications_action}
        return [name for name in self.action_names if name not in levers]

    def _fidelity_problems(self) -> list[str]:
        fidelity = self.fidelity
        if fidelity is None:
            return []
        problems = []
        if self.intervention != "soft" or self.candidates is not None or self.reward.decomposed:
            problems.append(
                "fidelity: a multi-fidelity experiment is soft, without candidates or a "
                "decomposed reward"
            )
        for field_name, values in (
            ("action", fidelity.levels),
            ("replications_action", fidelity.replications),
        ):
            name = getattr(fidelity, field_name)
            if name not in self.action_names:
                problems.append(
                    f"fidelity.{field_name}: {unknown_name('action', name, self.action_names)}"
                )
                continue
            low, high = self.action(name).bounds
            outside = [v for v in values if not low <= v <= high]
            if outside:
                problems.append(
                    f"fidelity.{field_name}: {name}'s bounds [{low}, {high}] exclude {outside}"
                )
        if fidelity.action == fidelity.replications_action:
            problems.append("fidelity: τ and q need two different actions")
        elif not self.parameter_names:
            problems.append("fidelity: no action is left for the parameters θ")
        if self.constraints.max_interventions is not None:
            problems.append("constraints.max_interventions: every action of θ is set each round")
        return problems

    def _device_problems(self) -> list[str]:
        if self.devices is None:
            return []
        if not self.devices:
            return ["devices: empty; leave it out for the default simulator device"]
        problems = []
        ids = [device.id for device in self.devices]
        for dup in sorted({i for i in ids if ids.count(i) > 1}):
            problems.append(f"devices: duplicate device id {dup!r}")
        actuators = [device.id for device in self.devices if device.actuator]
        if len(actuators) != 1:
            problems.append(f"devices: exactly one actuator, got {len(actuators)} {actuators}")
        for i, device in enumerate(self.devices):
            for node in device.nodes:
                if node not in self.node_names:
                    problems.append(
                        f"devices[{i}].nodes: {unknown_name('node', node, self.node_names)}"
                    )
            if len(set(device.nodes)) != len(device.nodes):
                problems.append(f"devices[{i}].nodes: a node appears twice")
        reported = {node for device in self.devices for node in device.nodes}
        # a decomposed reward is composed by the agent from its components: no device reports it
        needed = [
            n for n in self.node_names if not (self.reward.decomposed and n == self.reward.node)
        ]
        unreported = [node for node in needed if node not in reported]
        if unreported:
            problems.append(
                f"devices: no device reports {unreported} (a round would never be complete)"
            )
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
        raise SpecError(source, plain_problems(error, ExperimentSpec)) from None


Override = tuple[str, Any]  # a dotted key into the spec ("schedule.max_rounds") and its value


def apply_overrides(data: dict[str, Any], overrides: Sequence[Override], source: str) -> None:
    """Set each dotted key of `overrides` in the parsed spec `data`, in order (in place).

    Keys name mappings by key and lists by index (`nodes.0.noise_std`); missing mappings are
    created, so a misspelled key surfaces as the spec's own "unknown key" error. A new
    `policy.name` drops the file's `policy.settings` (they belong to the other policy).

    Raises:
        SpecError: a key that cannot be followed (through a value, past a list's end).
    """
    for key, value in overrides:
        parts = key.split(".")
        if not all(part.strip() for part in parts):
            raise SpecError(
                source, [f"--set {key}: expected a dotted key like schedule.max_rounds"]
            )
        policy = data.get("policy")
        changes_policy = isinstance(policy, dict) and policy.get("name", "mcbo") != value
        if parts == ["policy", "name"] and changes_policy:
            policy.pop("settings", None)
        try:
            parent = _container(data, parts[:-1])
            _assign(parent, parts[-1], value)
        except LookupError as error:
            raise SpecError(source, [f"--set {key}: {error.args[0]}"]) from None


def _container(data: dict[str, Any], parts: Sequence[str]) -> dict[str, Any] | list[Any]:
    """The mapping or list at `parts`, creating missing mappings on the way."""
    node: Any = data
    for depth, part in enumerate(parts):
        if isinstance(node, list):
            node = node[_index(node, part, parts[:depth])]
        elif isinstance(node, dict):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
        else:
            raise LookupError(f"{'.'.join(parts[:depth])} is a value, not a mapping or a list")
    if not isinstance(node, dict | list):
        raise LookupError(f"{'.'.join(parts)} is a value, not a mapping or a list")
    return node


def _assign(node: dict[str, Any] | list[Any], part: str, value: Any) -> None:
    if isinstance(node, list):
        node[_index(node, part, [])] = value
    else:
        node[part] = value


def _index(node: list[Any], part: str, where: Sequence[str]) -> int:
    if not (part.isdigit() and int(part) < len(node)):
        name = ".".join(where) or "it"
        raise LookupError(f"{name} is a list of {len(node)}; {part!r} is not an index in it")
    return int(part)


def load_spec(path: str | Path, overrides: Sequence[Override] = ()) -> ExperimentSpec:
    """Read and validate a YAML spec file, with `overrides` applied first (`apply_overrides`).

    Raises:
        SpecError: for unreadable files, YAML syntax errors (with line and column), overrides
            that cannot be applied and every validation problem.
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
    if overrides and isinstance(data, dict):
        apply_overrides(data, overrides, source)
    return parse_spec(data, source)
