"""The experiments table: one row per experiment — its spec as JSON, and the control plane's
desired state for it (running, paused, stopped).

An operator submits a spec, then pauses, resumes or stops the experiment; the replica that runs
it reads the state with every lease renewal (`leases`). Paused: no new round gets budget until
it is resumed; stopped: never again (`require_running`, checked by every reservation, so once
`set_state` has returned no new action is paid for). The lease columns of the same row belong to
`leases`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Literal, get_args

from connectors.store.errors import NotRunning, StoreError
from connectors.store.rows import EXPERIMENT_COLUMNS, ExperimentRow
from connectors.store.sql import Connection

__all__ = [
    "EXPERIMENT_STATES",
    "STATE_TRANSITIONS",
    "ExperimentState",
    "names",
    "require",
    "require_running",
    "row",
    "rows",
    "set_state",
    "spec",
    "state_of",
    "submit",
    "upsert",
]

ExperimentState = Literal["running", "paused", "stopped"]
EXPERIMENT_STATES: Final[tuple[ExperimentState, ...]] = get_args(ExperimentState)
# Where the desired state may go: stopped is final (its rounds, readings and budget stay).
STATE_TRANSITIONS: Final[Mapping[str, frozenset[str]]] = {
    "running": frozenset({"paused", "stopped"}),
    "paused": frozenset({"running", "stopped"}),
    "stopped": frozenset(),
}


def upsert(conn: Connection, name: str, spec_json: str, at: float) -> None:
    """Create the experiment (running) or replace its spec."""
    conn.execute(
        "INSERT INTO experiments (name, spec, updated_at) VALUES (?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, "
        "updated_at = excluded.updated_at",
        (name, spec_json, at),
    )


def submit(conn: Connection, name: str, spec_json: str, at: float) -> bool:
    """Create the experiment, running; False if it exists with this very spec.

    Raises:
        StoreError: it exists with another spec (a running experiment's spec is not swapped
            under it: stop it and submit the new spec under a new name).
    """
    cursor = conn.execute(
        "INSERT INTO experiments (name, spec, updated_at, state, state_at) "
        "VALUES (?, ?, ?, 'running', ?) ON CONFLICT (name) DO NOTHING",
        (name, spec_json, at, at),
    )
    if cursor.rowcount == 1:
        return True
    held = conn.execute("SELECT spec FROM experiments WHERE name = ?", (name,)).fetchone()
    if held is not None and held[0] == spec_json:
        return False
    raise StoreError(
        f"experiment {name!r} already exists with another spec (stop it and submit the new "
        "spec under a new name)"
    )


def names(conn: Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM experiments ORDER BY name")]


def spec(conn: Connection, name: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT spec FROM experiments WHERE name = ?", (name,)).fetchone()
    return None if row is None else json.loads(row[0])


def require(conn: Connection, experiment: str) -> None:
    """StoreError unless the experiment exists."""
    if conn.execute("SELECT 1 FROM experiments WHERE name = ?", (experiment,)).fetchone():
        return
    raise StoreError(f"unknown experiment {experiment!r} (upsert_experiment it first)")


def rows(conn: Connection, now: float) -> list[ExperimentRow]:
    """Every experiment's control row, by name; `now` (the database's clock) tells live
    leases from expired ones."""
    found = conn.execute(
        f"SELECT {EXPERIMENT_COLUMNS} FROM experiments ORDER BY name", (now,)
    ).fetchall()
    return [ExperimentRow(*r[:-1], leased=bool(r[-1])) for r in found]


def row(conn: Connection, name: str, now: float) -> ExperimentRow:
    """The experiment's control row; StoreError if it is unknown."""
    found = conn.execute(
        f"SELECT {EXPERIMENT_COLUMNS} FROM experiments WHERE name = ?", (now, name)
    ).fetchone()
    if found is None:
        raise StoreError(f"unknown experiment {name!r}")
    return ExperimentRow(*found[:-1], leased=bool(found[-1]))


def state_of(conn: Connection, name: str) -> ExperimentState:
    """The experiment's desired state; StoreError if it is unknown."""
    found = conn.execute("SELECT state FROM experiments WHERE name = ?", (name,)).fetchone()
    if found is None:
        raise StoreError(f"unknown experiment {name!r}")
    state: ExperimentState = found[0]
    return state


def set_state(conn: Connection, name: str, to: ExperimentState, at: float) -> bool:
    """Move the experiment's desired state to `to`; False if it is there already.

    Raises:
        StoreError: unknown experiment, or a move STATE_TRANSITIONS does not allow (out of
            stopped).
    """
    current = state_of(conn, name)
    if current == to:
        return False
    if to not in STATE_TRANSITIONS[current]:
        raise StoreError(
            f"experiment {name!r} is {current}: it cannot be made {to} (stopped is final)"
        )
    conn.execute("UPDATE experiments SET state = ?, state_at = ? WHERE name = ?", (to, at, name))
    return True


def require_running(conn: Connection, experiment: str, round: int) -> None:
    """NotRunning unless the experiment's desired state is running (a reservation's gate)."""
    state = state_of(conn, experiment)
    if state != "running":
        raise NotRunning(experiment, round, state)
