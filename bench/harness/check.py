"""What a chaos run must leave behind, checked from the running agent, its store and the device.

The store says what the agent accepted, proposed and paid for; the device's log says what it
applied and published; the running agent's own /metrics say what its model holds. `LiveAudit`
(taken by the chaos run before each disruption and after the last, see `audit_once`) compares
the live agent's per-node observation counts with the rows the store's readings complete at that
moment — a check that fails if the agent stored a reading and did not learn it. `verify` also
rebuilds the experiment from the store as a restarted agent would (`agent.experiment.Experiment`)
and compares it, the store and the device's log.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog.testing
from prometheus_client.parser import text_string_to_metric_families

from agent.experiment import Experiment
from connectors.mqtt import BrokerConfig, MqttConnection, MqttConnectionError
from connectors.schemas import DecodeError, Reading, decode
from connectors.store import Store
from core.network import NetworkModel
from core.spec import ExperimentSpec, load_spec

__all__ = [
    "Check",
    "DeviceRecord",
    "LiveAudit",
    "LiveModel",
    "StoredRows",
    "Verdict",
    "audit_once",
    "device_record",
    "drain_session",
    "live_checks",
    "scrape_live_model",
    "stored_rows",
    "verify",
]

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
    values: dict[ReadingKey, float] = field(default_factory=dict)  # reading -> value sent
    oracles: dict[int, float] = field(default_factory=dict)  # round -> expected reward sent
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
            record.values[key] = float(event["value"])
        elif name == "device.oracle_published":
            record.oracles[int(event["round"])] = float(event["expected_reward"])
        elif name == "device.reading_dropped":
            record.dropped.add((event["device_id"], event["node"], int(event["seq"])))
    return record


async def _drain(
    port: int, client_id: str, quiet_s: float, timeout_s: float, login: tuple[str, str] | None
) -> list[tuple[str, bytes]]:
    credentials = {} if login is None else {"username": login[0], "password": login[1]}
    config = BrokerConfig(
        host="127.0.0.1",
        port=port,
        client_id=client_id,
        protocol="5",
        clean_start=False,
        session_expiry_s=3600,
        timeout_s=5.0,
        **credentials,
    )
    payloads: list[tuple[str, bytes]] = []
    async with MqttConnection(config) as connection:
        messages = connection.messages()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while True:
                    message = await asyncio.wait_for(anext(messages), quiet_s)
                    if message.topic.endswith("/reading"):
                        payloads.append((message.topic, message.payload))
    return payloads


def drain_session(
    port: int,
    client_id: str,
    quiet_s: float = 1.0,
    timeout_s: float = 15.0,
    login: tuple[str, str] | None = None,
) -> set:
    """Readings still queued for the agent's persistent session (they would reach its next life).

    Connects with the agent's client id (and its `login` on a broker with passwords), so call it
    only when no life of the agent is running.
    """
    try:
        with structlog.testing.capture_logs():  # the harness's own connection is not news
            payloads = asyncio.run(_drain(port, client_id, quiet_s, timeout_s, login))
    except MqttConnectionError:
        return set()
    keys: set[ReadingKey] = set()
    for topic, payload in payloads:
        with contextlib.suppress(DecodeError):
            reading = decode(payload, Reading)
            # as the agent takes it: from the device its topic names (a forger's claims are not)
            if topic.split("/")[-2] == reading.device_id:
                keys.add((reading.device_id, reading.node, reading.seq))
    return keys


# ---------------------------------------------------------------------------- the live agent
@dataclass
class LiveModel:
    """What the running agent exports about one experiment's model (its /metrics)."""

    observations: dict[str, int]  # GP node -> cbo_observations (absent before its first update)
    budget_spent: float | None


def scrape_live_model(metrics_url: str, experiment: str, timeout_s: float = 5.0) -> LiveModel:
    """Read `cbo_observations{node}` and `cbo_budget_spent` from a live agent's /metrics.

    Raises:
        OSError: the agent does not answer (it exited, say).
    """
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=timeout_s) as response:
        text = response.read().decode("utf-8")
    observations: dict[str, int] = {}
    spent = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("experiment") != experiment:
                continue
            if sample.name == "cbo_observations":
                observations[sample.labels["node"]] = int(sample.value)
            elif sample.name == "cbo_budget_spent":
                spent = float(sample.value)
    return LiveModel(observations, spent)


