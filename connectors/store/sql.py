"""What the table modules ask of a database connection, and the SQL they write.

The table modules (`experiments`, `rounds`, `readings`, `ledger`, `snapshots`, `dead_letters`,
`export`) are functions over a `Connection`: they run their statements and leave transactions,
locking and error translation to the backend that hands them the connection (today
`connection.SqliteDatabase`). So that another backend can share them, their SQL keeps to what
SQLite and PostgreSQL both run:

- parameters are positional ``?`` marks (DB-API "qmark", what `sqlite3` takes; a backend whose
  driver wants ``%s`` translates them — the statements hold no other ``?`` and no ``%``);
- upserts are ``INSERT ... ON CONFLICT (...) DO NOTHING | DO UPDATE SET c = excluded.c``;
- a NULL key is matched with ``IS NULL``, never ``IS ?``; ``LIMIT`` is left out, not ``-1``,
  when there is none;
- the id of a row just inserted is `Cursor.lastrowid` (``RETURNING`` needs SQLite 3.35, which
  Python 3.11 does not promise; a backend without `lastrowid` supplies it, e.g. by appending
  ``RETURNING id``).

What is SQLite's alone — PRAGMAs, ``BEGIN IMMEDIATE``, the WAL, the schema's DDL and its
``user_version`` — lives in `connection` and `schema`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

__all__ = ["Connection", "Cursor"]


class Cursor(Protocol):
    """The result of one statement (a `sqlite3.Cursor` is one)."""

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
    """A connection inside a transaction the backend owns (a `sqlite3.Connection` is one)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Cursor: ...
