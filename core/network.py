"""The causal function-network model (paper 004): one GP per node over a known DAG.

Node i's GP maps (values of its parents, values of the soft actions that feed it) to its value.
All node GPs live in one batched `IncrementalGP`, so a round's readings update every node in one
call, and a node whose row completes later (a late reading) learns on its own. Under a hard
intervention do(X_i = v) node i does not learn from that round: its value was set, not produced.

Monte-Carlo rollouts propagate samples through the network in topological order: each node's
posterior is evaluated at its parents' *sampled* values (reparameterization), batched over
samples and candidates and differentiable in the actions. How a node's value is drawn from its
posterior (optimistic MCBO hallucination, a posterior sample for EI-FN, the mean) is the caller's
choice, passed as a `NodeSampler`.

An array node (paper 002) has a `FieldModel` over the soft actions that target it. Where it is
a parent of a scalar node (issue 15), the child's GP takes the field's fixed features
(`core.field_features`: the field flattened, or block means) in the parent's place; a rollout
draws the field from its posterior — S Matheron sample paths on fixed base samples
(`FieldDraws`), or the posterior mean without them — and passes each path on to the child.
"""

from __future__ import annotations

import bisect
import copy
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
import torch

from core.devices import resolve_device
from core.field_features import FieldFeatures
from core.field_reward import FieldReward
from core.gp import GPConfig, IncrementalGP, LearnReport
from core.gp.bounded import make_gp
from core.gp.change import ChangeConfig
from core.gp.field import (
    FieldModel,
    FieldModelKind,
    FieldRefitJob,
    FieldRefitResult,
    FieldSamples,
)
from core.gp.refit import RefitJob, RefitResult
from core.history import History
from core.reward import RewardFunction
from core.spec import ExperimentSpec

Intervention = Mapping[str, float]
# node -> value; an array node's value is its array (numpy or torch, the node's shape)
Readings = Mapping[str, Any]
_MIN_VARIANCE = 1e-24  # output units²; see `NetworkModel.node_posterior`
# The fewest released rounds a bounded model's history holds (`core.history`): at least a
# pipeline's worth (64, `schedule.pipeline`'s most) and what the regret estimate reads.
HISTORY_MIN = 64


@dataclass(frozen=True)
class NodeInputs:
    """What feeds a node's GP, in column order: parents first, then soft actions.

    `widths` holds each parent's number of columns: 1 for a scalar parent, the feature count
    of an array parent (`core.field_features`).
    """

    parents: tuple[str, ...]
    actions: tuple[str, ...]
    widths: tuple[int, ...] = ()

    @property
    def width(self) -> int:
        parents = sum(self.widths) if self.widths else len(self.parents)
        return parents + len(self.actions)


@dataclass(frozen=True)
class NodeQuery:
    """One node's posterior at a batch of inputs, handed to a `NodeSampler`.

    Attributes:
        node: the node's name.
        inputs: (..., width) the GP inputs in declared units (parents, then actions).
        mean: (...) posterior mean of the node's latent function.
        std: (...) posterior standard deviation of the latent function.
        noise_std: the node's observation-noise standard deviation (known or learned).
    """

    node: str
    inputs: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    noise_std: float


NodeSampler = Callable[[NodeQuery], torch.Tensor]


def mean_sampler(query: NodeQuery) -> torch.Tensor:
    """The posterior mean: a deterministic rollout."""
    return query.mean


@dataclass
class Round:
    """One round of history: what was done and what was read (possibly partial).

    A multi-fidelity round's reading is a mean over replications: `variances` holds the
    variance of that mean and `replications` how many ran, per node, where the device said.
    """

    intervention: dict[str, float]
    readings: dict[str, float] = field(default_factory=dict)
    learned: set[str] = field(default_factory=set)
    variances: dict[str, float] = field(default_factory=dict)
    replications: dict[str, int] = field(default_factory=dict)
    arrays: dict[str, torch.Tensor] = field(default_factory=dict)  # array nodes' readings
    index: int = 0  # its place in the history: the round a time-aware model sees
    rewarded: bool = False  # its reward is counted in the model's reward aggregates
    in_flat: bool = False  # the flat GP (GP-UCB's) has learned its reward


class FieldDraws:
    """S posterior sample paths of each array node on fixed base samples (Matheron's rule,
    `core.gp.matheron`), drawn once per proposal: a rollout through them is a deterministic,
    differentiable function of the actions (`NetworkModel.rollout(fields=...)`).

    Attributes:
        paths: array node -> its sample paths (nodes without readings are absent).
        count: S.
        refitted: the nodes whose field model was fitted while these were drawn.
        fit_seconds: the wall seconds those fits took (model upkeep, not a policy's search:
            `policies._search` keeps them out of a decision's cap).
    """

    def __init__(
        self,
        paths: Mapping[str, FieldSamples],
        count: int,
        refitted: Sequence[str] = (),
        rows: int | None = None,
        fit_seconds: float = 0.0,
    ) -> None:
        self.paths = dict(paths)
        self.count = count if rows is None else min(rows, count)
        self.refitted = list(refitted)
        self.fit_seconds = fit_seconds
        self._rows = rows

    def first(self, rows: int) -> FieldDraws:
        """The first `rows` paths (a valid sample of that many paths: they are independent)."""
        return FieldDraws(self.paths, self.count, self.refitted, rows, self.fit_seconds)

    def __call__(self, node: str, x: torch.Tensor) -> torch.Tensor | None:
        """(S, b, *shape) the node's paths at inputs x (b, d); None if it has none."""
        paths = self.paths.get(node)
        if paths is None:
            return None
        values = paths(x)
        return values if self._rows is None else values[: self._rows]


