"""What the table modules ask of a database connection, and the SQL they write.

The table modules (`experiments`, `leases`, `rounds`, `readings`, `ledger`, `snapshots`,
`dead_letters`, `export`) are functions over a `Connection`: they run their statements and
leave transactions, locking and error translation to the backend that hands them the connection
(`sqlite.SqliteDatabase`, `postgres.PostgresDatabase`). Both backends run the same statements,
so the SQL keeps to what SQLite and PostgreSQL both run:

- parameters are positional ``?`` marks (DB-API "qmark", what `sqlite3` takes; the PostgreSQL
  backend turns them into psycopg's ``%s`` — so the statements hold no other ``?`` and no
  ``%``);
- upserts are ``INSERT ... ON CONFLICT (...) DO NOTHING | DO UPDATE SET c = excluded.c``;
- a NULL key is matched with ``IS NULL``, never ``IS ?``; ``LIMIT`` is left out, not ``-1``,
  when there is none;
- the id of a row just inserted is `Cursor.lastrowid` (``RETURNING`` needs SQLite 3.35, which
  Python 3.11 does not promise; the PostgreSQL backend, whose driver has no `lastrowid`,
  appends ``RETURNING id`` to the INSERTs of tables with an identity column);
- no row locks (``FOR UPDATE``) and no clock (``now()``): a check-then-write runs under the
  experiment's write lock, which the caller takes through `database.Database.lock_experiment`,
  and times come from `database.Database.clock` as parameters;
- a boolean expression is read with ``bool()`` (SQLite answers 0 or 1, PostgreSQL a bool).

What is one database's alone — PRAGMAs, ``BEGIN IMMEDIATE``, the WAL, advisory locks, the pool,
each schema's DDL and how its version is kept — lives in that backend's module and its schema
module (`sqlite`, `sqlite_schema`, `postgres`, `postgres_schema`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

__all__ = ["Connection", "Cursor"]


class Cursor(Protocol):
    """The result of one statement (a `sqlite3.Cursor` is one, and so is the PostgreSQL
    backend's psycopg cursor)."""

    @property
    def rowcount(self) -> int:
        """Rows the statement inserted, updated or deleted."""
        ...

    @property
    def lastrowid(self) -> int | None:
        """The id of the row an INSERT created."""
        ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """A connection inside a transaction the backend owns (a `sqlite3.Connection` is one, and
    so is `postgres.PostgresConnection`)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Cursor: ...
