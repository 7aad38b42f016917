"""What a simulator device does with one action, decided at once and without I/O.

`Actuator.apply` turns an action into a `Plan`: the ack, the oracle message and the readings,
each reading with its sequence number, its delay and how many copies to send (0: dropped, 2: a
QoS 1 redelivery look-alike). Every random draw happens here, in the order actions arrive, so a
fixed seed gives the same values, drops, duplicates and delays whatever the network does later.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from connectors.arrays import ArrayPayload
from connectors.schemas import DEADLETTER_TEXT_LIMIT, Ack, Action, Oracle, Reading
from sim.base import Environment
from sim.errors import StatesNotRecorded

_FLOAT64_ELEMENTS = 4_096  # 32 kB of float64, 43.7 kB as base64: under the 64 KiB limit


class Rejected(Exception):
    """The device will not apply an action; the message is the ack's reason."""


@dataclass(frozen=True)
class PlannedReading:
    """One node's value of one round, `delay_s` after the action was applied."""

    node: str
    value: float | None  # None for an array node
    seq: int
    delay_s: float
    copies: int  # 0: dropped (the seq stays used, as for a message lost on the way), 1, or 2
    variance: float | None = None  # a mean over replications: the variance of the mean
    replications: int | None = None
    array: np.ndarray | None = None  # an array node's reading
    states: np.ndarray | None = None  # the reward's: the episode's visited states (issue 13)

    def message(self, experiment: str, round_: int, device_id: str) -> Reading:
        """The reading, stamped now (the sensor measures when it reports)."""
        return Reading(
            experiment=experiment,
            round=round_,
            node=self.node,
            value=self.value,
            seq=self.seq,
            device_id=device_id,
            at=time.time(),
            variance=self.variance,
            replications=self.replications,
            array=None if self.array is None else _payload(self.array),
            # float32: a trace of up to MAX_ARRAY_ELEMENTS values fits the payload limit
            states=None if self.states is None else ArrayPayload.from_numpy(self.states),
        )


def _payload(array: np.ndarray) -> ArrayPayload:
    """float64 where it fits the default payload limit with room to spare, else float32."""
    dtype = "float64" if array.size <= _FLOAT64_ELEMENTS else "float32"
    return ArrayPayload.from_numpy(array, dtype)


@dataclass(frozen=True)
class Plan:
    """Everything one applied action makes the device publish."""

    ack: Ack
    oracle: Oracle | None
    readings: tuple[PlannedReading, ...]  # sorted by delay


@dataclass(frozen=True)
class Noise:
    """How the device's sensors misbehave: delay, jitter, drops and duplicates."""

    delay_s: float = 0.0
    jitter_s: float = 0.0
    drop_rate: float = 0.0
    duplicate_rate: float = 0.0


class Actuator:
    """Applies actions to an environment with seeded randomness; keeps per-node sequences.

    Args:
        env: the environment.
        device_id: the id stamped on acks, readings and oracle messages.
        noise: delay, jitter, drop and duplicate settings.
        seed: seeds both the environment's noise (a torch.Generator) and the device's own draws.
        seq_start: the first sequence number of every node.
        optimum: E[y | a*] for oracle messages (a drifting environment's oracle message
            carries its round's own); None publishes no oracle.
    """

    def __init__(
        self,
        env: Environment,
        device_id: str,
        noise: Noise,
        seed: int,
        seq_start: int,
        optimum: float | None,
        send_states: bool = False,
    ) -> None:
        if send_states and not getattr(env, "records_states", False):
            raise StatesNotRecorded(env.name)
        if send_states:
            env.record_states = True  # type: ignore[attr-defined]
        self.env = env
        self.device_id = device_id
        self.noise = noise
        self.optimum = optimum
        self._generator = torch.Generator().manual_seed(seed)
        self._rng = random.Random(seed)
        self._next_seq = dict.fromkeys(env.node_names, seq_start)

    def apply(self, action: Action) -> Plan:
        """Validate, step the environment once and plan the messages; Rejected if invalid."""
        applied = self._validate(action)
        system = self.system(action.round)
        values, spread = system.step_with_spread(applied, self._generator)
        # taken before the oracle's episodes overwrite them
        states = (
            getattr(system, "last_states", None) if getattr(system, "record_states", 0) else None
        )
        oracle = None if self.optimum is None else self._oracle(action, applied, system)
        ack = Ack(
            experiment=action.experiment,
            round=action.round,
            action_id=action.action_id,
            device_id=self.device_id,
            status="applied",
            reason=None,
            applied=applied,
            at=time.time(),
        )
        readings = [
            self._plan_reading(node, values[node], *spread.get(node, (None, None)))
            for node in self.env.node_names
        ]
        if states is not None:  # they ride on the reward's reading (protocol version 4)
            readings = [
                dataclasses.replace(r, states=states) if r.node == self.env.reward_node else r
                for r in readings
            ]
        return Plan(ack, oracle, tuple(sorted(readings, key=lambda r: r.delay_s)))

    def system(self, round_: int) -> Environment:
        """The system as it is in that round: `env.at(round)` for an environment that drifts
        (`sim.dropwave_drift`, `sim.sir_seasonal`), else the environment itself."""
        at = getattr(self.env, "at", None)
        return self.env if at is None else at(round_)

    def reject(self, action: Action, reason: str) -> Ack:
        """The ack saying `action` was not applied, and why."""
        return Ack(
            experiment=action.experiment,
            round=action.round,
            action_id=action.action_id,
            device_id=self.device_id,
            status="rejected",
            reason=_clip(reason),
            applied={},
            at=time.time(),
        )

    def _validate(self, action: Action) -> dict[str, float]:
        env = self.env
        if action.kind != env.intervention_type:
            raise Rejected(
                f"{env.name} takes {env.intervention_type} interventions, not {action.kind}"
            )
        try:
            return env.validate(action.intervention)
        except ValueError as error:
            raise Rejected(str(error)) from None

    def _oracle(self, action: Action, applied: dict[str, float], system: Environment) -> Oracle:
        assert self.optimum is not None
        # a drifting system's optimum is that round's: the regret is the dynamic regret
        optimum = self.optimum if system is self.env else float(system.optimum.value)
        return Oracle(
            experiment=action.experiment,
            round=action.round,
            action_id=action.action_id,
            expected_reward=float(system.expected_reward(applied)),
            optimum=optimum,
            device_id=self.device_id,
            at=time.time(),
        )

    def _plan_reading(
        self, node: str, value: Any, variance: float | None, replications: int | None
    ) -> PlannedReading:
        # Three draws per reading whatever the rates, so changing one rate does not reshuffle
        # the others' decisions for the same seed.
        drop, duplicate, jitter = self._rng.random(), self._rng.random(), self._rng.random()
        noise = self.noise
        copies = 0 if drop < noise.drop_rate else 2 if duplicate < noise.duplicate_rate else 1
        array = value if isinstance(value, np.ndarray) else None
        finite = bool(np.isfinite(array).all()) if array is not None else math.isfinite(value)
        if not finite:
            copies = 0  # no schema can carry it; the seq stays used like a lost message's
        seq = self._next_seq[node]
        self._next_seq[node] = seq + 1
        delay_s = noise.delay_s + jitter * noise.jitter_s
        scalar = None if array is not None else float(value)
        return PlannedReading(
            node, scalar, seq, delay_s, copies, variance, replications, array=array
        )


def _clip(text: str) -> str:
    return text if len(text) <= DEADLETTER_TEXT_LIMIT else text[: DEADLETTER_TEXT_LIMIT - 1] + "…"
