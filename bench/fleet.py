"""`cbo-agent bench fleet`: replicas of `cbo-agent serve` sharing one store, measured and audited.

`FleetRig` puts on this machine (127.0.0.1 only): a Mosquitto, the store (SQLite file or a
PostgreSQL URL), N submitted experiments (an example spec renamed ``fleet-0000``..., the random
policy, a round limit and a budget), one process hosting a simulated device per experiment
(`bench.harness.devices`) and R replica processes (`cbo-agent serve`), each logging JSON lines.
It can kill -9, SIGSTOP and SIGCONT a replica, and `audit` checks what the fleet did from the
store and the devices' logs:

- every experiment's rounds are numbered 0..k-1 and every round number was applied by its device
  with one action id only (no round numbered twice, no action applied twice);
- every reading a device published is in the store (no reading lost);
- no experiment spent more than its budget;
- no device applied an action of an older epoch after one of a newer (fencing).

The audit that counts runs after `quiesce`: every experiment paused through the control plane
and the fleet quiet (no round open, no reading stored for 3 s), so a reading still waiting in a
busy replica's input is not mistaken for a lost one; a cut-off audit taken at the end of the
window (readings older than 2 s) is kept beside it, in ``audit.json`` with the readings each
found missing.

`run` measures, per (store, replicas, experiments): decisions per second (rounds started in the
store per second of the run), the decision latency p95 (the replicas' ``round.published``
events: last reading of a round → next action), resident memory per experiment (replica RSS
while owning them minus its RSS before any was submitted, over the experiments owned) and, with
several replicas, the failover time: one replica is killed (kill -9) and, per experiment it
held, the time until another replica has taken it over (its ``fleet.taken`` event: rebuilt
from the store, subscribed, driven).
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from agent.control import submit
from agent.paths import example_spec
from bench.harness.postgres import scratch_database
from bench.harness.procs import (
    Child,
    JsonLog,
    child_environment,
    cli,
    shipped_broker_limits,
    wait_until,
)
from bench.report import device_info
from connectors.mosquitto import MosquittoBroker, MosquittoOptions
from connectors.store import Store, StoreError
from core.spec import parse_spec

__all__ = ["Audit", "FleetRig", "FleetRow", "Takeover", "run"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class FleetRow:
    """One measured configuration (what the JSON holds)."""

    experiments: int
    replicas: int
    store: str  # "sqlite" or "postgresql"
    decisions_per_s: float
    p95_decision_s: float | None
    p50_decision_s: float | None
    rss_mb_per_experiment: float | None
    failover_p50_s: float | None
    failover_p95_s: float | None
    lease_ttl_s: float
    rounds: int  # rounds started in the store during the measured window
    window_s: float
    store_bytes_per_1000_rounds: float | None
    audit_problems: int
    readings_lost: int  # published, never stored: counted after the fleet was drained
    # published more than 2 s before the end of the window and not stored yet then (waiting in
    # a replica's queue: the replicas' lag, not a loss unless `readings_lost` counts it)
    readings_unstored_at_cutoff: int
    experiments_owned: int  # held by a live lease at the end of the window
    leases_lapsed: int  # a replica's own lease ran out before it could renew it (overload)
    device: str = "cpu"  # where the replicas' GPs live (their CBO_DEVICE)
    device_name: str = ""


@dataclass
class Audit:
    """What `FleetRig.audit` found; `problems` empty means every property held."""

    experiments: int
    rounds: int
    readings_published: int
    readings_stored: int
    applied: int
    stale_dropped: int
    problems: list[str] = field(default_factory=list)
    # (experiment, round, node, seq, unix time first published) of each reading not stored
    lost: list[tuple[str, int, str, int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Takeover:
    """One experiment of a killed replica, held again: by whom, how long after the kill
    (`seconds`: its ``fleet.taken``, rebuilt, subscribed and about to be driven), how long the
    victim's lease still ran then, when the new owner's lease was granted (`acquired_s` after
    the kill; None if the replica did not say) and how long it spent acquiring and rebuilding
    it (its `load_s`)."""

    experiment: str
    victim: str
    owner: str
    seconds: float
    lease_left_s: float
    load_s: float
    acquired_s: float | None = None


class FleetRig:
    """Broker, store, devices and replicas for one fleet run; a context manager that stops
    everything it started."""

    def __init__(
        self,
        workdir: Path,
        store_url: str,
        *,
        experiments: int,
        replicas: int,
        lease_ttl_s: float = 3.0,
        capacity: int | None = None,
        rounds: int = 20,
        budget_total: float | None = None,
        env: str = "toygraph",
        device_delay_s: float = 0.05,
        device: str = "cpu",
    ) -> None:
        self.workdir = workdir
        self.store_url = store_url
        self.names = [f"fleet-{i:04d}" for i in range(experiments)]
        self.replica_count = replicas
        self.lease_ttl_s = lease_ttl_s
        self.capacity = capacity or experiments
        self.rounds = rounds
        self.budget_total = budget_total
        self.env = env
        self.device_delay_s = device_delay_s
        self.device = device  # the replicas' CBO_DEVICE: where their GPs live
        self.broker: MosquittoBroker | None = None
        self.devices: Child | None = None
        self.replicas: dict[str, Child] = {}
        self.takeovers: list[Takeover] = []  # every takeover `failover` saw
        self.store = Store(store_url)

    # ---- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> FleetRig:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # the shipped in-flight and queue limits: with Mosquitto's defaults (20 in flight, 1,000
        # queued) a replica behind its input has the broker drop its readings
        options = MosquittoOptions(extra_lines=shipped_broker_limits())
        self.broker = MosquittoBroker(self.workdir / "mosquitto", options)
        self.broker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for child in [*self.replicas.values(), self.devices]:
            if child is not None:
                child.stop()
        if self.broker is not None:
            self.broker.stop()
        self.store.close()

    def spec(self, name: str) -> dict[str, Any]:
        spec = yaml.safe_load(example_spec(self.env).read_text())
        spec["name"] = name
        spec["policy"] = {"name": "random", "settings": {}}
        spec["schedule"] = {
            "max_rounds": self.rounds,
            "ack_timeout_s": 1.0,
            "ack_retries": 4,
            "round_timeout_s": 3.0,
        }
        spec["constraints"] = (
            {} if self.budget_total is None else {"budget_total": self.budget_total}
        )
        return spec

    def submit_all(self) -> None:
        submit(self.store, [parse_spec(self.spec(name), name) for name in self.names])

    def start_devices(self) -> None:
        assert self.broker is not None
        argv = [
            sys.executable,
            "-m",
            "bench.harness.devices",
            "--broker",
            self.broker.url,
            "--env",
            self.env,
            "--delay",
            str(self.device_delay_s),
            *self.names,
        ]
        self.devices = Child("devices", argv, self.workdir / "devices.log", child_environment())

    def start_replica(self, name: str) -> Child:
        assert self.broker is not None
        argv = [
            *cli(),
            "serve",
            "--store",
            self.store_url,
            "--broker",
            self.broker.url,
            "--agent-id",
            name,
            "--capacity",
            str(self.capacity),
            "--lease-ttl",
            str(self.lease_ttl_s),
            "--metrics-port",
            "0",
        ]
        environment = child_environment() | {"CBO_DEVICE": self.device}
        path = self.workdir / f"{name}.log"
        # a replica restarted under its name appends to its log: wait for *its* start
        earlier = JsonLog(path)
        if path.exists():
            earlier.poll()
        child = Child(name, argv, path, environment)
        self.replicas[name] = child
        child.log.wait_for("fleet.started", 60, child=child, since=len(earlier.events))
        return child

    def start_replicas(self) -> None:
        for i in range(self.replica_count):
            self.start_replica(f"replica-{i}")

    # ---- observation -------------------------------------------------------------------------
    def owners(self) -> dict[str, str | None]:
        """experiment -> the replica holding a live lease on it (None: nobody)."""
        return {r.name: (r.owner if r.leased else None) for r in self.store.experiments()}

    def states(self) -> dict[str, str]:
        return {r.name: r.state for r in self.store.experiments()}

    def rounds_started(self) -> int:
        return sum(len(self.store.rounds(name)) for name in self.names)

    def wait_all_finished(self, timeout_s: float) -> None:
        wait_until(
            "every experiment finished (stopped by its owner)",
            lambda: all(state == "stopped" for state in self.states().values()),
            timeout_s,
            poll_s=0.2,
        )

    def wait_owned(self, timeout_s: float) -> None:
        wait_until(
            "every experiment owned",
            lambda: all(owner is not None for owner in self.owners().values()),
            timeout_s,
            poll_s=0.1,
        )

    def quiesce(self, timeout_s: float, quiet_s: float = 3.0) -> bool:
        """Pause every experiment (the control plane) and wait until no round is open and no
        reading has been stored for `quiet_s`: then whatever a device published has had an
        owner to store it, however far behind the replicas were. False if not quiet in time."""
        for name in self.names:
            with contextlib.suppress(StoreError):  # stopped already (finished)
                self.store.pause(name)
        deadline = time.monotonic() + timeout_s
        last, still_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            progress = [self.store.experiment_status(name) for name in self.names]
            stored = sum(status.readings for status in progress)
            open_rounds = sum(status.open_rounds for status in progress)
            if stored != last or open_rounds:
                last, still_since = stored, time.monotonic()
            elif time.monotonic() - still_since >= quiet_s:
                return True
            time.sleep(0.2)
        return False

    def failover(self, victim: str, timeout_s: float) -> list[float]:
        """kill -9 `victim`; seconds until each experiment it held was taken over — rebuilt,
        subscribed and driven — by another replica (its ``fleet.taken`` event).

        What it held is read from the store *after* the kill, when the victim can change
        nothing more: an experiment it finished (stopped in the store) just before dying is
        not waited for — no replica takes a stopped experiment — and one it still owned is,
        its lease live or not."""
        self.replicas[victim].kill()
        killed_at = time.time()
        # when each of its leases runs out (the database's clock; the same machine's)
        expires = {
            r.name: r.lease_expires_at or killed_at
            for r in self.store.experiments()
            if r.owner == victim and r.state != "stopped"
        }
        held = set(expires)
        took: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        while len(took) < len(held) and time.monotonic() < deadline:
            for name, child in self.replicas.items():
                if name == victim:
                    continue
                for event in child.log.named("fleet.taken"):
                    experiment, at = event["experiment"], _unix(event)
                    if experiment in held and at > killed_at and experiment not in took:
                        took[experiment] = at - killed_at
                        self.takeovers.append(
                            Takeover(
                                experiment,
                                victim,
                                name,
                                seconds=at - killed_at,
                                lease_left_s=expires.get(experiment, killed_at) - killed_at,
                                load_s=float(event.get("load_s", 0.0)),
                                acquired_s=(
                                    None
                                    if event.get("acquired_at") is None
                                    else float(event["acquired_at"]) - killed_at
                                ),
                            )
                        )
            time.sleep(0.05)
        return sorted(took.values()) + [math.inf] * (len(held) - len(took))

    def decision_latencies(self) -> list[float]:
        latencies = []
        for child in self.replicas.values():
            for event in child.log.named("round.published"):
                if event.get("decision_latency_s") is not None:
                    latencies.append(float(event["decision_latency_s"]))
        return latencies

    def rss_mb(self, name: str) -> float:
        status = Path(f"/proc/{self.replicas[name].pid}/status").read_text()
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        return kb / 1024

    # ---- audit -------------------------------------------------------------------------------
    def audit(self, readings_until: float | None = None) -> Audit:
        """Check the fleet's record against what the devices did (see the module docstring).

        `readings_until` (unix time): only readings published before it must be stored — for
        a run whose replicas were stopped while devices still sent (no owner, no store)."""
        assert self.devices is not None
        log = JsonLog(self.devices.log.path)
        log.poll()
        applied: dict[tuple[str, int], set[str]] = defaultdict(set)
        published: dict[tuple[str, int, str, int], float] = {}  # -> first published (unix)
        stale = 0
        problems: list[str] = []
        newest: dict[str, int] = {}  # experiment -> the newest epoch applied so far
        for event in log.events:
            name = event["event"]
            if name == "device.ack_published" and event.get("status") == "applied":
                applied[(event["experiment"], int(event["round"]))].add(event["action_id"])
                epoch = event.get("epoch")
                if epoch is not None:
                    if epoch < newest.get(event["experiment"], -1):
                        problems.append(
                            f"{event['experiment']}: round {event['round']} applied with epoch "
                            f"{epoch} after epoch {newest[event['experiment']]}"
                        )
                    newest[event["experiment"]] = max(epoch, newest.get(event["experiment"], -1))
            elif name == "device.reading_published" and (
                readings_until is None or _unix(event) < readings_until
            ):
                key = (event["experiment"], int(event["round"]), event["node"], int(event["seq"]))
                published.setdefault(key, _unix(event))
            elif name == "device.action_stale_epoch":
                stale += 1
        stored: set[tuple[str, int, str, int]] = set()
        rounds = 0
        for name in self.names:
            rows = self.store.rounds(name)
            rounds += len(rows)
            numbers = [row.round for row in rows]
            if numbers != list(range(len(numbers))):
                problems.append(f"{name}: rounds {numbers} are not 0..{len(numbers) - 1}")
            ids = {row.round: row.action_id for row in rows}
            for (experiment, number), seen in applied.items():
                if experiment != name:
                    continue
                if len(seen) > 1:
                    problems.append(f"{name}: round {number} applied as {sorted(seen)}")
                elif ids.get(number) not in seen:
                    problems.append(
                        f"{name}: round {number} applied {seen}, stored {ids.get(number)}"
                    )
            stored |= {(name, r.round, r.node, r.seq) for r in self.store.readings(name)}
            spent = self.store.ledger(name).spent
            if self.budget_total is not None and spent > self.budget_total + 1e-9:
                problems.append(f"{name}: spent {spent} of a budget of {self.budget_total}")
        lost = sorted(published.keys() - stored)
        if lost:
            problems.append(f"{len(lost)} readings published but not stored, e.g. {lost[:3]}")
        return Audit(
            experiments=len(self.names),
            rounds=rounds,
            readings_published=len(published),
            readings_stored=len(stored),
            applied=sum(len(ids) for ids in applied.values()),
            stale_dropped=stale,
            problems=problems,
            lost=[(*key, published[key]) for key in lost],
        )


def _unix(event: dict[str, Any]) -> float:
    """A JSON log event's timestamp (ISO 8601, UTC) in unix seconds."""
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def measure(
    workdir: Path,
    store_url: str,
    experiments: int,
    replicas: int,
    *,
    lease_ttl_s: float,
    window_s: float,
    rounds: int,
    device: str = "cpu",
) -> FleetRow:
    """One configuration: start, measure a window of steady running, fail over, audit."""
    kind = "postgresql" if store_url.startswith("postgres") else "sqlite"
    with FleetRig(
        workdir,
        store_url,
        experiments=experiments,
        replicas=replicas,
        lease_ttl_s=lease_ttl_s,
        rounds=rounds,
        capacity=math.ceil(experiments / max(1, replicas - 1)) if replicas > 1 else experiments,
        device=device,
    ) as rig:
        rig.start_replicas()
        time.sleep(2.0)
        idle = {name: rig.rss_mb(name) for name in rig.replicas}
        rig.start_devices()
        rig.submit_all()
        try:
            rig.wait_owned(60 + experiments * 0.5)
        except TimeoutError:  # measured anyway; the row says how many were owned
            print(f"not every experiment owned after {60 + experiments * 0.5:g} s", file=sys.stderr)
        time.sleep(min(5.0, window_s / 2))  # the first rounds (recovery, imports) settle
        first, started = rig.rounds_started(), time.monotonic()
        time.sleep(window_s)
        done, elapsed = rig.rounds_started() - first, time.monotonic() - started
        owned: dict[str, int] = defaultdict(int)
        for owner in rig.owners().values():
            if owner is not None:
                owned[owner] += 1
        churn = sum(
            1
            for child in rig.replicas.values()
            for event in child.log.named("fleet.dropped")
            if event.get("why") == "lease_expired"
        )
        grown = [
            (rig.rss_mb(name) - idle[name]) / owned[name] for name in rig.replicas if owned[name]
        ]
        takeovers: list[float] = []
        if replicas > 1:
            takeovers = rig.failover("replica-0", lease_ttl_s + 30)
        latencies = rig.decision_latencies()
        size = rig.store.size_bytes()
        total = rig.rounds_started()
        # What a cut-off audit finds now (a reading 2 s old may still wait in a busy replica's
        # queue), kept beside the audit that counts: after every experiment was paused and the
        # fleet went quiet, every reading ever published must be in the store.
        early = rig.audit(readings_until=time.time() - 2.0)
        quiet = rig.quiesce(timeout_s=60 + experiments * 0.2)
        audit = rig.audit()
        if not quiet:
            audit.problems.append("the fleet did not go quiet within the drain timeout")
        (workdir / "audit.json").write_text(
            json.dumps({"before_drain": asdict(early), "after_drain": asdict(audit)}, indent=1)
        )
        for problem in audit.problems:
            print(f"audit: {problem}", file=sys.stderr)
    return FleetRow(
        experiments=experiments,
        replicas=replicas,
        store=kind,
        decisions_per_s=done / elapsed,
        p95_decision_s=_quantile(latencies, 0.95),
        p50_decision_s=_quantile(latencies, 0.5),
        rss_mb_per_experiment=statistics.median(grown) if grown else None,
        failover_p50_s=_quantile(takeovers, 0.5),
        failover_p95_s=_quantile(takeovers, 0.95),
        lease_ttl_s=lease_ttl_s,
        rounds=done,
        window_s=elapsed,
        store_bytes_per_1000_rounds=size / total * 1000 if total else None,
        audit_problems=len(audit.problems),
        readings_lost=len(audit.lost),
        readings_unstored_at_cutoff=len(early.lost),
        experiments_owned=sum(owned.values()),
        leases_lapsed=churn,
        **device_info(device),
    )


