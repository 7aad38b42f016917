"""Leases and fencing: which replica of a fleet runs an experiment, and refusing the writes of
one that no longer does.

A lease is three columns of the experiment's row: `owner`, `epoch` and `lease_expires_at`.
`acquire` takes an experiment that is unowned or whose lease has expired, and bumps the epoch;
`renew` extends the holder's lease (and tells it the desired state); `release` gives it up. A
writer passes its epoch with every write of the experiment (`Store.fenced`), and `check_epoch`
refuses one whose epoch is no longer the row's with `FencedError`, in the same transaction as
the write and under the experiment's write lock (`Database.lock_experiment`: an advisory lock
per experiment on PostgreSQL, the file's write lock on SQLite) — so a write either commits
before a new owner's acquisition or is refused after it, never in between. A replica that was
paused past its TTL (SIGSTOP, a long GC, a partition) and comes back can therefore not write a
single row.

Clocks
    Every expiry decision is made with one clock, the database's (`Database.clock`:
    PostgreSQL's ``now()``, the start of the deciding transaction; for SQLite, the clock of the
    one machine whose processes share the file), and every ``lease_expires_at`` is written on
    it. The replicas' clocks never enter a decision, so skew between replicas, or between a
    replica and the server, cannot make two owners. A holder that wants to stop acting before
    its lease runs out must count its TTL on its own monotonic clock from the moment it *sent*
    the renewal: the server granted at a later instant, so the holder's local deadline comes
    first as long as the two clocks run at about the same rate over one TTL (drift, not
    offset, is what matters; keep the TTL far above the renewal period). Should a holder still
    act late, fencing catches its writes; actions it publishes carry the epoch so devices can
    drop those older than one they have seen (docs/protocol.md). A jump of the database's
    clock (an NTP step) moves every expiry at once: forward, it expires leases early — another
    replica takes over and the old holder is fenced, nothing is written twice; backward, it
    delays takeovers.

Owners
    An owner id names a replica (its agent id). `acquire` by the id that holds a live lease
    takes it again with a new epoch: a replica restarted under the same id resumes its
    experiments at once instead of waiting out its old lease, and any older process under that
    id is fenced. Two live replicas must not share an id: they would keep taking the
    experiment from each other (safely — each takeover fences the other — but uselessly).
"""

from __future__ import annotations

from connectors.store.errors import FencedError, StoreError
from connectors.store.rows import Lease
from connectors.store.sql import Connection

__all__ = ["acquire", "check_epoch", "claimable", "release", "renew"]


def acquire(
    conn: Connection, experiment: str, owner: str, ttl_s: float, now: float
) -> Lease | None:
    """Take the experiment's lease if it is free, expired, or `owner`'s own; None if another
    owner's lease is live or the experiment is stopped. Bumps the epoch.

    Raises:
        StoreError: unknown experiment.
    """
    state, holder, epoch, expires_at = _lease_row(conn, experiment)
    if state == "stopped":
        return None
    if holder is not None and holder != owner and expires_at is not None and expires_at > now:
        return None
    epoch += 1
    conn.execute(
        "UPDATE experiments SET owner = ?, epoch = ?, lease_expires_at = ? WHERE name = ?",
        (owner, epoch, now + ttl_s, experiment),
    )
    return Lease(experiment, owner, epoch, now + ttl_s, state)


def renew(
    conn: Connection, experiment: str, owner: str, epoch: int, ttl_s: float, now: float
) -> Lease:
    """Extend `owner`'s lease of this epoch to `now + ttl_s`; with it, the desired state.

    A lease that expired but was taken by nobody is still this epoch's, so it is renewed: no
    other owner wrote in between.

    Raises:
        FencedError: the lease is another owner's or another epoch's (it was lost).
        StoreError: unknown experiment.
    """
    state, holder, current, _ = _lease_row(conn, experiment)
    if holder != owner or current != epoch:
        raise FencedError(experiment, epoch, current, holder)
    conn.execute(
        "UPDATE experiments SET lease_expires_at = ? WHERE name = ?", (now + ttl_s, experiment)
    )
    return Lease(experiment, owner, epoch, now + ttl_s, state)


def release(conn: Connection, experiment: str, owner: str, epoch: int) -> bool:
    """Give the lease up so that another replica may take it at once; False (nothing written)
    if it is not `owner`'s of this epoch any more. The epoch stays: the next acquisition
    bumps it past every write the releasing owner made."""
    _, holder, current, _ = _lease_row(conn, experiment)
    if holder != owner or current != epoch:
        return False
    conn.execute(
        "UPDATE experiments SET owner = NULL, lease_expires_at = NULL WHERE name = ?",
        (experiment,),
    )
    return True


def check_epoch(conn: Connection, experiment: str, epoch: int) -> None:
    """FencedError unless `epoch` is the experiment's current one. Run it under the
    experiment's write lock, in the transaction of the write it guards.

    Raises:
        StoreError: unknown experiment.
    """
    _, holder, current, _ = _lease_row(conn, experiment)
    if current != epoch:
        raise FencedError(experiment, epoch, current, holder)


def claimable(conn: Connection, now: float, limit: int | None) -> list[str]:
    """Experiments a replica may acquire: not stopped, and unowned or with an expired lease;
    those whose lease ran out longest ago first (never-owned ones before them)."""
    sql = (
        "SELECT name FROM experiments WHERE state <> 'stopped' "
        "AND (owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ?) "
        "ORDER BY coalesce(lease_expires_at, 0), name"
    )
    parameters: tuple[float | int, ...] = (now,)
    if limit is not None:
        sql, parameters = f"{sql} LIMIT ?", (now, limit)
    return [r[0] for r in conn.execute(sql, parameters)]


def _lease_row(conn: Connection, experiment: str) -> tuple[str, str | None, int, float | None]:
    """(state, owner, epoch, lease_expires_at); StoreError if the experiment is unknown."""
    row = conn.execute(
        "SELECT state, owner, epoch, lease_expires_at FROM experiments WHERE name = ?",
        (experiment,),
    ).fetchone()
    if row is None:
        raise StoreError(f"unknown experiment {experiment!r}")
    return row[0], row[1], int(row[2]), row[3]
