"""The PostgreSQL store's DDL and its forward migrations, run by `postgres.PostgresDatabase`.

The tables and columns are SQLite's (`sqlite_schema`), version for version, in PostgreSQL's
types: ``double precision`` for SQLite's 8-byte REAL (times stay unix seconds, so rows read back
equal whichever backend wrote them), ``bigint`` for its 64-bit INTEGER, ``bytea`` for BLOB and
identity columns for AUTOINCREMENT. JSON stays ``text``: the store keeps canonical JSON text and
hands it back byte for byte, which ``jsonb`` would not.

Applied versions are rows of `MIGRATIONS_TABLE`, written in the migration's own transaction
(PostgreSQL's DDL is transactional, so a failed step leaves the database as it was). Replicas
that start at once serialize on a transaction-level advisory lock (`MIGRATION_LOCK`) before
reading that table: one migrates, the others wait and then find nothing left to do.
"""

from __future__ import annotations

from typing import Final

from connectors.store.schema import EXPERIMENT_STATES, LEDGER_STATES, ROUND_STATUSES, in_list

__all__ = ["MIGRATIONS", "MIGRATIONS_TABLE", "MIGRATION_LOCK", "STORE_TABLES"]

MIGRATIONS_TABLE: Final = "cbo_schema_migrations"
# pg_advisory_xact_lock's key for "migrating a cbo-agent store in this database": "CBOA" as in
# SQLite's application_id, in the high half so that it collides with no small key.
MIGRATION_LOCK: Final = 0x4342_4F41 << 32
# The tables of version 1: a database holding any of them without MIGRATIONS_TABLE belongs to
# another program and is refused instead of altered.
STORE_TABLES: Final = (
    "experiments",
    "rounds",
    "readings",
    "oracle",
    "ledger",
    "snapshots",
    "snapshot_arrays",
    "dead_letters",
)

CREATE_MIGRATIONS_TABLE: Final = f"""
    CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (
        version integer PRIMARY KEY CHECK (version >= 1),
        description text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    )
"""

_V1: Final[tuple[str, ...]] = (
    """
    CREATE TABLE experiments (
        name text PRIMARY KEY,
        spec text NOT NULL,                          -- JSON object
        updated_at double precision NOT NULL
    )
    """,
    f"""
    CREATE TABLE rounds (
        experiment text NOT NULL REFERENCES experiments(name),
        round bigint NOT NULL CHECK (round >= 0),
        action_id text NOT NULL UNIQUE,
        intervention text NOT NULL,                  -- JSON object node -> value
        target_set text NOT NULL,                    -- JSON list of node names
        cost double precision NOT NULL CHECK (cost >= 0),
        kind text NOT NULL,
        status text NOT NULL CHECK (status IN {in_list(ROUND_STATUSES)}),
        attempt bigint NOT NULL DEFAULT 0 CHECK (attempt >= 0),
        reason text,
        proposed_at double precision NOT NULL,
        status_at double precision NOT NULL,
        PRIMARY KEY (experiment, round)
    )
    """,
    """
    CREATE TABLE readings (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- arrival order; never reused
        experiment text NOT NULL,
        round bigint NOT NULL,
        node text NOT NULL,
        value double precision NOT NULL,
        seq bigint NOT NULL CHECK (seq >= 0),
        device_id text NOT NULL,
        measured_at double precision,
        received_at double precision NOT NULL,
        UNIQUE (experiment, device_id, node, seq),
        FOREIGN KEY (experiment, round) REFERENCES rounds(experiment, round)
    )
    """,
    "CREATE INDEX readings_by_experiment ON readings(experiment, id)",
    "CREATE INDEX readings_by_round ON readings(experiment, round)",
    """
    CREATE TABLE oracle (
        experiment text NOT NULL,
        round bigint NOT NULL,
        action_id text NOT NULL,
        expected_reward double precision NOT NULL,
        optimum double precision NOT NULL,
        at double precision NOT NULL,
        PRIMARY KEY (experiment, round),
        FOREIGN KEY (experiment, round) REFERENCES rounds(experiment, round)
    )
    """,
    f"""
    CREATE TABLE ledger (
        experiment text NOT NULL,
        round bigint NOT NULL,
        amount double precision NOT NULL CHECK (amount >= 0),
        state text NOT NULL CHECK (state IN {in_list(LEDGER_STATES)}),
        budget_total double precision,               -- the limit checked at reservation
        reserved_at double precision NOT NULL,
        settled_at double precision,
        released_at double precision,
        PRIMARY KEY (experiment, round),
        FOREIGN KEY (experiment, round) REFERENCES rounds(experiment, round)
    )
    """,
    """
    CREATE TABLE snapshots (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        experiment text NOT NULL REFERENCES experiments(name),
        upto_reading_id bigint NOT NULL CHECK (upto_reading_id >= 0),
        meta text NOT NULL,                          -- JSON object
        created_at double precision NOT NULL
    )
    """,
    "CREATE INDEX snapshots_by_experiment ON snapshots(experiment, id)",
    """
    CREATE TABLE snapshot_arrays (
        snapshot_id bigint NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,
        name text NOT NULL,
        npy bytea NOT NULL,                          -- np.save(..., allow_pickle=False)
        PRIMARY KEY (snapshot_id, name)
    )
    """,
    """
    CREATE TABLE dead_letters (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        experiment text,                             -- NULL when no experiment could be told
        topic text NOT NULL,
        reason text NOT NULL,
        detail text NOT NULL,
        payload bytea NOT NULL,                      -- possibly truncated, see payload_size
        payload_size bigint NOT NULL,
        at double precision NOT NULL
    )
    """,
    "CREATE INDEX dead_letters_by_experiment ON dead_letters(experiment, id)",
)

