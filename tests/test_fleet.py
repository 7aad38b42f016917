"""A fleet of `cbo-agent serve` replicas on one PostgreSQL and a real Mosquitto (loopback, every
wait bounded): failover after kill -9, a SIGSTOPped replica fenced, the control plane on a
running fleet. The rig and its audit are `bench.fleet`'s (store + the devices' own logs):
rounds numbered once, every applied round applied under one action id, every published
reading stored, no budget overspent, epochs applied in order.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.control import submit
from bench.fleet import FleetRig
from bench.harness.procs import JsonLog, wait_until
from connectors.store import StoreError
from core.spec import parse_spec
from tests.brokers import find_mosquitto
from tests.stores import postgres_unavailable, scratch_database

TTL_S = 3.0
pytestmark = [pytest.mark.integration]


@pytest.fixture
def pg_url() -> Iterator[str]:
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(reason)
    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed")
    with scratch_database() as url:
        yield url


def _failover(rig: FleetRig, kills: int, seed: int) -> list[float]:
    """Kill -9 a random replica `kills` times at random moments (restarting it under the same
    id after its experiments moved); seconds until each of its experiments was held again.

    The victim is drawn among the replicas holding an experiment at that moment: a replica
    restarted after an earlier kill holds nothing until the others let go of something, and
    killing it would test no failover. Between kills the experiments are paused while the
    victim restarts (30 s at load 15: longer than they run), so the next kill still finds
    rounds in flight; they run again a heartbeat before it."""
    rng = random.Random(seed)
    took: list[float] = []
    for kill in range(kills):
        if kill:
            _set_states(rig, rig.store.resume)
            time.sleep(TTL_S / 3)  # a heartbeat: every owner has seen it (`FleetSettings`)
        time.sleep(rng.uniform(0.5, 2.5))
        holders = sorted({owner for owner in rig.owners().values() if owner is not None})
        victim = rng.choice(holders or sorted(rig.replicas))
        took += rig.failover(victim, TTL_S + 15)
        if kill < kills - 1:
            _set_states(rig, rig.store.pause)
        rig.start_replica(victim)
    return took


def _set_states(rig: FleetRig, verb: Callable[[str], bool]) -> None:
    """Pause or resume every experiment not stopped (finished) yet."""
    for name in rig.names:
        with contextlib.suppress(StoreError):
            verb(name)


def _check(rig: FleetRig, took: list[float], *, wall_bound: bool = True) -> None:
    audit = rig.audit()
    assert audit.problems == []
    assert 0 < audit.rounds <= len(rig.names) * rig.rounds  # a round limit, or the budget
    assert audit.readings_published == audit.readings_stored > 0
    assert took, "the victim held no experiment"
    assert math.inf not in took, f"not every experiment was taken over: {sorted(took)}"
    _check_failover_times(rig, wall_bound)


def _check_failover_times(rig: FleetRig, wall_bound: bool) -> None:
    """Every experiment of a killed replica resumed on another within TTL + 5 s of the kill
    (issue 18): from the kill (the test's clock once the victim is reaped) to the new owner's
    ``fleet.taken`` (rebuilt from the store, subscribed, about to re-ask the device). And each
    takeover came within what the settings allow, in two parts, which say what was slow when
    the wall bound fails.

    The lease: the victim renewed it at most a heartbeat before the kill, so it ran out at most
    a TTL after (the store's clock, read just after the kill). The claim: once the lease ran
    out, a survivor's claim pass (every heartbeat) took it within a heartbeat, plus the
    rebuilding of what the survivors took over before it in the same failover (their
    `load_s`, as they measured them; summed over the survivors, as if one did it all: a
    survivor at its capacity leaves the rest to another, a restarted one rebuilds its first
    experiment cold), plus two heartbeats of slack for subscribing and for an event loop
    behind on a loaded machine.

    The wall bound failed now and then on a loaded 2-core machine where rebuilding was slow:
    the first experiment a replica took imported every policy module (cma, matplotlib: 2.5 s
    at load 6, more under heavier load) inside the takeover. A replica imports them before it
    starts (`fleet.started`), and the wall bound is checked again — where one replica takes
    over a few experiments. Where it takes over ten, rebuilding them one after another (each
    replays its history: 0.2–2.2 s each at load 18–20, nice 19) took up to 8.8 s with this
    TTL of 3 s: the slow test checks the per-part bounds only (`wall_bound=False`), and
    docs/benchmarks.md says so.
    """
    heartbeat = TTL_S / 3  # `FleetSettings.period_s`: the rig sets no heartbeat
    loaded: dict[str, float] = {}  # victim -> rebuilding of its experiments so far
    for takeover in sorted(rig.takeovers, key=lambda t: t.seconds):
        loaded[takeover.victim] = loaded.get(takeover.victim, 0.0) + takeover.load_s
        rebuilt = loaded[takeover.victim]
        claim_s = takeover.seconds - max(0.0, takeover.lease_left_s)
        allowed = heartbeat + rebuilt + 2 * heartbeat
        what = (
            f"{takeover.experiment} taken by {takeover.owner} {takeover.seconds:.2f} s after "
            f"{takeover.victim} was killed, its lease running {takeover.lease_left_s:.2f} s "
            f"more, granted {takeover.acquired_s} s after the kill (TTL {TTL_S} s, heartbeat "
            f"{heartbeat:.2f} s, rebuilding {rebuilt:.2f} s); all: {rig.takeovers}"
        )
        assert takeover.lease_left_s <= TTL_S + 0.1, what
        assert claim_s <= allowed, f"claimed {claim_s:.2f} s after the lease ran out: {what}"
        if wall_bound:
            assert takeover.seconds <= TTL_S + 5.0, f"not resumed within TTL + 5 s: {what}"


def test_failover_three_replicas_no_reading_lost_nothing_twice(pg_url: str, tmp_path: Path) -> None:
    with FleetRig(
        tmp_path, pg_url, experiments=6, replicas=3, lease_ttl_s=TTL_S, rounds=8,
        budget_total=5.0, capacity=4,
    ) as rig:  # fmt: skip
        rig.start_replicas()
        rig.start_devices()
        rig.submit_all()
        rig.wait_owned(60)
        took = _failover(rig, kills=1, seed=1)
        rig.wait_all_finished(120)
        _check(rig, took)


@pytest.mark.slow
def test_failover_thirty_experiments_killed_three_times(pg_url: str, tmp_path: Path) -> None:
    with FleetRig(
        tmp_path, pg_url, experiments=30, replicas=3, lease_ttl_s=TTL_S, rounds=25,
        budget_total=15.0, capacity=20,
    ) as rig:  # fmt: skip
        rig.start_replicas()
        rig.start_devices()
        rig.submit_all()
        rig.wait_owned(120)
        took = _failover(rig, kills=3, seed=7)
        rig.wait_all_finished(300)
        _check(rig, took, wall_bound=False)  # ten takeovers each: see `_check_failover_times`


@pytest.mark.slow  # about 50 s: three processes importing torch, a TTL waited out
def test_a_sigstopped_replica_past_its_ttl_cannot_write_or_actuate(
    pg_url: str, tmp_path: Path
) -> None:
    with FleetRig(
        tmp_path, pg_url, experiments=2, replicas=1, lease_ttl_s=TTL_S, rounds=10_000
    ) as rig:
        frozen = rig.start_replica("replica-0")
        rig.start_devices()
        rig.submit_all()
        rig.wait_owned(60)
        wait_until("rounds", lambda: rig.rounds_started() >= 4, 30)
        epochs = {r.name: r.epoch for r in rig.store.experiments()}
        frozen.pause()
        paused_at = time.monotonic()
        before = {(name, row.round) for name in rig.names for row in rig.store.rounds(name)}
        other = rig.start_replica("replica-1")
        wait_until(
            "replica-1 owns both",
            lambda: set(rig.owners().values()) == {"replica-1"},
            TTL_S + 10,
        )
        assert time.monotonic() - paused_at > TTL_S
        rounds_before = rig.rounds_started()
        frozen.resume()
        for name in rig.names:
            frozen.log.wait_for("fleet.dropped", 10, experiment=name, epoch=epochs[name])
        wait_until("rounds go on", lambda: rig.rounds_started() > rounds_before + 4, 30)
        ending = time.time() - 1.0  # what was published before this has an owner to store it
        frozen.stop()  # first: it would take the experiments back from a stopped replica-1
        other.stop()
        problems = rig.audit(ending).problems  # epochs in order, nothing twice, nothing lost

    dropped = {
        e["experiment"]: e["why"] for e in frozen.log.named("fleet.dropped") if e["epoch"] == 1
    }
    # lease_expired: its own clock said so first; lease_lost: the store refused a write or the
    # renewal; store_error: the server had closed its connection, idle in a transaction
    assert set(dropped.values()) <= {"lease_expired", "lease_lost", "store_error"}, dropped
    taken = {e["experiment"]: _unix(e) for e in other.log.named("fleet.taken")}
    # A write the frozen replica had under way may commit before the new owner's acquisition
    # (the store orders them, and refuses it after); its log line may still come after the
    # resume: the publication of a round it had proposed before it was frozen (the mark
    # commits in a worker thread, which logs once it runs again). No new round, ever.
    late_writes = [
        e
        for e in frozen.log.events
        if e["event"] in ("round.proposed", "round.published")
        and e.get("epoch") == epochs[e["experiment"]]
        and _unix(e) > taken[e["experiment"]]
        and not (e["event"] == "round.published" and (e["experiment"], e["round"]) in before)
    ]
    assert late_writes == []
    devices = JsonLog(rig.devices.log.path)
    applied = [
        e
        for e in devices.named("device.ack_published", status="applied")
        if _unix(e) > max(taken.values())
    ]
    assert applied and all(e["epoch"] > epochs[e["experiment"]] for e in applied)
    assert problems == []


@pytest.mark.slow  # about 50 s (tests/test_control_cli.py is the fast, store-level one)
def test_control_plane_on_a_running_fleet(pg_url: str, tmp_path: Path) -> None:
    with FleetRig(
        tmp_path, pg_url, experiments=3, replicas=2, lease_ttl_s=TTL_S, rounds=10_000
    ) as rig:
        rig.start_replicas()
        rig.start_devices()
        rig.submit_all()
        rig.wait_owned(60)
        paused, stopped, running = rig.names
        store = ("--store", pg_url)

        def count(name: str) -> int:
            return len(rig.store.rounds(name))

        wait_until("rounds", lambda: min(count(n) for n in rig.names) >= 3, 30)
        assert main(["pause", paused, *store]) == 0
        time.sleep(TTL_S)  # a heartbeat has told the owner; rounds in flight finish
        held = count(paused)
        time.sleep(TTL_S)
        assert count(paused) == held  # no new round while paused
        assert rig.owners()[paused] is not None  # still owned: late feedback is stored
        assert main(["resume", paused, *store]) == 0
        wait_until("resumed", lambda: count(paused) > held + 2, 20)

        assert main(["stop", stopped, *store]) == 0
        stopped_at = time.time()
        wait_until("released", lambda: rig.owners()[stopped] is None, 10)
        final = count(stopped)
        before = count(running)
        time.sleep(TTL_S)
        assert count(stopped) == final
        assert count(running) > before  # the others go on

        submit(rig.store, [parse_spec(rig.spec("fleet-late"), "fleet-late")])  # a new one
        wait_until("taken", lambda: rig.owners().get("fleet-late") is not None, 10)

    devices = JsonLog(rig.devices.log.path)
    late = [
        e
        for e in devices.named("device.action_received", experiment=stopped)
        if _unix(e) > stopped_at + 0.2
    ]
    assert late == []  # a stopped experiment is never actuated again


def _unix(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
