"""The rounds table and its status machine: one row per proposed action.

`RoundStatus` is the project's one list of round statuses (the agent's live rounds use it
too); `ROUND_TRANSITIONS` says where each may go. A round is written "proposed" with attempt 0,
counts its publications in `attempt`, and ends closed, rejected or expired.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Final

from connectors.store import experiments
from connectors.store.errors import IllegalTransition, StoreError
from connectors.store.rows import ROUND_COLUMNS, RoundRow, round_row
from connectors.store.sql import Connection
from connectors.store.values import dumps

__all__ = [
    "ACTION_KINDS",
    "OPEN_STATUSES",
    "ROUND_STATUSES",
    "ROUND_TRANSITIONS",
    "RoundStatus",
    "action_of",
    "add",
    "bump_attempt",
    "counts",
    "get",
    "require",
    "require_all",
    "select",
    "set_applied",
    "set_expires_at",
    "set_status",
    "status_of",
]


class RoundStatus(StrEnum):
    """Where a round stands; its value is what the store keeps in ``rounds.status``."""

    PROPOSED = "proposed"
    PUBLISHED = "published"
    ACKED = "acked"
    REJECTED = "rejected"
    CLOSED = "closed"
    EXPIRED = "expired"


ROUND_STATUSES: Final = tuple(status.value for status in RoundStatus)
OPEN_STATUSES: Final = (RoundStatus.PROPOSED, RoundStatus.PUBLISHED, RoundStatus.ACKED)
# Status changes a round may make. "proposed -> acked" is allowed because an agent that crashed
# between publishing and recording the publication may hear the ack of that first attempt.
ROUND_TRANSITIONS: Final[Mapping[RoundStatus, frozenset[RoundStatus]]] = {
    RoundStatus.PROPOSED: frozenset(
        {RoundStatus.PUBLISHED, RoundStatus.ACKED, RoundStatus.REJECTED, RoundStatus.EXPIRED}
    ),
    RoundStatus.PUBLISHED: frozenset(
        {RoundStatus.ACKED, RoundStatus.REJECTED, RoundStatus.EXPIRED, RoundStatus.CLOSED}
    ),
    RoundStatus.ACKED: frozenset({RoundStatus.CLOSED}),
    RoundStatus.REJECTED: frozenset(),
    RoundStatus.CLOSED: frozenset(),
    RoundStatus.EXPIRED: frozenset(),
}
ACTION_KINDS: Final = ("hard", "soft")
_REQUIRE_CHUNK: Final = 500


def add(
    conn: Connection,
    where: str,
    experiment: str,
    round: int,
    action_id: str,
    intervention: Mapping[str, float],
    target_set: Sequence[str],
    cost: float,
    kind: str,
    at: float,
    expires_at: float | None,
) -> bool:
    """Insert the round as proposed; False if it already holds `action_id` (a retry).

    `where` names the call in errors: unknown experiment, the round holds another action, or
    `action_id` is already another round's.
    """
    experiments.require(conn, experiment)
    held = action_of(conn, experiment, round)
    if held == action_id:
        return False
    if held is not None:
        raise StoreError(f"{where}: the round already holds action {held!r}")
    other = conn.execute(
        "SELECT experiment, round FROM rounds WHERE action_id = ?", (action_id,)
    ).fetchone()
    if other is not None:
        raise StoreError(f"{where}: action_id {action_id!r} already used by {other}")
    conn.execute(
        "INSERT INTO rounds (experiment, round, action_id, intervention, target_set, "
        "cost, kind, status, attempt, reason, proposed_at, status_at, expires_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, 'proposed', 0, NULL, ?, ?, ?)",
        (
            experiment,
            round,
            action_id,
            dumps(dict(intervention)),
            dumps(list(target_set)),
            cost,
            kind,
            at,
            at,
            expires_at,
        ),
    )
    return True


def set_applied(
    conn: Connection, experiment: str, round: int, applied: Mapping[str, float]
) -> None:
    """Record what a device reported it applied; StoreError if the round is unknown."""
    require(conn, experiment, round)
    conn.execute(
        "UPDATE rounds SET applied = ? WHERE experiment = ? AND round = ?",
        (dumps(dict(applied)), experiment, round),
    )


def set_expires_at(
    conn: Connection, where: str, experiment: str, round: int, expires_at: float
) -> bool:
    """Move the round's expiry later; False if it is already `expires_at`, StoreError if
    earlier (a device may hold the action with the stored expiry)."""
    require(conn, experiment, round)
    (held,) = conn.execute(
        "SELECT expires_at FROM rounds WHERE experiment = ? AND round = ?",
        (experiment, round),
    ).fetchone()
    if held == expires_at:
        return False
    if held is not None and expires_at < held:
        raise StoreError(f"{where}: {expires_at!r} is earlier than the published expiry {held!r}")
    conn.execute(
        "UPDATE rounds SET expires_at = ? WHERE experiment = ? AND round = ?",
        (expires_at, experiment, round),
    )
    return True


def set_status(
    conn: Connection,
    experiment: str,
    round: int,
    status: RoundStatus,
    at: float,
    reason: str | None,
) -> bool:
    """Move the round to `status`; False if it is already there.

    Raises:
        IllegalTransition: the move is not in ROUND_TRANSITIONS.
        StoreError: unknown round.
    """
    current = status_of(conn, experiment, round)
    if current == status:
        return False
    if status not in ROUND_TRANSITIONS[current]:
        raise IllegalTransition("status", experiment, round, current.value, status.value)
    conn.execute(
        "UPDATE rounds SET status = ?, status_at = ?, reason = ? "
        "WHERE experiment = ? AND round = ?",
        (status.value, at, reason, experiment, round),
    )
    return True


def bump_attempt(conn: Connection, experiment: str, round: int) -> int:
    """Count one more publication and return the new attempt number.

    Raises:
        IllegalTransition: the round is acked or finished, so it is not published again.
    """
    current = status_of(conn, experiment, round)
    if current not in (RoundStatus.PROPOSED, RoundStatus.PUBLISHED):
        raise IllegalTransition("attempt", experiment, round, current.value, "re-published")
    conn.execute(
        "UPDATE rounds SET attempt = attempt + 1 WHERE experiment = ? AND round = ?",
        (experiment, round),
    )
    row = conn.execute(
        "SELECT attempt FROM rounds WHERE experiment = ? AND round = ?",
        (experiment, round),
    ).fetchone()
    return int(row[0])


def select(conn: Connection, experiment: str, statuses: Sequence[str]) -> list[RoundRow]:
    """The experiment's rounds in `statuses`, by round number."""
    marks = ", ".join("?" * len(statuses))
    rows = conn.execute(
        f"SELECT {ROUND_COLUMNS} FROM rounds WHERE experiment = ? "
        f"AND status IN ({marks}) ORDER BY round",
        (experiment, *(str(status) for status in statuses)),
    ).fetchall()
    return [round_row(r) for r in rows]


