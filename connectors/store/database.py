"""What `Store` asks of a backend, and the one place that picks the backend for a location.

Two backends keep this contract: `sqlite.SqliteDatabase` (one file, embedded, the default) and
`postgres.PostgresDatabase` (a PostgreSQL database shared by a fleet of replicas, through a
connection pool). Both open and migrate the store on construction, and both run the table
modules' statements (`sql`) on the connection they hand out inside `writing` or `reading`.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from connectors.store.location import PostgresLocation, StoreLocation
from connectors.store.sql import Connection

__all__ = ["Database", "open_database"]


class Database(Protocol):
    """An open store database (migrated to the current schema)."""

    location: StoreLocation

    @property
    def closed(self) -> bool: ...

    def close(self) -> None:
        """Close it (idempotent); StoreError inside an open transaction."""

    def schema_version(self) -> int: ...

    def size_bytes(self) -> int:
        """Bytes the store's tables and indexes take on disk."""
        ...

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """Group this thread's writes into one atomic commit; nested blocks are savepoints, an
        exception escaping a block undoes that block's writes only. Other threads' calls never
        join it. StoreError when another asyncio task of the thread calls while it is open."""
        ...

    def writing(self, what: str) -> contextlib.AbstractContextManager[Connection]:
        """One atomic write (a savepoint inside an open transaction); database errors become
        StoreError naming `what`."""
        ...

    def reading(
        self, what: str, consistent: bool = False
    ) -> contextlib.AbstractContextManager[Connection]:
        """Reads; `consistent` makes several SELECTs see one snapshot."""
        ...

    def lock_experiment(self, conn: Connection, experiment: str) -> None:
        """Inside `writing`: hold the experiment's write lock until the transaction ends, so
        that its check-then-write steps (the budget, round numbers, lease epochs) are not
        interleaved with another writer's. A no-op where every write transaction is already
        serialized (SQLite)."""

    def clock(self, conn: Connection) -> float:
        """The database's clock in unix seconds, the one lease expiry is decided by."""
        ...


def open_database(location: StoreLocation, timeout_s: float) -> Database:
    """Open (creating and migrating as needed) the store at `location`.

    psycopg is imported only for a PostgreSQL location, so an SQLite agent never loads it.
    """
    if isinstance(location, PostgresLocation):
        from connectors.store.postgres import PostgresDatabase

        return PostgresDatabase(location, timeout_s)
    from connectors.store.sqlite import SqliteDatabase

    return SqliteDatabase(location, timeout_s)
