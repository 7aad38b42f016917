"""The SQLite store's DDL and its forward migrations, run by `sqlite.SqliteDatabase`.

The schema version lives in ``PRAGMA user_version`` (SQLite's own header field, written in the
same transaction as the DDL, so it serves as the migrations table); ``PRAGMA application_id``
marks the file as a cbo-agent store so that another program's SQLite file is refused instead of
altered. Each migration takes the database from version ``i`` to ``i + 1`` (`schema.VERSIONS`
says what each adds) and runs, together with the bump of ``user_version``, in one transaction: a
migration that fails leaves the file as it was. Openers racing to migrate one file are
serialized by ``BEGIN IMMEDIATE``; the loser finds the work done.

To change the schema, append a migration here and in `postgres_schema` (never edit one that
has shipped); old files are opened by running the missing steps in order, a file newer than the
code is refused.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from connectors.store.schema import EXPERIMENT_STATES, LEDGER_STATES, ROUND_STATUSES, in_list

__all__ = ["APPLICATION_ID", "MIGRATIONS", "run_migration"]

APPLICATION_ID: Final = 0x4342_4F41  # "CBOA"


# Version 1: the initial schema. Statements run one by one (not executescript, which would commit
# the migration's transaction half way).
_V1: Final[tuple[str, ...]] = (
    """
    CREATE TABLE experiments (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,                          -- JSON object
        updated_at REAL NOT NULL
    )
    """,
    f"""
    CREATE TABLE rounds (
        experiment TEXT NOT NULL REFERENCES experiments(name),
        round INTEGER NOT NULL CHECK (round >= 0),
        action_id TEXT NOT NULL UNIQUE,
        intervention TEXT NOT NULL,                  -- JSON object node -> value
        target_set TEXT NOT NULL,                    -- JSON list of node names
        cost REAL NOT NULL CHECK (cost >= 0),
        kind TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN {in_list(ROUND_STATUSES)}),
        attempt INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
        reason TEXT,
        proposed_at REAL NOT NULL,
        status_at REAL NOT NULL,
        PRIMARY KEY (experiment, round)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE readings (
        id INTEGER PRIMARY KEY AUTOINCREMENT,        -- arrival order; never reused
        experiment TEXT NOT NULL,
        round INTEGER NOT NULL,
        node TEXT NOT NULL,
        value REAL NOT NULL,
        seq INTEGER NOT NULL CHECK (seq >= 0),
        device_id TEXT NOT NULL,
        measured_at REAL,
        received_at REAL NOT NULL,
        UNIQUE (experiment, device_id, node, seq),
        FOREIGN KEY (experiment, round) REFERENCES rounds(experiment, round)
    )
    """,
    "CREATE INDEX readings_by_experiment ON readings(experiment, id)",
    "CREATE INDEX readings_by_round ON readings(experiment, round)",
    """
    CREATE TABLE oracle (
        experiment TEXT NOT NULL,
        round INTEGER NOT NULL,
        action_id TEXT NOT NULL,
        expected_reward REAL NOT NULL,
        optimum REAL NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (experiment, round),
        FOREIGN KEY (experiment, round) REFERENCES rounds(experiment, round)
    ) WITHOUT ROWID
    """,
    f"""
    CREATE TABLE ledger (
        experiment TEXT NOT NULL,
        round INTEGER NOT NULL,
        amount REAL NOT NULL CHECK (amount >= 0),
        state TEXT NOT NULL CHECK (state IN {in_list(LEDGER_STATES)}),
        budget_total REAL,                           -- the limit checked at reservation
        reserved_at REAL NOT NULL,
        settled_at REAL,
        released_at REAL,
        PRIMARY KEY (experiment, round),
        FOREIGN KEY (experiment, round) REFERENCES rounds(experiment, round)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE snapshots (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        experiment TEXT NOT NULL REFERENCES experiments(name),
        upto_reading_id INTEGER NOT NULL CHECK (upto_reading_id >= 0),
        meta TEXT NOT NULL,                          -- JSON object
        created_at REAL NOT NULL
    )
    """,
    "CREATE INDEX snapshots_by_experiment ON snapshots(experiment, id)",
    """
    CREATE TABLE snapshot_arrays (
        snapshot_id INTEGER NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        npy BLOB NOT NULL,                           -- np.save(..., allow_pickle=False)
        PRIMARY KEY (snapshot_id, name)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE dead_letters (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        experiment TEXT,                             -- NULL when no experiment could be told
        topic TEXT NOT NULL,
        reason TEXT NOT NULL,
        detail TEXT NOT NULL,
        payload BLOB NOT NULL,                       -- possibly truncated, see payload_size
        payload_size INTEGER NOT NULL,
        at REAL NOT NULL
    )
    """,
    "CREATE INDEX dead_letters_by_experiment ON dead_letters(experiment, id)",
)

# Version 2: what a device reported it applied (an ack's `applied`, when it differs from the
# proposal: recovery replays it), and when the agent gives up on a round's action (protocol
# `expires_at`). Rows of version 1 have neither (NULL): applied as proposed, no expiry sent.
_V2: Final[tuple[str, ...]] = (
    "ALTER TABLE rounds ADD COLUMN applied TEXT",  # JSON object node -> value, or NULL
    "ALTER TABLE rounds ADD COLUMN expires_at REAL",  # unix seconds, or NULL
)

# Version 3: the control plane and leases. An operator's desired state for the experiment, and
# the lease of the replica that runs it: owner, epoch (bumped by every acquisition; writes that
# carry an older one are refused) and expiry (the database's clock, unix seconds). Experiments of
# version 2 are running and unowned.
_V3: Final[tuple[str, ...]] = (
    "ALTER TABLE experiments ADD COLUMN state TEXT NOT NULL DEFAULT 'running' "
    f"CHECK (state IN {in_list(EXPERIMENT_STATES)})",
    "ALTER TABLE experiments ADD COLUMN state_at REAL",
    "ALTER TABLE experiments ADD COLUMN owner TEXT",
    "ALTER TABLE experiments ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0 CHECK (epoch >= 0)",
    "ALTER TABLE experiments ADD COLUMN lease_expires_at REAL",
)

# Version 4: multi-fidelity trials (paper 001). A reading that is a mean over replications may
# carry the variance of that mean and how many replications it averages (NULL: a plain reading);
# a reservation settled for less than it held (q' < q replications ran) records the released
# rest, so reserved = amount + released_amount for such a row.
_V4: Final[tuple[str, ...]] = (
    "ALTER TABLE readings ADD COLUMN variance REAL CHECK (variance >= 0)",
    "ALTER TABLE readings ADD COLUMN replications INTEGER CHECK (replications >= 1)",
    "ALTER TABLE ledger ADD COLUMN released_amount REAL NOT NULL DEFAULT 0 "
    "CHECK (released_amount >= 0)",
)

# Array readings (paper 002): the array's dtype ('float32' or 'float64'), its shape as a JSON
# list and its little-endian C-order bytes, all NULL for a scalar reading. `value` holds the
# array's mean, so tools that read only the scalar column see a number.
_V_ARRAYS: Final[tuple[str, ...]] = (
    "ALTER TABLE readings ADD COLUMN array_dtype TEXT "
    "CHECK (array_dtype IN ('float32', 'float64'))",
    "ALTER TABLE readings ADD COLUMN array_shape TEXT",
    "ALTER TABLE readings ADD COLUMN array_data BLOB",
)

# Visited states (issue 13, paper 000's surrogate Hessian): the states [T, agents, obs] a
# device's controller visited in one round's episode, one trace per (round, device), the first
# kept; dtype, shape (JSON) and little-endian C-order bytes as an array reading's.
_V_STATES: Final[tuple[str, ...]] = (
    """
    CREATE TABLE visited_states (
        id INTEGER PRIMARY KEY AUTOINCREMENT,        -- arrival order
        experiment TEXT NOT NULL,
        round INTEGER NOT NULL,
        device_id TEXT NOT NULL,
        dtype TEXT NOT NULL CHECK (dtype IN ('float32', 'float64')),
        shape TEXT NOT NULL,
        data BLOB NOT NULL,
        received_at REAL NOT NULL,
        UNIQUE (experiment, round, device_id),
        FOREIGN KEY (experiment, round) REFERENCES rounds(experiment, round)
    )
    """,
)

# MIGRATIONS[i] takes user_version i to i + 1.
MIGRATIONS: Final[list[tuple[str, ...]]] = [_V1, _V2, _V3, _V4, _V_ARRAYS, _V_STATES]


def run_migration(conn: sqlite3.Connection, statements: tuple[str, ...], to_version: int) -> None:
    """Run one migration's statements and set user_version; the caller owns the transaction."""
    for statement in statements:
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {int(to_version)}")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