class NetworkModel:
    """Per-node GPs over the spec's DAG, learning round by round.

    Args:
        spec: the experiment spec (graph, actions, noise, model settings).
        dtype, device: of every GP (float64 by default).
        deferred_refits: learning only appends rows; due refits (and drift rebuilds) wait for
            the caller to run them beside the model (`refit_jobs`, `install`). False: they run
            inside the learn call that makes them due.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        *,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
        deferred_refits: bool = False,
    ) -> None:
        self.spec = spec
        self.deferred_refits = deferred_refits
        self.dtype, self.device = dtype, resolve_device(device)
        self.reward_node = spec.reward.node
        # Array nodes (paper 002) have a `FieldModel` each, built on first use; a reward over
        # them (or a registered metric) is a `FieldReward`.
        self.array_shapes: dict[str, tuple[int, ...]] = spec.array_nodes
        self.field_reward = FieldReward(spec) if spec.composite_reward else None
        # What a scalar child's GP sees of an array parent (issue 15)
        self.features: dict[str, FieldFeatures] = {
            name: FieldFeatures(shape) for name, shape in self.array_shapes.items()
        }
        # A decomposed reward (paper 003) is g(components), known: it has no GP of its own.
        self.reward_function = (
            RewardFunction(spec) if spec.reward.decomposed and self.field_reward is None else None
        )
        self.nodes: list[str] = spec.topological_order()
        self.order: list[str] = [  # the scalar nodes with a GP, in topological order
            n
            for n in self.nodes
            if not (spec.reward.decomposed and n == self.reward_node) and n not in self.array_shapes
        ]
        self.fields: dict[str, FieldModel] = {}  # array node -> its model, once built
        # the kind and fit steps of the field models when declared up front (`prepare_fields`)
        self.field_settings: tuple[FieldModelKind, int] | None = None
        self.action_names: list[str] = spec.action_names
        self._action_column = {name: i for i, name in enumerate(self.action_names)}
        self.inputs: dict[str, NodeInputs] = {
            node.name: NodeInputs(
                tuple(node.parents),
                self._feeding_actions(node.name),
                tuple(self._parent_width(p) for p in node.parents),
            )
            for node in spec.nodes
        }
        self.member: dict[str, int] = {name: i for i, name in enumerate(self.order)}
        # A time-aware model (`model.time_scale`): each node GP has one more input, the round,
        # right after its own (parents, actions), scaled by time_scale rounds (as
        # `core.gp.temporal.TemporalGP`); the flat GP has it after the encoded actions.
        self.time_scale: float | None = spec.model.time_scale
        # with `model.period`, two more: the round's point on the period's circle (cos, sin)
        self.period: float | None = spec.model.period
        self._bounds = self._input_bounds()
        self.gp = make_gp(self._bounds, self._gp_config(), dims=self._dims())
        # Every round (an exact model), or — bounded by `model.capacity` — the rounds not
        # released yet and the newest released ones (`core.history`, `release_round`)
        self.history = History(self._history_keep())
        # The rewards read so far, kept as they arrive rather than scanned from the history
        # at every call: their count and best, and their values in round order (a bounded
        # model: those of the newest `history.keep` rounds with one)
        self.reward_count = 0
        self.best_reward = -math.inf
        self._rewards: list[float] = []
        self._reward_rounds: list[int] = []
        self._flat: IncrementalGP | None = None  # actions -> reward, built on first use

    # ------------------------------------------------------------------ structure
    @property
    def reported(self) -> list[str]:
        """The nodes devices report in every round: the scalar nodes with a GP, then the
        array nodes (a decomposed reward is composed, not reported)."""
        return [*self.order, *self.array_shapes]

    def _parent_width(self, parent: str) -> int:
        """GP input columns a parent gives its child: 1, or an array's feature count."""
        return self.features[parent].count if parent in self.features else 1

    def _feeding_actions(self, node: str) -> tuple[str, ...]:
        if self.spec.intervention == "hard":
            return ()
        return tuple(a.name for a in self.spec.actions if node in a.targets)

    @property
    def timed(self) -> bool:
        """Whether the GPs know time (`model.time_scale`): the round is one more input."""
        return self.time_scale is not None

    @property
    def time_width(self) -> int:
        """GP input columns of time: 0, the round (1), or the round, cos and sin (3)."""
        return 0 if not self.timed else 1 if self.period is None else 3

    def time_columns(self, round_index: float) -> list[float]:
        """The time columns of a round: [t], or [t, cos 2πt/P, sin 2πt/P] with a period (the
        phase from t mod P, as `core.gp.temporal.TemporalGP`); [] when not timed."""
        if not self.timed:
            return []
        t = float(round_index)
        if self.period is None:
            return [t]
        phase = 2.0 * math.pi * math.fmod(t, self.period) / self.period
        return [t, math.cos(phase), math.sin(phase)]

    def _history_keep(self) -> int | None:
        """How many released rounds the history holds: None (all) unless the node GPs are
        bounded (`model.capacity`) and no array node's field model (never bounded: it builds
        from the history) needs them; else the capacity, at least HISTORY_MIN."""
        capacity = self.spec.model.capacity
        if capacity is None or self.array_shapes:
            return None
        return max(capacity, HISTORY_MIN)

    def release_round(self, round_index: int) -> None:
        """Nothing more can arrive for this round (its readings are in, it is retired): a
        bounded model's history may forget it (`core.history`); an exact one keeps it."""
        self.history.release(round_index)

    @property
    def now(self) -> int:
        """The round a policy proposes for: the next one to start (what a time-aware model's
        posterior is asked about)."""
        return len(self.history)

    @property
    def input_dim(self) -> int:
        """Width of the batched GP inputs (the widest node, with its round if timed; at
        least 1)."""
        return max([1, *(inputs.width + self.time_width for inputs in self.inputs.values())])

    def _dims(self) -> list[int]:
        return [self.inputs[node].width + self.time_width for node in self.order]

    def _time_bounds(self) -> list[tuple[float, float]]:
        """Declared bounds of the time columns: the round over `time_scale`, cos and sin."""
        if self.time_scale is None:
            return []
        return [(0.0, self.time_scale), *([(-1.0, 1.0)] * (self.time_width - 1))]

    def _input_bounds(self) -> torch.Tensor:
        bounds = torch.zeros(len(self.order), self.input_dim, 2, dtype=self.dtype)
        bounds[..., 1] = 1.0  # padding columns and input-free nodes: a constant 0 in [0, 1]
        for j, node in enumerate(self.order):
            inputs = self.inputs[node]
            columns = [  # an array parent's features are means of its elements: its bounds
                self.spec.node(p).bounds
                for p, width in zip(inputs.parents, inputs.widths, strict=True)
                for _ in range(width)
            ]
            columns += [self.spec.action(a).bounds for a in self.inputs[node].actions]
            columns += self._time_bounds()
            for c, (low, high) in enumerate(columns):
                bounds[j, c, 0], bounds[j, c, 1] = low, high
        return bounds.to(self.device)

    def with_round(self, inputs: torch.Tensor, round_index: float | None = None) -> torch.Tensor:
        """(..., w) inputs -> (..., w + time_width) with the round's time columns (default `now`)
        last; unchanged when the model does not know time."""
        if not self.timed:
            return inputs
        columns = self.time_columns(self.now if round_index is None else round_index)
        time = torch.tensor(columns, dtype=inputs.dtype, device=inputs.device)
        return torch.cat((inputs, time.expand(*inputs.shape[:-1], len(columns))), dim=-1)

    def _gp_config(self) -> GPConfig:
        settings = self.spec.model
        noise = []
        for node in self.order:
            std = self.spec.node(node).noise_std
            noise.append(None if std is None else std**2)
        change = settings.change
        return GPConfig(
            kernel=settings.kernel,
            noise_variance=noise,
            priors=settings.priors,
            refit_every=settings.refit_every,
            misfit_z=settings.misfit_z,
            window=settings.window,
            capacity=settings.capacity,
            budget=settings.budget,
            change=None if change is None else ChangeConfig(**change.model_dump()),
            deferred=self.deferred_refits,
        )

    def action_bounds(self) -> torch.Tensor:
        """(A, 2) lower/upper bounds of the actions, in spec order."""
        values = [a.bounds for a in self.spec.actions]
        return torch.tensor(values, dtype=self.dtype, device=self.device)

    def action_vector(self, intervention: Intervention) -> torch.Tensor:
        """(A,) action values in spec order; an action not used this round is 0."""
        vector = torch.zeros(len(self.action_names), dtype=self.dtype, device=self.device)
        for name, value in intervention.items():
            if name not in self._action_column:
                raise KeyError(f"unknown action {name!r}")
            vector[self._action_column[name]] = float(value)
        return vector

    def set_nodes(self, intervention: Intervention) -> set[str]:
        """Nodes fixed by a hard intervention (empty for soft)."""
        if self.spec.intervention != "hard":
            return set()
        return {self.spec.action(name).targets[0] for name in intervention}

    def noise_std(self, node: str) -> float:
        """The node's observation-noise std in its own units (known, or as learned)."""
        j = self.member[node]
        return math.sqrt(float(self.gp.noise[j])) * float(self.gp.y_scale[j])

    def known_noise_std(self, node: str) -> float:
        """The noise a rollout should add at a node: the spec's known std (0 for a noiseless
        node, where `noise_std` reports the GP's numerical floor instead), else the learned one."""
        std = self.spec.node(node).noise_std
        return self.noise_std(node) if std is None else float(std)

    def node_input_bounds(self, node: str) -> torch.Tensor:
        """(width, 2) declared bounds of a node's GP inputs (parents, then soft actions)."""
        return self._bounds[self.member[node], : self.inputs[node].width]

    # ------------------------------------------------------------------ learning
    def reserve_rounds(self, rounds: int, pending: int, limit_bytes: int) -> int:
        """Room in the node GPs for the rows of `rounds` rounds (one per node and round) and
        `pending` pending points, as far as their factors stay within `limit_bytes`: growing
        now, before the readings come, spares the learning the growths on its way there (an
        allocation and a copy of b×c² numbers each: up to a second at 1,000-2,000 rows on a
        loaded machine). A model that keeps a bounded number of rows (`model.capacity`, a
        window) gets room for those only. Returns the capacity now held."""
        gp = self.gp
        if gp.batch == 0:  # no scalar node: every node is an array node with its own model
            return gp.room
        config = gp.config
        rows = rounds
        if config.capacity is not None:
            rows = min(rows, config.capacity + 2)
        if config.window is not None:
            rows = min(rows, config.window + 1)
        per_row = gp.batch * (torch.finfo(gp.dtype).bits // 8)
        most = math.isqrt(max(limit_bytes, 0) // per_row)
        gp.reserve(min(rows + pending, most))
        gp.most_rows = rows + pending  # past the room reserved, spares are made ahead of need
        return gp.room

    def start_round(self, intervention: Intervention) -> int:
        """Record an intervention about to be applied; returns its round index."""
        index = len(self.history)
        return self.history.append(
            Round({k: float(v) for k, v in intervention.items()}, index=index)
        )

    def observe(self, round_index: int, readings: Readings, *, refit: bool = True) -> LearnReport:
        """Add readings to a round; every node whose row is now complete learns, in one call.

        A node's row is complete when its own reading and all its parents' readings have
        arrived. Nodes set by a hard intervention never learn from the round.
        """
        record = self.history[round_index]
        self._admit(record, readings)
        ready = self._complete_nodes(record)
        report = self._learn(record, ready, refit)
        record.learned |= set(ready)
        if self._flat is not None:
            self._flat_learn(round_index, refit)
        return report

    def note_replications(
        self, round_index: int, node: str, variance: float | None, replications: int | None
    ) -> None:
        """Record what a device said of a mean reading: the variance of the mean and the
        number of replications behind it (a multi-fidelity model reads them; node GPs don't)."""
        record = self.history[round_index]
        if variance is not None:
            record.variances[node] = float(variance)
        if replications is not None:
            record.replications[node] = int(replications)

    def observe_many(
        self, batch: Sequence[tuple[int, Readings]], *, refit: bool = True
    ) -> LearnReport:
        """`observe` for each (round index, readings) in order, the node GPs learning at once.

        Every row that becomes complete is learned by one `IncrementalGP.learn_block` (a
        member's rows in batch order; members may learn different numbers of rows), so a batch
        reads each node's factor once instead of once per round. The refit, window and drift
        schedule therefore runs once, at the end (see `learn_block`); the flat model, if built,
        still learns round by round as with `observe`. Should a reading be invalid (an unknown
        node, a value that is not finite), the rounds before it are learned, then it raises.

        Returns:
            One report for the batch: refit, refit_failed and rebuilt merged over the node GPs'
            block, forgotten its total, surprise (b,) each node's largest over its rows (NaN
            where it learned nothing).
        """
        rows: list[tuple[Round, str]] = []
        queued: dict[int, set[str]] = {}  # per round, nodes already in the block
        try:
            for round_index, readings in batch:
                record = self.history[round_index]
                self._admit(record, readings)
                waiting = queued.setdefault(round_index, set())
                ready = [node for node in self._complete_nodes(record) if node not in waiting]
                waiting.update(ready)
                rows += [(record, node) for node in ready]
                if self._flat is not None:  # its own GP: learning it first changes nothing
                    self._flat_learn(round_index, refit)
        finally:  # on a bad reading, the rounds before it are learned, as observe would
            report = self._learn_rows(rows, refit)
        return report

    def _admit(self, record: Round, readings: Readings) -> None:
        """Store a round's new readings (checked) and compose a decomposed reward."""
        for node, value in readings.items():
            if node not in self.inputs:
                raise KeyError(f"unknown node {node!r}")
            if node in self.array_shapes:
                self._admit_array(record, node, value)
                continue
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"reading of {node} is not finite: {value}")
            record.readings[node] = value
        self._compose_reward(record)
        if not record.rewarded and self.reward_node in record.readings:
            self._count_reward(record)

    def _count_reward(self, record: Round) -> None:
        """A round's reward has arrived (read, or composed): into the running aggregates, its
        value among the others in round order (readings mostly come in order: an append)."""
        value = record.readings[self.reward_node]
        record.rewarded = True
        self.reward_count += 1
        self.best_reward = max(self.best_reward, value)
        at = bisect.bisect(self._reward_rounds, record.index)
        self._reward_rounds.insert(at, record.index)
        self._rewards.insert(at, value)
        keep = self.history.keep
        if keep is not None and len(self._rewards) > keep:
            del self._reward_rounds[0], self._rewards[0]

    def _admit_array(self, record: Round, node: str, value: Any) -> None:
        """An array reading: checked against the node's shape, kept in `record.arrays` (its
        mean in `record.readings`, for logs), learned by the node's field model if built."""
        array = torch.as_tensor(np.array(value, dtype=np.float64), dtype=self.dtype)  # a copy
        shape = self.array_shapes[node]
        if tuple(array.shape) != shape:
            raise ValueError(f"reading of {node} has shape {list(array.shape)}, not {list(shape)}")
        if not bool(torch.isfinite(array).all()):
            raise ValueError(f"reading of {node} holds non-finite values")
        if node in record.arrays:
            return
        record.arrays[node] = array
        record.readings[node] = float(array.mean())
        if node in self.fields:
            self.fields[node].learn_one(self._field_input(node, record.intervention), array)
        elif self.field_settings is not None:
            # declared up front (`prepare_fields`): built now, from the history this record is
            # already in, so that its first fit is due at once and the service's refits run it
            # beside the loop (`refit_jobs`) rather than the next decision inside its cap
            self.field_model(node, *self.field_settings)

    def _learn_rows(self, rows: Sequence[tuple[Round, str]], refit: bool) -> LearnReport:
        """Learn (round, node) rows with one block: each node's rows in the order given."""
        b = len(self.order)
        if b == 0:  # array nodes only: their field models learned in `_admit_array`
            return LearnReport(torch.zeros(0, dtype=self.dtype))
        per_member: list[list[tuple[Round, str]]] = [[] for _ in range(b)]
        for record, node in rows:
            per_member[self.member[node]].append((record, node))
        k = max(1, *(len(member_rows) for member_rows in per_member))
        # Python lists, then one tensor each: a tensor write per value would cost more than the
        # block's own small operations.
        width = self.input_dim
        x = [[[0.0] * width for _ in range(k)] for _ in range(b)]
        y = [[0.0] * k for _ in range(b)]
        mask = [[False] * k for _ in range(b)]
        for j, member_rows in enumerate(per_member):
            for i, (record, node) in enumerate(member_rows):
                row = self._timed_row(node, record)
                x[j][i][: len(row)] = row
                y[j][i] = record.readings[node]
                mask[j][i] = True
        opts = {"dtype": self.dtype, "device": self.device}
        try:
            report = self.gp.learn_block(
                torch.tensor(x, **opts),
                torch.tensor(y, **opts),
                torch.tensor(mask, device=self.device),
                refit=refit,
            )
        except ValueError:  # refused before anything was learned: the rows may be taught again
            raise
        except Exception:  # past the appends (a rebuild or fit failed): the rows are learned
            self._mark_learned(rows)
            raise
        self._mark_learned(rows)
        return report

    @staticmethod
    def _mark_learned(rows: Sequence[tuple[Round, str]]) -> None:
        for record, node in rows:
            record.learned.add(node)

    # ------------------------------------------------------------------ refits beside the model
    def refit_jobs(self) -> dict[str, RefitJob | FieldRefitJob]:
        """The due refits of the node GPs ("nodes"), of the flat GP ("flat", once built) and
        of the array nodes' field models ("field:<node>", once built), copied out to run beside
        the model (`core.gp.refit.run_refit`, `FieldRefitJob.run`); empty when none."""
        gps = {"nodes": self.gp, "flat": self._flat} if self.order else {"flat": self._flat}
        jobs: dict[str, RefitJob | FieldRefitJob | None] = {
            key: gp.refit_job() for key, gp in gps.items() if gp is not None
        }
        jobs |= {f"field:{node}": field.refit_job() for node, field in self.fields.items()}
        return {key: job for key, job in jobs.items() if job is not None}

    def _refit_gp(self, key: str) -> IncrementalGP:
        gp = self.gp if key == "nodes" else self._flat
        if gp is None:
            raise KeyError(f"no GP {key!r} to install a refit in")
        return gp

    def refresh_job(self, key: str, job: RefitJob) -> RefitJob | None:
        """`refit_jobs()[key]` (or a part of it) over the rows held now; None when stale (see
        `IncrementalGP.refresh_job`)."""
        return self._refit_gp(key).refresh_job(job)

    def late_rows(self, key: str, job: RefitJob) -> int:
        """Rows `install` would append or forget for `job` now (`IncrementalGP.late_rows`)."""
        return self._refit_gp(key).late_rows(job)

    def install(self, key: str, result: RefitResult | FieldRefitResult) -> LearnReport:
        """Swap in the result of `refit_jobs()[key]` (see `IncrementalGP.install`,
        `FieldModel.install`)."""
        if key.startswith("field:"):
            assert isinstance(result, FieldRefitResult)
            self.fields[key.removeprefix("field:")].install(result)
            return LearnReport(torch.zeros(0, dtype=self.dtype))
        assert isinstance(result, RefitResult)
        return self._refit_gp(key).install(result)

    def learn(
        self, intervention: Intervention, readings: Readings, *, refit: bool = True
    ) -> LearnReport:
        """Record a whole round at once (intervention and all readings)."""
        return self.observe(self.start_round(intervention), readings, refit=refit)

    def _compose_reward(self, record: Round) -> None:
        """A decomposed reward not reported itself is g of the reported components."""
        if self.field_reward is not None:
            self._compose_field_reward(record)
            return
        g = self.reward_function
        if g is None or self.reward_node in record.readings:
            return
        if all(c in record.readings for c in g.components):
            components = torch.tensor([record.readings[c] for c in g.components], dtype=self.dtype)
            actions = {
                a: torch.tensor(float(record.intervention.get(a, 0.0)), dtype=self.dtype)
                for a in self.action_names
            }
            record.readings[self.reward_node] = float(g(components, actions))

    def _compose_field_reward(self, record: Round) -> None:
        g = self.field_reward
        assert g is not None
        if self.reward_node in record.readings:
            return
        values = {}
        for name in g.components:
            if name in record.arrays:
                values[name] = record.arrays[name]
            elif name in record.readings and name not in self.array_shapes:
                values[name] = torch.tensor(record.readings[name], dtype=self.dtype)
            else:
                return
        record.readings[self.reward_node] = float(g(values))

    def _complete_nodes(self, record: Round) -> list[str]:
        fixed = self.set_nodes(record.intervention)
        return [
            node
            for node in self.order
            if node not in record.learned
            and node not in fixed
            and node in record.readings
            and all(p in record.readings for p in self.inputs[node].parents)
        ]

    def _learn(self, record: Round, nodes: Iterable[str], refit: bool) -> LearnReport:
        b = len(self.order)
        if b == 0:  # array nodes only: their field models learned in `_admit_array`
            return LearnReport(torch.zeros(0, dtype=self.dtype))
        x = torch.zeros(b, self.input_dim, dtype=self.dtype, device=self.device)
        y = torch.zeros(b, dtype=self.dtype, device=self.device)
        mask = torch.zeros(b, dtype=torch.bool, device=self.device)
        for node in nodes:
            j = self.member[node]
            row = self._timed_row(node, record)
            x[j, : len(row)] = torch.tensor(row, dtype=self.dtype)
            y[j] = record.readings[node]
            mask[j] = True
        return self.gp.learn_one(x, y, mask, refit=refit)

    def _timed_row(self, node: str, record: Round) -> list[float]:
        """The node GP's input for a round: `node_input_row`, then its time columns if timed."""
        readings = {**record.readings, **record.arrays} if record.arrays else record.readings
        row = self.node_input_row(node, readings, record.intervention)
        return [*row, *self.time_columns(record.index)]

    def node_input_row(self, node: str, readings: Readings, actions: Intervention) -> list[float]:
        """The GP input of `node` for a round, in declared units (an array parent's reading,
        its array, gives its features)."""
        inputs = self.inputs[node]
        row: list[float] = []
        for p in inputs.parents:
            if p in self.features:
                array = torch.as_tensor(np.asarray(readings[p], dtype=np.float64))
                row += self.features[p](array.reshape(self.array_shapes[p])).tolist()
            else:
                row.append(float(readings[p]))
        return row + [float(actions.get(a, 0.0)) for a in inputs.actions]

    def with_lengthscale_caps(self, caps: Mapping[str, float]) -> NetworkModel:
        """A view of this model in which node i's lengthscales are at most caps[i].

        Caps are in the unit-cube units of the GP inputs and apply to a node's own inputs
        (parents, actions), not to a time-aware model's round. The view shares everything with
        this model but its GPs, a copy refactorized once under the capped values (O(n³) per
        capped node); this model is unchanged. Returns this model when no lengthscale exceeds
        its cap. For a policy that widens the function class it considers (Berkenkamp et al.
        2019; `policies.mcbo`), never for learning: the view must not learn.
        """
        lengthscale = self.gp.lengthscale.clone()
        changed = False
        for node, cap in caps.items():
            j, width = self.member[node], self.inputs[node].width
            if width and bool((lengthscale[j, :width] > cap).any()):
                lengthscale[j, :width] = lengthscale[j, :width].clamp_max(cap)
                changed = True
        if not changed:
            return self
        view = copy.copy(self)
        view.gp = copy.deepcopy(self.gp)
        view.gp.set_hyperparameters(lengthscale=lengthscale)
        return view

    @property
    def observed_rewards(self) -> list[float]:
        """The rewards read so far, in round order: every one (an exact model), or those of
        the newest rounds a bounded history holds — `reward_count` and `best_reward` count all.
        Kept as they arrive (O(1) per call); the caller must not change the list."""
        return self._rewards

    # ------------------------------------------------------------------ pending rounds
    def add_pending(self, intervention: Intervention, round_index: int | None = None) -> int:
        """Condition every node on a round in flight, before its readings arrive.

        Each node gets a pending point at its input under the intervention, with parents at the
        posterior-mean rollout; its variance there shrinks and its mean does not move, so a
        policy proposing the next round in parallel looks elsewhere. Returns a handle for
        `drop_pending`, to be called before the round's readings are learned. A time-aware
        model puts the point at `round_index` (default: the round started last).
        """
        if not self.order:  # array nodes only: nothing to condition (see docs/design.md)
            return -1
        actions = self.action_vector(intervention).unsqueeze(0)
        fixed = self.set_nodes(intervention)
        set_actions = tuple(intervention) if self.spec.intervention == "hard" else ()
        with torch.no_grad():
            values = self.rollout(actions, mean_sampler, set_actions=set_actions)
            x = torch.zeros(len(self.order), self.input_dim, dtype=self.dtype, device=self.device)
            mask = torch.zeros(len(self.order), dtype=torch.bool, device=self.device)
            for node in self.order:
                if node in fixed:
                    continue
                inputs = self.node_inputs_at(node, actions, values).reshape(-1)
                if self.timed:
                    at = len(self.history) - 1 if round_index is None else round_index
                    inputs = self.with_round(inputs, at)
                j = self.member[node]
                x[j, : inputs.numel()] = inputs
                mask[j] = True
            return self.gp.add_pending(x, mask)

    def drop_pending(self, handle: int) -> None:
        """Forget a pending round (its readings are about to be learned, or will never come)."""
        if handle >= 0:
            self.gp.drop_pending(handle)

    # ------------------------------------------------------------------ prediction
    def node_posterior(self, node: str, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and std of a node's latent function; differentiable in `inputs`.

        Args:
            inputs: (..., width) GP inputs in declared units (parents, then actions); a
                time-aware model is asked about them at the present round (`now`).

        Returns:
            mean (...), std (...).
        """
        lead = inputs.shape[:-1]
        flat = self.with_round(inputs.reshape(lead.numel(), inputs.shape[-1]))
        pad = self.input_dim - flat.shape[-1]
        if pad:
            flat = torch.cat([flat, flat.new_zeros(flat.shape[0], pad)], dim=-1)
        post = self.gp.posterior(flat, members=self.member[node])
        # A floor under the variance keeps d(std)/d(inputs) finite where the variance is ~0 (at
        # a training point of a near-noiseless node), so gradient-based optimizers see no NaN.
        std = post.variance.clamp_min(_MIN_VARIANCE).sqrt()
        return post.mean.reshape(lead), std.reshape(lead)

    def rollout(
        self,
        actions: torch.Tensor,
        sampler: NodeSampler = mean_sampler,
        *,
        set_actions: Sequence[str] = (),
        fields: FieldDraws | None = None,
    ) -> dict[str, torch.Tensor]:
        """Propagate values through the network in topological order.

        Args:
            actions: (..., A) action values in declared units (spec order); leading dims are
                samples and/or candidates, broadcast through every node.
            sampler: draws a node's value from its posterior at its (sampled) inputs.
            set_actions: hard interventions: the actions in the target set; their nodes take
                the action's value and have no GP in the rollout.
            fields: sample paths of the array nodes (`field_draws`): each array node's value is
                (S, ..., *shape), S paths passed on to its children; None: the posterior mean
                field (`field_mean`).

        Returns:
            node name -> (...) values (an array node's (..., *shape)); with a composite reward
            (`core.field_reward`) or a decomposed one, the reward composed from them.

        A sampler may return values with more leading dims than the actions (say (S, b) draws
        for (1, b, A) actions); they broadcast downstream, so a node that depends on no sampled
        value is evaluated once per action row rather than once per draw. Field paths lead
        with their S in the same way (`field_value`).
        """
        fixed = {self.spec.action(a).targets[0]: self._action_column[a] for a in set_actions}
        values: dict[str, torch.Tensor] = {}
        for node in self.order:
            if node in fixed:
                values[node] = actions[..., fixed[node]]
                continue
            for parent in self.inputs[node].parents:
                if parent in self.array_shapes and parent not in values:
                    values[parent] = self.field_value(parent, actions, fields)
            inputs = self.node_inputs_at(node, actions, values)
            mean, std = self.node_posterior(node, inputs)
            query = NodeQuery(node, inputs, mean, std, self.noise_std(node))
            values[node] = sampler(query)
        if self.field_reward is not None:
            for component in self.field_reward.components:
                if component in self.array_shapes and component not in values:
                    values[component] = self.field_value(component, actions, fields)
            values[self.reward_node] = self.compose_field(values, actions)
        elif self.reward_function is not None:
            values[self.reward_node] = self.compose(values, actions)
        return values

    def compose_field(
        self, values: Mapping[str, torch.Tensor], actions: torch.Tensor
    ) -> torch.Tensor:
        """The composite reward g (`core.field_reward`) from component values: arrays
        (..., *shape), scalars (...), broadcast against each other and the actions (..., A)."""
        g = self.field_reward
        assert g is not None
        leads = [
            values[c].shape[: values[c].dim() - len(self.array_shapes.get(c, ()))]
            for c in g.components
        ]
        lead = torch.broadcast_shapes(actions.shape[:-1], *leads)
        parts = {c: values[c].expand(*lead, *self.array_shapes.get(c, ())) for c in g.components}
        return g(parts)

    def compose(self, values: Mapping[str, torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        """The decomposed reward g from component values (...) and actions (..., A)."""
        g = self.reward_function
        assert g is not None
        parts = [values[c] for c in g.components]
        lead = torch.broadcast_shapes(actions.shape[:-1], *(p.shape for p in parts))
        components = torch.stack([p.expand(lead) for p in parts], dim=-1)
        named = {a: actions[..., i].expand(lead) for i, a in enumerate(self.action_names)}
        return g(components, named)

    def node_inputs_at(
        self, node: str, actions: torch.Tensor, values: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """(..., width) GP inputs of `node`: its parents' `values` (an array parent's
        (..., *shape) field as its features), then its soft actions."""
        spec_inputs = self.inputs[node]
        parents = [  # each (..., w): w = 1, or an array parent's feature count
            self.features[p](values[p]) if p in self.features else values[p].unsqueeze(-1)
            for p in spec_inputs.parents
        ]
        lead = torch.broadcast_shapes(actions.shape[:-1], *(v.shape[:-1] for v in parents))
        columns = [v.expand(*lead, v.shape[-1]) for v in parents]
        columns += [
            actions[..., self._action_column[a]].expand(lead).unsqueeze(-1)
            for a in spec_inputs.actions
        ]
        if not columns:
            return actions.new_zeros((*lead, 0))
        return torch.cat(columns, dim=-1)

    # ------------------------------------------------------------------ array nodes
    def _field_input(self, node: str, intervention: Intervention) -> torch.Tensor:
        """(d,) the field model's input: the soft actions that target the node."""
        actions = self.inputs[node].actions
        return torch.tensor([float(intervention.get(a, 0.0)) for a in actions], dtype=self.dtype)

    def field_inputs(self, node: str, actions: torch.Tensor) -> torch.Tensor:
        """(..., d) the field model's inputs from action vectors (..., A)."""
        columns = [self._action_column[a] for a in self.inputs[node].actions]
        return actions[..., columns]

    def prepare_fields(self, kind: FieldModelKind = "hogp", fit_steps: int = 50) -> None:
        """Build each array node's field model at its first reading (not at the first
        decision that asks for it), with this kind and fit effort (the policy's:
        `Policy.field_model_settings`). A built model's due fits are handed out by `refit_jobs`
        like the node GPs', so a service that runs those beside its loop (`agent.refits`) fits
        a field before a decision needs it: the first fit, seconds, then stays out of the
        decision and its wall-clock cap. Nodes that already have readings are built now."""
        self.field_settings = (kind, fit_steps)
        for node in self.array_shapes:
            if any(node in record.arrays for record in self.history):
                self.field_model(node, kind, fit_steps)

    def field_model(
        self, node: str, kind: FieldModelKind = "hogp", fit_steps: int = 50
    ) -> FieldModel:
        """The array node's model, built from `history` on first use and then kept up to date
        by `observe` (O(n²) per reading). Its hyperparameters are fitted by `refresh_field`,
        which the array policies call before proposing (in the policy's worker thread, off the
        ingest path), and by the service's background refits (`refit_jobs`). The kind and fit
        effort of the first call stay."""
        if node not in self.fields:
            inputs = self.inputs[node]
            if not inputs.actions:
                raise ValueError(f"array node {node!r} has no soft action targeting it")
            bounds = torch.tensor(
                [self.spec.action(a).bounds for a in inputs.actions], dtype=self.dtype
            )
            model = FieldModel(
                bounds, self.array_shapes[node], kind, self.spec.model.refit_every, fit_steps
            )
            for record in self.history:
                if node in record.arrays:
                    model.learn_one(
                        self._field_input(node, record.intervention), record.arrays[node]
                    )
            self.fields[node] = model
        return self.fields[node]

    def field_value(
        self, node: str, actions: torch.Tensor, fields: FieldDraws | None = None
    ) -> torch.Tensor:
        """An array node's value in a rollout at actions (..., A): (S, ..., *shape) from its
        sample paths in `fields` (for (1, b, A) actions, (S, b, *shape): S takes the leading
        1), else the posterior mean (..., *shape) (`field_mean`)."""
        x = self.field_inputs(node, actions)
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1])
        shape = self.array_shapes[node]
        draws = None if fields is None else fields(node, flat)
        if draws is None:
            return self.field_mean(node, flat).reshape(*lead, *shape)
        # (1, b, A) actions (a policy's batch, draws broadcast in): S takes the leading 1
        kept = lead[1:] if len(lead) >= 2 and lead[0] == 1 else lead
        return draws.reshape(draws.shape[0], *kept, *shape)

    def field_mean(self, node: str, x: torch.Tensor) -> torch.Tensor:
        """(b, *shape) the array node's posterior mean at inputs x (b, d), declared units; a
        model not built or not fitted yet gives its readings' mean (the midpoint of `bounds`
        before any): never a fit here, so a mean rollout on the ingest path stays cheap."""
        model = self.fields.get(node)
        if model is not None and model.gp is not None:
            return model.posterior_mean(x).to(x)
        arrays = [r.arrays[node] for r in self.history if node in r.arrays]
        if arrays:
            mean = torch.stack(arrays).mean(0)
        else:
            low, high = self.spec.node(node).bounds
            mean = torch.full(self.array_shapes[node], 0.5 * (low + high), dtype=self.dtype)
        return mean.to(x).expand(x.shape[0], *mean.shape)

    def field_draws(
        self, count: int, seed: int, kind: FieldModelKind = "hogp", fit_steps: int = 50
    ) -> FieldDraws:
        """`count` posterior sample paths of every array node with readings, for rollouts
        (`rollout(fields=...)`): each node's model is built (`field_model`) and fitted when due
        (`refresh_field`) first — seconds, so call it off the ingest path (the policies do, in
        their worker thread). A node without readings has no paths: its rollouts take the
        midpoint field (`field_mean`)."""
        generator = torch.Generator().manual_seed(seed)
        paths: dict[str, FieldSamples] = {}
        refitted: list[str] = []
        fit_seconds = 0.0
        for node in self.array_shapes:
            model = self.field_model(node, kind, fit_steps)
            if model.n == 0:
                continue
            started = time.perf_counter()
            if self.refresh_field(node):
                refitted.append(node)
                fit_seconds += time.perf_counter() - started
            paths[node] = model.samples(count, generator)
        return FieldDraws(paths, count, refitted, fit_seconds=fit_seconds)

    def fitted_field_draws(self, count: int, generator: torch.Generator) -> FieldDraws | None:
        """`count` sample paths of every array node with readings from its model as fitted
        now — never a fit here (for `agent.regret`, which must stay cheap); None while a node
        with readings has no fitted model yet."""
        paths: dict[str, FieldSamples] = {}
        for node in self.array_shapes:
            model = self.fields.get(node)
            if model is None or model.gp is None:
                if any(node in record.arrays for record in self.history):
                    return None
                continue
            paths[node] = model.samples(count, generator)
        return FieldDraws(paths, count)

    def refresh_field(self, node: str) -> bool:
        """Fit the node's field model now if it has never been fitted, or if a refit is due
        and no refit job is out (the service runs them beside the loop: `refit_jobs`); True
        if it did. A model whose refit runs elsewhere keeps its hyperparameters meanwhile
        (its posterior is still exact: readings extend the root)."""
        model = self.fields[node]
        if model.gp is None or (model.refit_due and not model.job_out):
            model.refit()
            return True
        return False

    # ------------------------------------------------------------------ flat model (GP-UCB)
    @property
    def flat_dim(self) -> int:
        """Width of the flat model's input: A values (soft), A values + A do-bits (hard), and
        the time columns when the model knows time (`time_width`)."""
        width = len(self.action_names) * (2 if self.spec.intervention == "hard" else 1)
        return width + self.time_width

    def flat_encode(self, actions: torch.Tensor, set_actions: Sequence[str] = ()) -> torch.Tensor:
        """Encode action vectors as inputs of the flat model; differentiable in `actions`.

        Args:
            actions: (..., A) action values in declared units (spec order).
            set_actions: hard interventions: the target set. Its actions keep their values and
                get a do-bit of 1; every other action gets its lower bound (a constant, so it
                adds nothing to kernel distances) and a do-bit of 0. Ignored for soft.

        Returns:
            (..., flat_dim) inputs; a time-aware model's at the present round (`now`).
        """
        return self.with_round(self._flat_encode(actions, set_actions))

    def _flat_encode(self, actions: torch.Tensor, set_actions: Sequence[str]) -> torch.Tensor:
        if self.spec.intervention != "hard":
            return actions
        used = torch.zeros(len(self.action_names), dtype=torch.bool, device=actions.device)
        for name in set_actions:
            used[self._action_column[name]] = True
        lower = self.action_bounds()[:, 0].to(actions)
        values = torch.where(used, actions, lower)
        bits = used.to(actions.dtype).expand_as(actions)
        return torch.cat([values, bits], dim=-1)

    def flat_model(self) -> IncrementalGP:
        """One GP from the encoded action vector to the reward, ignoring the graph (paper 004,
        Fig. 1a; the GP-UCB baseline).

        Built from `history` on first use, then kept up to date by `observe` as reward readings
        arrive, so a model whose policy never asks for it pays nothing. Same kernel, priors and
        refit schedule as the node GPs; the noise is learned unless the spec fixes Var(Y | a)
        (`_flat_noise_variance`).
        """
        if self._flat is None:
            self._flat = make_gp(self._flat_bounds(), self._flat_config())
            self._flat_learn_history()
        return self._flat

    def _flat_bounds(self) -> torch.Tensor:
        bounds = self.action_bounds()
        if self.spec.intervention == "hard":
            bits = torch.tensor([[0.0, 1.0]], dtype=self.dtype, device=self.device)
            bounds = torch.cat([bounds, bits.expand(len(self.action_names), 2)])
        if self.timed:
            time = torch.tensor(self._time_bounds(), dtype=self.dtype, device=self.device)
            bounds = torch.cat([bounds, time])
        return bounds

    def _flat_config(self) -> GPConfig:
        config = self._gp_config()
        config.noise_variance = self._flat_noise_variance()
        return config

    def _flat_noise_variance(self) -> float | None:
        """The flat GP's noise variance if the spec fixes it, else None (learned).

        The flat GP models Y given the actions, so its noise is Var(Y | a): the reward node's
        own noise plus that of every node upstream, passed through the mechanisms. Only when
        no ancestor of the reward adds noise (each declared noiseless, `noise_std: 0`) is it
        the reward node's known noise; otherwise it is learned. (Told the reward node's 0.01
        on dropwave-drift, where Y's std given the actions is 0.25-0.34 from X0's noise
        through the ripple, the fit put a lengthscale at its floor: issue 22.)
        """
        std = self.spec.node(self.reward_node).noise_std
        upstream = nx.ancestors(self.spec.graph(), self.reward_node)
        if std is None or any(self.spec.node(name).noise_std != 0 for name in upstream):
            return None
        return std**2

    def _flat_row(self, record: Round) -> torch.Tensor:
        actions = self.action_vector(record.intervention)
        set_actions = tuple(record.intervention) if self.spec.intervention == "hard" else ()
        return self.with_round(self._flat_encode(actions, set_actions), record.index)

    def _flat_learn_history(self) -> None:
        """The history's rewards, learned at once (a bounded history: the rounds it holds)."""
        records = [r for r in self.history if self.reward_node in r.readings and not r.in_flat]
        if not records:
            return
        x = torch.stack([self._flat_row(r) for r in records]).unsqueeze(0)
        y = [[r.readings[self.reward_node] for r in records]]
        self._flat.learn_many(x, torch.tensor(y, dtype=self.dtype, device=self.device))
        for record in records:
            record.in_flat = True

    def _flat_learn(self, round_index: int, refit: bool) -> None:
        record = self.history[round_index]
        if record.in_flat or self.reward_node not in record.readings:
            return
        x = self._flat_row(record).unsqueeze(0)
        y = torch.tensor([record.readings[self.reward_node]], dtype=self.dtype, device=self.device)
        self._flat.learn_one(x, y, refit=refit)
        record.in_flat = True
