"""What a chaos run must leave behind, checked from the agent's store and the device's log.

The store says what the agent accepted, proposed and paid for; the device's log says what it
applied and published. `verify` rebuilds the experiment from the store as a restarted agent would
(`agent.experiment.Experiment`) and compares the three.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog.testing

from agent.experiment import Experiment
from connectors.mqtt import BrokerConfig, MqttConnection, MqttConnectionError
from connectors.schemas import DecodeError, Reading, decode
from connectors.store import Store
from core.spec import load_spec

Event = dict[str, Any]
ReadingKey = tuple[str, str, int]  # device, node, seq: what the store deduplicates on


@dataclass
class DeviceRecord:
    """What the simulator device did, from its JSON log."""

    device_id: str = ""
    round_of: dict[str, int] = field(default_factory=dict)  # action id -> round
    attempts: dict[str, list[int]] = field(default_factory=lambda: collections.defaultdict(list))
    applied: collections.Counter[str] = field(default_factory=collections.Counter)
    published: dict[ReadingKey, int] = field(default_factory=dict)  # reading -> round
    dropped: set[ReadingKey] = field(default_factory=set)  # deliberately never sent

    @property
    def applied_ids(self) -> list[str]:
        return [action_id for action_id, times in self.applied.items() if times > 0]

    def applied_twice(self) -> int:
        """Same action applied more than once, plus rounds in which more than one action was."""
        again = sum(times - 1 for times in self.applied.values() if times > 1)
        per_round = collections.Counter(self.round_of[a] for a in self.applied_ids)
        return again + sum(n - 1 for n in per_round.values() if n > 1)


def device_record(events: Iterable[Event]) -> DeviceRecord:
    """Parse the device's events. An `action_received` is an application unless the same call
    logged `action_duplicate` (already applied) or `action_rejected` (busy, invalid) after it."""
    record = DeviceRecord()
    for event in events:
        name = event["event"]
        if name == "device.starting":
            record.device_id = event["device_id"]
        elif name == "device.action_received":
            action_id = event["action_id"]
            record.round_of[action_id] = int(event["round"])
            record.attempts[action_id].append(int(event["attempt"]))
            record.applied[action_id] += 1
        elif name in ("device.action_duplicate", "device.action_rejected"):
            record.applied[event["action_id"]] -= 1
        elif name == "device.reading_published":
            key = (event["device_id"], event["node"], int(event["seq"]))
            record.published[key] = int(event["round"])
        elif name == "device.reading_dropped":
            record.dropped.add((event["device_id"], event["node"], int(event["seq"])))
    return record


async def _drain(port: int, client_id: str, quiet_s: float, timeout_s: float) -> list[bytes]:
    config = BrokerConfig(
        host="127.0.0.1",
        port=port,
        client_id=client_id,
        protocol="5",
        clean_start=False,
        session_expiry_s=3600,
        timeout_s=5.0,
    )
    payloads: list[bytes] = []
    async with MqttConnection(config) as connection:
        messages = connection.messages()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while True:
                    message = await asyncio.wait_for(anext(messages), quiet_s)
                    if message.topic.endswith("/reading"):
                        payloads.append(message.payload)
    return payloads


def drain_session(port: int, client_id: str, quiet_s: float = 1.0, timeout_s: float = 15.0) -> set:
    """Readings still queued for the agent's persistent session (they would reach its next life).

    Connects with the agent's client id, so call it only when no life of the agent is running.
    """
    try:
        with structlog.testing.capture_logs():  # the harness's own connection is not news
            payloads = asyncio.run(_drain(port, client_id, quiet_s, timeout_s))
    except MqttConnectionError:
        return set()
    keys: set[ReadingKey] = set()
    for payload in payloads:
        with contextlib.suppress(DecodeError):
            reading = decode(payload, Reading)
            keys.add((reading.device_id, reading.node, reading.seq))
    return keys


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Verdict:
    numbers: dict[str, Any]
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def verify(
    spec_path: Path,
    store_path: Path,
    device: DeviceRecord,
    queued: set[ReadingKey],
) -> Verdict:
    """Everything the chaos run must satisfy, with the numbers behind each check."""
    spec = load_spec(spec_path)
    name = spec.name
    with Store(store_path) as store:
        rounds = store.rounds(name)
        stored = store.readings(name)
        ledger = store.ledger(name)
        ledger_state = {entry.round: entry.state for entry in store.ledger_entries(name)}
        # What a restarted agent would hold: the experiment rebuilt from the store alone.
        with structlog.testing.capture_logs():  # its recovery log line is not news here
            rebuilt = Experiment(spec, store)
        model = rebuilt.model
        in_model = {
            (number, node): value
            for number, live in rebuilt.rounds.items()
            for node, value in model.history[live.model_round].readings.items()
            if not (model.reward_function is not None and node == model.reward_node)
        }
        observations = [int(n) for n in model.gp.num_observations.tolist()]
        expected_obs = _complete_rows(rebuilt)
    stored_values = {(r.round, r.node): r.value for r in stored}
    stored_keys = {(r.device_id, r.node, r.seq) for r in stored}
    by_round = {row.round: row for row in rounds}
    statuses = collections.Counter(row.status for row in rounds)
    budget = spec.constraints.budget_total
    applied_ids = device.applied_ids
    unknown = [a for a in applied_ids if by_round.get(device.round_of[a]) is None]
    unknown += [
        a for a in applied_ids if a not in unknown and by_round[device.round_of[a]].action_id != a
    ]
    known = [a for a in applied_ids if a not in unknown]
    applied_cost = math.fsum(by_round[device.round_of[a]].cost for a in known)
    published = set(device.published)
    lost = sorted(published - stored_keys - queued)
    left_queued = sorted(queued - stored_keys)
    unexpected = sorted(k for k in stored_keys if k[0] == device.device_id and k not in published)
    applied_released = sorted(
        device.round_of[a] for a in known if ledger_state.get(device.round_of[a]) == "released"
    )
    numbers: dict[str, Any] = {
        "readings_accepted": len(stored),
        "readings_in_model": len(in_model),
        "rounds_completed": statuses.get("closed", 0),
        "budget": budget,
        "budget_spent": ledger.spent,
        "actions_applied_twice": device.applied_twice(),
        "rounds_proposed": len(rounds),
        "rounds_expired": statuses.get("expired", 0),
        "rounds_rejected": statuses.get("rejected", 0),
        "rounds_open": sum(statuses.get(s, 0) for s in ("proposed", "published", "acked")),
        "model_observations": sum(observations),
        "model_observations_expected": sum(expected_obs),
        "actions_applied": len(applied_ids),
        "actions_unknown_to_store": len(unknown),
        "budget_applied": applied_cost,
        "applied_but_released_rounds": applied_released,
        "readings_published": len(published),
        "readings_dropped_on_purpose": len(device.dropped),
        "readings_queued_at_end": len(left_queued),
        "readings_lost": len(lost),
        "readings_stored_never_published": len(unexpected),
    }
    numbers_in_rounds = sorted(by_round)
    twice = device.applied_twice()
    limit = math.inf if budget is None else budget + 1e-9
    checks = [
        Check(
            "readings_in_model == readings_accepted",
            in_model == stored_values,
            f"{len(in_model)} in the rebuilt model, {len(stored_values)} stored",
        ),
        Check(
            "every complete row taught its node's GP",
            observations == expected_obs,
            f"GP observations {observations}, complete rows {expected_obs}",
        ),
        Check("budget_spent <= budget", ledger.spent <= limit, f"{ledger.spent} of {budget}"),
        Check(
            "cost of actions the device applied <= budget",
            applied_cost <= limit,
            f"{applied_cost} of {budget}",
        ),
        Check(
            "applied actions are paid for (not released)",
            not applied_released,
            f"rounds {applied_released}" if applied_released else "all settled or reserved",
        ),
        Check("actions_applied_twice == 0", twice == 0, str(twice)),
        Check("applied actions are the store's", not unknown, f"{len(unknown)} unknown"),
        Check(
            "round numbers 0..n-1, one action each",
            numbers_in_rounds == list(range(len(rounds))),
            f"{len(rounds)} rounds",
        ),
        Check(
            "no reading lost on the way (published = stored + still queued)",
            not lost and not unexpected,
            f"{len(lost)} lost, {len(unexpected)} stored but never published",
        ),
        Check(
            "every published reading stored",
            not lost and not left_queued,
            f"{len(left_queued)} still queued for the agent's session after it finished"
            if left_queued
            else "all stored",
        ),
    ]
    return Verdict(numbers, checks)


def _complete_rows(exp: Experiment) -> list[int]:
    """Per GP node: rounds whose own and parents' readings are in, and that did not set it."""
    model = exp.model
    counts = []
    for node in model.order:
        parents = model.inputs[node].parents
        count = 0
        for live in exp.rounds.values():
            record = model.history[live.model_round]
            if node in model.set_nodes(record.intervention):
                continue
            if node in record.readings and all(p in record.readings for p in parents):
                count += 1
        counts.append(count)
    return counts
