"""The store's control plane, leases and fencing on both backends: submit, pause, resume and
stop; acquire, renew and release on the database's clock; a fenced writer whose epoch went
stale writes nothing — also when it was frozen (SIGSTOP) past its TTL, and when a takeover
races its writes from another process."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from connectors.store import (
    FencedError,
    FencedStore,
    NotRunning,
    Store,
    StoreError,
)
from tests.stores import RawDatabase, StoreChild

EXP = "line-3"
SPEC = {"nodes": ["X", "Y"], "budget": {"total": 10.0}}
TTL = 30.0


@pytest.fixture
def store(store_target: str) -> Iterator[Store]:
    with Store(store_target) as opened:
        opened.submit(EXP, SPEC)
        yield opened


def add_round(store: Store, r: int, cost: float = 1.0) -> None:
    store.add_round(EXP, r, f"a{r}", {"X": 0.5}, ["X"], cost, "hard", 1.0)


# ---- control plane --------------------------------------------------------------------------


def test_submit_is_idempotent_and_never_swaps_a_spec(store: Store) -> None:
    assert not store.submit(EXP, dict(SPEC))  # the same spec again: nothing written
    with pytest.raises(StoreError, match=f"'{EXP}' already exists with another spec"):
        store.submit(EXP, {"nodes": ["X"]})
    assert store.experiment_spec(EXP) == SPEC
    assert store.submit("line-4", {"nodes": ["Z"]})
    rows = store.experiments()
    assert [(r.name, r.state, r.owner, r.epoch, r.leased) for r in rows] == [
        (EXP, "running", None, 0, False),
        ("line-4", "running", None, 0, False),
    ]


def test_pause_resume_and_stop_gate_new_reservations(store: Store) -> None:
    for r in range(4):
        add_round(store, r)
    assert store.reserve(EXP, 0, 1.0, 10.0, 1.0)
    assert store.pause(EXP) and not store.pause(EXP)
    with pytest.raises(NotRunning, match=f"'{EXP}' is paused: round 1 gets no budget"):
        store.reserve(EXP, 1, 1.0, 10.0, 2.0)
    assert not store.reserve(EXP, 0, 1.0, 10.0, 2.0)  # a retry of a made reservation is fine
    assert store.settle(EXP, 0, 2.0)  # rounds in flight go on
    assert store.add_reading(EXP, 0, "Y", 1.0, 0, "dev", 2.0)  # and feedback is stored
    assert store.resume(EXP) and not store.resume(EXP)
    assert store.reserve(EXP, 1, 1.0, 10.0, 3.0)
    assert store.stop(EXP) and not store.stop(EXP)
    with pytest.raises(NotRunning, match="stopped: round 2 gets no budget"):
        store.reserve(EXP, 2, 1.0, 10.0, 4.0)
    for verb in (store.pause, store.resume):
        with pytest.raises(StoreError, match="is stopped: it cannot be made"):
            verb(EXP)
    with pytest.raises(StoreError, match="unknown experiment 'ghost'"):
        store.pause("ghost")
    status = store.experiment_status(EXP)
    assert status.experiment.state == "stopped" and status.experiment.state_at is not None
    assert (status.rounds, status.open_rounds, status.readings, status.spent) == (4, 4, 1, 2.0)


# ---- leases ---------------------------------------------------------------------------------


def test_a_lease_is_exclusive_until_it_expires_or_is_released(store: Store) -> None:
    first = store.acquire_lease(EXP, "replica-a", TTL)
    assert first is not None and (first.owner, first.epoch, first.state) == (
        "replica-a",
        1,
        "running",
    )
    assert store.acquire_lease(EXP, "replica-b", TTL) is None  # live: not b's to take
    assert store.claimable() == []
    (row,) = store.experiments()
    assert (row.owner, row.epoch, row.leased) == ("replica-a", 1, True)
    assert row.lease_expires_at == first.expires_at

    renewed = store.renew_lease(EXP, "replica-a", 1, 2 * TTL)
    assert renewed.epoch == 1 and renewed.expires_at > first.expires_at
    assert not store.release_lease(EXP, "replica-b", 1)  # not b's
    assert not store.release_lease(EXP, "replica-a", 7)  # not this epoch's
    assert store.release_lease(EXP, "replica-a", 1)
    assert store.claimable() == [EXP]
    second = store.acquire_lease(EXP, "replica-b", TTL)  # at once, no TTL to wait out
    assert second is not None and second.epoch == 2
    with pytest.raises(
        FencedError, match=r"epoch 1 is stale \(the current epoch is 2, owner 'replica-b'\)"
    ):
        store.renew_lease(EXP, "replica-a", 1, TTL)
    again = store.acquire_lease(EXP, "replica-b", TTL)  # the same id restarted: a new epoch
    assert again is not None and again.epoch == 3


def test_an_expired_lease_is_taken_over_and_its_holder_renews_no_more(store: Store) -> None:
    held = store.acquire_lease(EXP, "replica-a", 0.3)
    assert held is not None
    time.sleep(0.4)
    (row,) = store.experiments()
    assert row.owner == "replica-a" and not row.leased  # expired by the database's clock
    assert store.claimable() == [EXP]
    # expired but nobody took it: the holder may still renew, its epoch still fences others
    assert store.renew_lease(EXP, "replica-a", held.epoch, 0.3).epoch == held.epoch
    time.sleep(0.4)
    taken = store.acquire_lease(EXP, "replica-b", TTL)
    assert taken is not None and taken.epoch == held.epoch + 1
    with pytest.raises(FencedError):
        store.renew_lease(EXP, "replica-a", held.epoch, TTL)


def test_renewal_carries_the_operators_state_and_a_stopped_experiment_is_not_taken(
    store: Store,
) -> None:
    lease = store.acquire_lease(EXP, "replica-a", TTL)
    assert lease is not None
    store.pause(EXP)
    assert store.renew_lease(EXP, "replica-a", lease.epoch, TTL).state == "paused"
    store.stop(EXP)
    assert store.renew_lease(EXP, "replica-a", lease.epoch, TTL).state == "stopped"
    assert store.release_lease(EXP, "replica-a", lease.epoch)
    assert store.acquire_lease(EXP, "replica-b", TTL) is None and store.claimable() == []


def test_lease_arguments_are_checked(store: Store) -> None:
    for ttl in (0.0, -1.0, math.inf, "30"):
        with pytest.raises(StoreError, match="ttl_s must be"):
            store.acquire_lease(EXP, "replica-a", ttl)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="owner must be a non-empty string"):
        store.acquire_lease(EXP, "", TTL)
    with pytest.raises(StoreError, match="unknown experiment 'ghost'"):
        store.acquire_lease("ghost", "replica-a", TTL)
    with pytest.raises(StoreError, match="epoch must be an integer"):
        store.fenced(EXP, 1.5)  # type: ignore[arg-type]


@pytest.mark.integration
def test_postgres_decides_expiry_by_the_servers_clock_not_the_clients(
    postgres_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600.0)  # this client runs an hour fast
    with Store(postgres_target) as store, RawDatabase(postgres_target) as raw:
        store.submit(EXP, SPEC)
        lease = store.acquire_lease(EXP, "replica-a", 5.0)
        ((server_now,),) = raw.execute("SELECT EXTRACT(EPOCH FROM now())::double precision")
    assert lease is not None and server_now - 1 < lease.expires_at - 5.0 <= server_now


# ---- fencing --------------------------------------------------------------------------------

# Every write of an experiment's data, through a view, as (name, call).
WRITES: list[tuple[str, Callable[[Store], object]]] = [
    ("upsert_experiment", lambda s: s.upsert_experiment(EXP, {"v": 2})),
    ("add_round", lambda s: s.add_round(EXP, 5, "a5", {}, [], 1.0, "hard", 1.0)),
    ("set_applied", lambda s: s.set_applied(EXP, 0, {"X": 0.25})),
    ("set_expires_at", lambda s: s.set_expires_at(EXP, 0, 99.0)),
    ("set_round_status", lambda s: s.set_round_status(EXP, 0, "published", 2.0)),
    ("bump_attempt", lambda s: s.bump_attempt(EXP, 0)),
    ("add_reading", lambda s: s.add_reading(EXP, 0, "Y", 1.0, 9, "dev", 2.0)),
    ("add_oracle", lambda s: s.add_oracle(EXP, 0, "a0", 1.0, 2.0, 2.0)),
    ("reserve", lambda s: s.reserve(EXP, 1, 1.0, 10.0, 2.0)),
    ("settle", lambda s: s.settle(EXP, 0, 2.0)),
    ("release", lambda s: s.release(EXP, 0, 2.0)),
    ("charge", lambda s: s.charge(EXP, 0, 2.0)),
    ("save_snapshot", lambda s: s.save_snapshot(EXP, 0, {"L": np.eye(2)}, {})),
    ("add_dead_letter", lambda s: s.add_dead_letter(EXP, "t", "r", "d", b"x", 2.0)),
    ("submit", lambda s: s.submit(EXP, SPEC)),
    ("pause", lambda s: s.pause(EXP)),
]


def everything(store: Store) -> tuple[object, ...]:
    """All a write could have changed, to compare before and after."""
    return (
        store.experiment_spec(EXP),
        store.rounds(EXP),
        store.readings(EXP),
        store.oracles(EXP),
        store.ledger_entries(EXP),
        store.latest_snapshot(EXP) is None,
        store.dead_letters(EXP),
        [(r.state, r.epoch) for r in store.experiments()],
    )


@pytest.mark.parametrize("write", [w for _, w in WRITES], ids=[n for n, _ in WRITES])
def test_a_stale_epoch_writes_nothing(store: Store, write: Callable[[Store], object]) -> None:
    lease = store.acquire_lease(EXP, "replica-a", TTL)
    assert lease is not None
    old = store.fenced(EXP, lease.epoch)
    add_round(old, 0)
    old.reserve(EXP, 0, 1.0, 10.0, 1.0)
    add_round(old, 1)
    assert store.acquire_lease(EXP, "replica-a", TTL) is not None  # restarted: epoch 2
    before = everything(store)
    with pytest.raises(FencedError, match=f"'{EXP}': lease epoch 1 is stale"):
        write(old)
    assert everything(store) == before
    write(store.fenced(EXP, lease.epoch + 1))  # the current epoch writes as ever


def test_a_fenced_view_is_the_store_for_one_experiment(store: Store) -> None:
    lease = store.acquire_lease(EXP, "replica-a", TTL)
    assert lease is not None
    view = store.fenced(EXP, lease.epoch)
    assert isinstance(view, FencedStore) and (view.experiment, view.epoch) == (EXP, 1)
    store.submit("other", {})
    with pytest.raises(StoreError, match=f"fenced for experiment '{EXP}' .* 'other'"):
        view.add_round("other", 0, "o0", {}, [], 0.0, "hard", 1.0)
    assert view.add_dead_letter(None, "weird/topic", "malformed_json", "", b"", 1.0)  # no owner
    assert view.experiment_names() == [EXP, "other"]  # reads pass through
    with view:  # closing the view leaves the store open
        add_round(view, 0)
    assert not store.closed and [r.round for r in store.rounds(EXP)] == [0]
    assert store.release_lease(EXP, "replica-a", 1)
    assert store.acquire_lease(EXP, "replica-b", TTL) is not None
    with pytest.raises(FencedError), view.transaction():  # the whole transaction goes
        view.add_reading(EXP, 0, "Y", 1.0, 0, "dev", 1.0)
    assert store.readings(EXP) == []


# A fenced writer in its own process: it writes a reading per line it is sent, or streams them.
FENCED_WRITER = """
import sys
from connectors.store import FencedError, Store, StoreError
store = Store(sys.argv[1], timeout_s=2.0)
view = store.fenced("line-3", int(sys.argv[2]))
seq = 0
def write(seq):
    view.add_reading("line-3", 0, "Y", float(seq), seq, "writer", 1.0)