def counts(conn: Connection, experiment: str, open_statuses: Sequence[str]) -> tuple[int, int]:
    """(every round, the rounds in `open_statuses`) of the experiment."""
    marks = ", ".join("?" * len(open_statuses))
    total, still_open = conn.execute(
        f"SELECT count(*), coalesce(sum(CASE WHEN status IN ({marks}) THEN 1 ELSE 0 END), 0) "
        "FROM rounds WHERE experiment = ?",
        (*(str(status) for status in open_statuses), experiment),
    ).fetchone()
    return int(total), int(still_open)


def get(conn: Connection, experiment: str, round: int) -> RoundRow | None:
    row = conn.execute(
        f"SELECT {ROUND_COLUMNS} FROM rounds WHERE experiment = ? AND round = ?",
        (experiment, round),
    ).fetchone()
    return None if row is None else round_row(row)


def action_of(conn: Connection, experiment: str, round: int) -> str | None:
    """The round's action_id, None if the round is unknown."""
    row = conn.execute(
        "SELECT action_id FROM rounds WHERE experiment = ? AND round = ?", (experiment, round)
    ).fetchone()
    return None if row is None else row[0]


def status_of(conn: Connection, experiment: str, round: int) -> RoundStatus:
    """The round's status; StoreError if the round is unknown."""
    row = conn.execute(
        "SELECT status FROM rounds WHERE experiment = ? AND round = ?", (experiment, round)
    ).fetchone()
    if row is None:
        raise StoreError(f"unknown round {round} of experiment {experiment!r}")
    return RoundStatus(row[0])


def require_all(conn: Connection, experiment: str, numbers: Iterable[int]) -> None:
    """StoreError, naming the first, if any of the rounds is unknown: one SELECT per
    _REQUIRE_CHUNK rounds (SQLite's older builds take at most 999 parameters)."""
    wanted = sorted(set(numbers))
    found: set[int] = set()
    for start in range(0, len(wanted), _REQUIRE_CHUNK):
        part = wanted[start : start + _REQUIRE_CHUNK]
        marks = ", ".join("?" * len(part))
        found.update(
            int(row[0])
            for row in conn.execute(
                f"SELECT round FROM rounds WHERE experiment = ? AND round IN ({marks})",
                (experiment, *part),
            )
        )
    missing = [n for n in wanted if n not in found]
    if missing:
        raise StoreError(f"unknown round {missing[0]} of experiment {experiment!r}")


def require(conn: Connection, experiment: str, round: int) -> str:
    """The round's action_id; StoreError if the round is unknown."""
    action_id = action_of(conn, experiment, round)
    if action_id is None:
        raise StoreError(f"unknown round {round} of experiment {experiment!r}")
    return action_id