def run(
    experiments: list[int],
    replicas: list[int],
    stores: list[str],
    json_path: Path | None,
    *,
    lease_ttl_s: float = 5.0,
    window_s: float = 20.0,
    rounds: int = 10_000,
    workdir: Path = Path("results/bench-fleet"),
    device: str = "cpu",
) -> list[FleetRow]:
    """Measure every (store, replicas, experiments); print a table, write the JSON rows."""
    rows: list[FleetRow] = []
    for store_url in stores:
        for count in replicas:
            for n in experiments:
                where = workdir / f"{len(rows)}"
                with _fresh_store(store_url, where) as target:
                    row = measure(
                        where,
                        target,
                        n,
                        count,
                        lease_ttl_s=lease_ttl_s,
                        window_s=window_s,
                        rounds=rounds,
                        device=device,
                    )
                rows.append(row)
                print(_line(row), flush=True)
                if json_path is not None:
                    json_path.parent.mkdir(parents=True, exist_ok=True)
                    json_path.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return rows


@contextlib.contextmanager
def _fresh_store(store_url: str, where: Path) -> Iterator[str]:
    """``sqlite``: a new SQLite file in the run's folder. A PostgreSQL URL: a scratch database
    created on that server for the run and dropped after it (the URL's user must be allowed
    to create databases)."""
    if store_url.startswith(("postgresql:", "postgres:")):
        with scratch_database(store_url, prefix="cbo_fleet") as url:
            yield url
        return
    where.mkdir(parents=True, exist_ok=True)
    path = where / "fleet.sqlite"
    for leftover in where.glob("fleet.sqlite*"):
        leftover.unlink()
    yield str(path)


def _line(row: FleetRow) -> str:
    def f(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    return (
        f"{row.device} ({row.device_name}) "
        f"{row.store:10s} replicas={row.replicas} experiments={row.experiments:5d} "
        f"decisions/s={f(row.decisions_per_s, 1)} p95={f(row.p95_decision_s, 3)} s "
        f"rss/exp={f(row.rss_mb_per_experiment)} MB failover p95={f(row.failover_p95_s)} s "
        f"(ttl {row.lease_ttl_s:g}) lost={row.readings_lost} "
        f"(unstored at the cut-off: {row.readings_unstored_at_cutoff}) "
        f"audit problems={row.audit_problems}"
    )