print("@ ready", flush=True)
mode = sys.argv[3]
while True:
    if mode == "on-request":
        if input() != "write":
            break
    try:
        if mode == "frozen-in-transaction":
            with view.transaction():
                write(seq)
                print("@ in-transaction", seq, flush=True)
                input()  # frozen here, holding the experiment's write lock
        else:
            write(seq)
    except FencedError:
        print("@ fenced", seq, flush=True)
        break
    except StoreError as exc:  # e.g. the server ended the frozen transaction
        print("@ lost", seq, str(exc).replace(chr(10), " "), flush=True)
        mode = "on-request" if mode == "frozen-in-transaction" else mode
        seq += 1
        continue
    print("@ wrote", seq, flush=True)
    seq += 1
"""


def writer(store: Store, target: str, tmp_path: Path, mode: str, ttl: float = 0.5) -> StoreChild:
    lease = store.acquire_lease(EXP, "replica-a", ttl)
    assert lease is not None
    add_round(store.fenced(EXP, lease.epoch), 0)
    child = StoreChild(FENCED_WRITER, target, tmp_path / "writer.err", str(lease.epoch), mode)
    assert child.next_line() == "ready"
    return child


def take_over(store: Store) -> int:
    """Wait out replica-a's TTL, take the experiment as replica-b; the readings there are."""
    time.sleep(0.6)
    taken = store.acquire_lease(EXP, "replica-b", TTL)
    assert taken is not None and taken.owner == "replica-b"
    return len(store.readings(EXP))