_V2: Final[tuple[str, ...]] = (
    "ALTER TABLE rounds ADD COLUMN applied text",  # JSON object node -> value, or NULL
    "ALTER TABLE rounds ADD COLUMN expires_at double precision",  # unix seconds, or NULL
)

_V3: Final[tuple[str, ...]] = (
    "ALTER TABLE experiments ADD COLUMN state text NOT NULL DEFAULT 'running' "
    f"CHECK (state IN {in_list(EXPERIMENT_STATES)})",
    "ALTER TABLE experiments ADD COLUMN state_at double precision",
    "ALTER TABLE experiments ADD COLUMN owner text",
    "ALTER TABLE experiments ADD COLUMN epoch bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0)",
    "ALTER TABLE experiments ADD COLUMN lease_expires_at double precision",
)

_V4: Final[tuple[str, ...]] = (
    "ALTER TABLE readings ADD COLUMN variance double precision CHECK (variance >= 0)",
    "ALTER TABLE readings ADD COLUMN replications bigint CHECK (replications >= 1)",
    "ALTER TABLE ledger ADD COLUMN released_amount double precision NOT NULL DEFAULT 0 "
    "CHECK (released_amount >= 0)",
)

_V_ARRAYS: Final[tuple[str, ...]] = (
    "ALTER TABLE readings ADD COLUMN array_dtype text "
    "CHECK (array_dtype IN ('float32', 'float64'))",
    "ALTER TABLE readings ADD COLUMN array_shape text",
    "ALTER TABLE readings ADD COLUMN array_data bytea",
)

_V_STATES: Final[tuple[str, ...]] = (
    """
    CREATE TABLE visited_states (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- arrival order
        experiment text NOT NULL,
        round bigint NOT NULL,
        device_id text NOT NULL,
        dtype text NOT NULL CHECK (dtype IN ('float32', 'float64')),
        shape text NOT NULL,
        data bytea NOT NULL,
        received_at double precision NOT NULL,
        UNIQUE (experiment, round, device_id),
        FOREIGN KEY (experiment, round) REFERENCES rounds(experiment, round)
    )
    """,
)

# MIGRATIONS[i] takes the database from version i to i + 1 (schema.VERSIONS[i] says to what).
MIGRATIONS: Final[list[tuple[str, ...]]] = [_V1, _V2, _V3, _V4, _V_ARRAYS, _V_STATES]