@dataclass
class StoredRows:
    """Per node, what the store's readings mean for the model, by the model's own rule."""

    stored: dict[str, int]  # node -> readings stored
    rows: dict[str, int]  # GP node -> rounds whose row for it is complete (it learned them)
    waiting: dict[str, int]  # node -> stored readings that teach no row (yet)
    budget_spent: float
    rounds_closed: int


def stored_rows(spec: ExperimentSpec, store: Store) -> StoredRows:
    """Count, per node, the rows the stored readings complete.

    As `core.network.NetworkModel.observe` decides: a GP node learns from a round when its own
    reading and all its parents' readings are in, unless a hard intervention set it that round;
    a decomposed reward has no GP (it is composed from its components, and may be a parent).
    Every other stored reading waits: its node was set, a parent's reading is missing, or the
    node has no GP.
    """
    structure = NetworkModel(spec)  # the graph's rules only; it learns nothing here
    name = spec.name
    rounds = {row.round: row for row in store.rounds(name)}
    present: dict[int, set[str]] = collections.defaultdict(set)
    stored: collections.Counter[str] = collections.Counter()
    for reading in store.readings(name):
        present[reading.round].add(reading.node)
        stored[reading.node] += 1
    g = structure.reward_function
    rows: collections.Counter[str] = collections.Counter()
    for number, nodes in present.items():
        if g is not None and all(c in nodes for c in g.components):
            nodes = nodes | {structure.reward_node}
        fixed = structure.set_nodes(rounds[number].intervention)
        for node in structure.order:
            parents = structure.inputs[node].parents
            if node in nodes and node not in fixed and all(p in nodes for p in parents):
                rows[node] += 1
    waiting = {
        node: stored[node] - rows[node] for node in structure.inputs if stored[node] - rows[node]
    }
    closed = sum(row.status == "closed" for row in rounds.values())
    return StoredRows(
        stored=dict(stored),
        rows={node: rows[node] for node in structure.order},
        waiting=waiting,
        budget_spent=store.ledger(name).spent,
        rounds_closed=closed,
    )


@dataclass
class LiveAudit:
    """The live agent's model against the store's readings, read right after its /metrics."""

    live: LiveModel
    store: StoredRows
    scrapes: int = 1

    @property
    def exported(self) -> bool:
        """The agent has updated its model in this life (the gauges exist from then on)."""
        return bool(self.live.observations)

    @property
    def observations_match(self) -> bool:
        return self.live.observations == self.store.rows

    @property
    def budget_matches(self) -> bool:
        spent = self.live.budget_spent
        return spent is None or math.isclose(spent, self.store.budget_spent, abs_tol=1e-9)

    @property
    def agrees(self) -> bool:
        return self.observations_match and self.budget_matches

    @property
    def readings_accepted(self) -> int:
        return sum(self.store.stored.values())

    @property
    def readings_in_model(self) -> int:
        """The rows the live model learned, plus the stored readings that by rule teach none."""
        return sum(self.live.observations.values()) + sum(self.store.waiting.values())


