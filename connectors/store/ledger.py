"""The budget ledger: one entry per round, its cost reserved before the round's action is
published, then settled (on ack) or released (on reject or expiry).

Spent means reserved (outstanding) + settled; `reserve` checks and inserts in the caller's one
transaction, under the experiment's write lock, so concurrent reservers never jointly overspend;
it gives nothing to an experiment that is paused or stopped. `charge` settles whatever the
budget: the action was applied after all. Sums are exactly rounded (`math.fsum`).
"""

from __future__ import annotations

import math
from typing import Final, Literal, get_args

from connectors.store import experiments, rounds
from connectors.store.errors import BudgetExceeded, IllegalTransition
from connectors.store.rows import LEDGER_COLUMNS, LedgerRow, LedgerTotals
from connectors.store.sql import Connection

__all__ = [
    "LEDGER_STATES",
    "LedgerState",
    "charge",
    "entries",
    "entry",
    "move",
    "reserve",
    "settle_used",
    "spent",
    "totals",
]

LedgerState = Literal["reserved", "settled", "released"]
LEDGER_STATES: Final[tuple[LedgerState, ...]] = get_args(LedgerState)  # the order of LedgerTotals


def reserve(
    conn: Connection,
    experiment: str,
    round: int,
    amount: float,
    budget_total: float | None,
    at: float,
) -> bool:
    """Reserve `amount` for the round; False (nothing written) if it holds this reservation.

    Run it under the experiment's write lock (`Database.lock_experiment`): the sum and the
    insert must not interleave with another reserver's.

    Raises:
        BudgetExceeded: settled + reserved + amount > budget_total; nothing is written.
        NotRunning: the experiment is paused or stopped; nothing is written.
        IllegalTransition: the round's entry is settled, released or of another amount.
        StoreError: unknown round.
    """
    held = entry(conn, experiment, round)
    if held is not None:
        if held == ("reserved", amount):
            return False
        state, had = held
        raise IllegalTransition(
            "ledger", experiment, round, f"{state} {had!r}", f"reserved {amount!r}"
        )
    rounds.require(conn, experiment, round)
    experiments.require_running(conn, experiment, round)
    if budget_total is not None:
        amounts = spent(conn, experiment)
        if math.fsum((*amounts, amount)) > budget_total:
            raise BudgetExceeded(experiment, round, amount, math.fsum(amounts), budget_total)
    conn.execute(
        "INSERT INTO ledger (experiment, round, amount, state, budget_total, reserved_at) "
        "VALUES (?, ?, ?, 'reserved', ?, ?)",
        (experiment, round, amount, budget_total, at),
    )
    return True


def move(conn: Connection, experiment: str, round: int, to: LedgerState, at: float) -> bool:
    """Settle or release the round's reservation; False if it is already `to`.

    Raises:
        IllegalTransition: no reservation, or it went the other way.
    """
    held = entry(conn, experiment, round)
    state = "unreserved" if held is None else held[0]
    if state == to:
        return False
    if state != "reserved":
        raise IllegalTransition("ledger", experiment, round, state, to)
    column = "settled_at" if to == "settled" else "released_at"
    conn.execute(
        f"UPDATE ledger SET state = ?, {column} = ? WHERE experiment = ? AND round = ?",
        (to, at, experiment, round),
    )
    return True


def charge(conn: Connection, experiment: str, round: int, at: float) -> bool:
    """Settle the round's entry whatever the budget; False if it is settled already.

    Raises:
        IllegalTransition: the round has no ledger entry.
    """
    held = entry(conn, experiment, round)
    if held is None:
        raise IllegalTransition("ledger", experiment, round, "unreserved", "charged")
    if held[0] == "settled":
        return False
    conn.execute(
        "UPDATE ledger SET state = 'settled', settled_at = ? WHERE experiment = ? AND round = ?",
        (at, experiment, round),
    )
    return True


def settle_used(conn: Connection, experiment: str, round: int, used: float, at: float) -> bool:
    """Settle `used` (≤ the reservation) and release the rest; False if it holds `used`.

    The entry's amount becomes `used` and `released_amount` the rest of what was reserved
    (reserved = amount + released_amount), so the budget counts only what the trial used.

    Raises:
        IllegalTransition: no entry, a released entry, or more than was reserved.
    """
    row = conn.execute(
        "SELECT state, amount, released_amount FROM ledger WHERE experiment = ? AND round = ?",
        (experiment, round),
    ).fetchone()
    if row is None:
        raise IllegalTransition("ledger", experiment, round, "unreserved", f"settled {used!r}")
    state, amount, released = row
    reserved = math.fsum((amount, released))
    if state == "released" or used > reserved:
        raise IllegalTransition(
            "ledger", experiment, round, f"{state} {reserved!r}", f"settled {used!r}"
        )
    if state == "settled" and amount == used:
        return False
    conn.execute(
        "UPDATE ledger SET state = 'settled', amount = ?, released_amount = ?, "
        "settled_at = coalesce(settled_at, ?) WHERE experiment = ? AND round = ?",
        (used, reserved - used, at, experiment, round),
    )
    return True


def totals(conn: Connection, experiment: str) -> LedgerTotals:
    """Exactly rounded sums by state; the released part of a partly used reservation counts
    as released."""
    rows = conn.execute(
        "SELECT state, amount, released_amount FROM ledger WHERE experiment = ?", (experiment,)
    ).fetchall()
    by_state: dict[str, list[float]] = {s: [] for s in LEDGER_STATES}
    for state, amount, released in rows:
        by_state[state].append(amount)
        by_state["released"].append(released)
    return LedgerTotals(*(math.fsum(by_state[s]) for s in LEDGER_STATES))


def entries(conn: Connection, experiment: str) -> list[LedgerRow]:
    rows = conn.execute(
        f"SELECT {LEDGER_COLUMNS} FROM ledger WHERE experiment = ? ORDER BY round",
        (experiment,),
    ).fetchall()
    return [LedgerRow(*r) for r in rows]


def entry(conn: Connection, experiment: str, round: int) -> tuple[str, float] | None:
    """The round's (state, amount), None if it has no entry."""
    row = conn.execute(
        "SELECT state, amount FROM ledger WHERE experiment = ? AND round = ?",
        (experiment, round),
    ).fetchone()
    return None if row is None else (row[0], row[1])


def spent(conn: Connection, experiment: str) -> list[float]:
    """The amounts that count against the budget: reserved and settled entries."""
    rows = conn.execute(
        "SELECT amount FROM ledger WHERE experiment = ? AND state IN ('reserved', 'settled')",
        (experiment,),
    )
    return [r[0] for r in rows]