def test_a_replica_frozen_past_its_ttl_cannot_write_when_it_wakes(
    store: Store, store_target: str, tmp_path: Path
) -> None:
    child = writer(store, store_target, tmp_path, "on-request")
    child.send("write")
    assert child.next_line() == "wrote 0"
    child.process.send_signal(signal.SIGSTOP)  # SIGSTOP between two writes
    try:
        stored = take_over(store)
    finally:
        child.process.send_signal(signal.SIGCONT)
    child.send("write")
    assert child.next_line() == "fenced 1"
    child.finish()
    assert stored == 1 and [r.seq for r in store.readings(EXP)] == [0]


@pytest.mark.integration
def test_a_replica_frozen_inside_a_transaction_loses_it_and_holds_no_one_up(
    postgres_target: str, tmp_path: Path
) -> None:
    """PostgreSQL ends a transaction idle past timeout_s / 2, and its row lock with it."""
    with Store(postgres_target) as store:
        store.submit(EXP, SPEC)
        child = writer(store, postgres_target, tmp_path, "frozen-in-transaction")
        assert child.next_line() == "in-transaction 0"
        child.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            stored = take_over(store)  # waits for the server to end the frozen transaction
            waited = time.monotonic() - started
        finally:
            child.process.send_signal(signal.SIGCONT)
        child.send("")  # wake up: its commit fails, the server rolled it back
        assert child.next_line().startswith("lost 0")
        child.send("write")
        assert child.next_line() == "fenced 1"
        child.finish()
        assert stored == 0 and store.readings(EXP) == [] and waited < 1.6 + 0.6


def test_a_takeover_racing_a_writer_lets_no_write_land_after_it(
    store: Store, store_target: str, tmp_path: Path
) -> None:
    child = writer(store, store_target, tmp_path, "stream", ttl=TTL)
    written = []
    while len(written) < 30:
        written.append(child.next_line())
    assert store.acquire_lease(EXP, "replica-b", TTL) is None  # live: not b's to take
    taken = store.acquire_lease(EXP, "replica-a", TTL)  # replica-a restarted, mid-stream
    assert taken is not None and taken.epoch == 2
    stored = len(store.readings(EXP))
    lines = child.finish()
    assert lines[-1].startswith("fenced")
    wrote = {int(line.split()[1]) for line in [*written, *lines] if line.startswith("wrote")}
    seqs = {r.seq for r in store.readings(EXP)}
    # everything it was told it wrote is there, and nothing landed after the takeover
    assert wrote == seqs and len(seqs) == stored