def audit_once(metrics_url: str, spec: ExperimentSpec, store_path: Path) -> LiveAudit:
    """One scrape of the live agent, then the store (read after it: readings are stored before
    they teach, so a consistent pair has the live counts equal to the store's complete rows)."""
    live = scrape_live_model(metrics_url, spec.name)
    with Store(store_path) as store:
        rows = stored_rows(spec, store)
    return LiveAudit(live, rows)


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
    audit: LiveAudit | None = None,
) -> Verdict:
    """Everything the chaos run must satisfy, with the numbers behind each check.

    `audit` is the live agent's model against the store, as late as the run could take it
    (None: it could take none, which fails the readings-in-model check).
    """
    spec = load_spec(spec_path)
    name = spec.name
    with Store(store_path) as store:
        rounds = store.rounds(name)
        stored = store.readings(name)
        oracles = store.oracles(name)
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
    # value for value: each stored reading is what the device published under its key, for
    # the round it published it for
    differ = sorted(
        (r.device_id, r.node, r.seq)
        for r in stored
        if (r.device_id, r.node, r.seq) in device.values
        and (
            device.values[(r.device_id, r.node, r.seq)] != r.value
            or device.published[(r.device_id, r.node, r.seq)] != r.round
        )
    )
    stored_oracles = {o.round: o.expected_reward for o in oracles}
    oracle_differ = sorted(
        n for n, value in stored_oracles.items() if device.oracles.get(n) != value
    )
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
    # the device's readings the agent would still get; other devices' (a forger's) are not ours
    left_queued = sorted(k for k in queued - stored_keys if k[0] == device.device_id)
    unexpected = sorted(k for k in stored_keys if k[0] == device.device_id and k not in published)
    applied_released = sorted(
        device.round_of[a] for a in known if ledger_state.get(device.round_of[a]) == "released"
    )
    numbers: dict[str, Any] = {
        "readings_accepted": audit.readings_accepted if audit else len(stored),
        "readings_in_model": audit.readings_in_model if audit else None,
        "rounds_completed": statuses.get("closed", 0),
        "budget": budget,
        "budget_spent": ledger.spent,
        "actions_applied_twice": device.applied_twice(),
        "rounds_proposed": len(rounds),
        "rounds_expired": statuses.get("expired", 0),
        "rounds_rejected": statuses.get("rejected", 0),
        "rounds_open": sum(statuses.get(s, 0) for s in ("proposed", "published", "acked")),
        "audit_rounds_closed": audit.store.rounds_closed if audit else None,
        "live_model_observations": _per_node(audit.live.observations) if audit else None,
        "audit_readings_waiting": sum(audit.store.waiting.values()) if audit else None,
        "readings_stored": len(stored),
        "readings_in_rebuilt_model": len(in_model),
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
        "readings_stored_unlike_published": len(differ),
        "oracles_stored": len(stored_oracles),
        "oracles_stored_unlike_published": len(oracle_differ),
    }
    numbers_in_rounds = sorted(by_round)
    twice = device.applied_twice()
    limit = math.inf if budget is None else budget + 1e-9
    checks = [
        *live_checks(audit),
        Check(
            "a restarted agent rebuilds every stored reading",
            in_model == stored_values,
            f"{len(in_model)} in the rebuilt model, {len(stored_values)} stored",
        ),
        Check(
            "every complete row taught its node's GP (rebuilt from the store)",
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
            "stored readings and oracle values equal the device's (value for value)",
            not differ and not oracle_differ and not unexpected,
            f"{len(differ)} readings and {len(oracle_differ)} oracle values differ from the "
            f"device's log, {len(unexpected)} readings it never published"
            if differ or oracle_differ or unexpected
            else f"{len(stored)} readings, {len(stored_oracles)} oracle values: all as published",
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


def live_checks(audit: LiveAudit | None) -> list[Check]:
    """readings_in_model == readings_accepted, from the running agent's /metrics."""
    name = "readings_in_model == readings_accepted (live agent vs store)"
    if audit is None:
        return [Check(name, False, "no live audit: the agent never answered with its model")]
    rows = audit.store
    detail = (
        f"live cbo_observations {_per_node(audit.live.observations) or 'not exported'}, "
        f"complete rows in the store {_per_node(rows.rows)}"
        + (f", {sum(rows.waiting.values())} readings teach no row" if rows.waiting else "")
        + f" (at {rows.rounds_closed} closed rounds, {audit.scrapes} scrapes)"
    )
    spent = audit.live.budget_spent
    return [
        Check(name, audit.observations_match, detail),
        Check(
            "live budget_spent == the ledger's",
            audit.budget_matches,
            f"exported {spent}, ledger {rows.budget_spent}"
            if spent is not None
            else "not exported in this life yet",
        ),
    ]


def _per_node(counts: dict[str, int]) -> str:
    return ", ".join(f"{node}={count}" for node, count in counts.items())


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
