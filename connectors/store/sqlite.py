"""The SQLite backend of the store: open the file, set its PRAGMAs, migrate it, and run every
read and write under one lock and one transaction discipline.

`SqliteDatabase` owns the one `sqlite3.Connection` of a `Store`; the table modules see that
connection only inside `writing` (an atomic write) or `reading` (reads under the lock). See the
`connectors.store` docstring for what durability and thread safety this buys, `sql` for what
the table modules may assume of the connection, and `database.Database` for what `Store` asks of
a backend. Every write transaction starts with ``BEGIN IMMEDIATE``, which takes the file's one
write lock: writers of every process are serialized, so `lock_experiment` has nothing to add.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from connectors.store import sqlite_schema as schema
from connectors.store.errors import StoreError
from connectors.store.location import MEMORY, SqliteLocation

__all__ = ["SqliteDatabase"]

log = structlog.get_logger(__name__)

# After a checkpoint, cut the WAL back to this size (a snapshot of large GP factors would
# otherwise leave a WAL as big as itself on disk for the life of the agent).
WAL_SIZE_LIMIT = 64 * 2**20


class SqliteDatabase:
    """One store file, opened in WAL mode with ``synchronous=FULL`` and migrated to the current
    schema; its transactions nest as savepoints and hold a re-entrant lock.

    ``":memory:"`` gives a private in-memory database (no durability; for tests of callers).

    Raises:
        StoreError: the file is not a database, not a cbo-agent store, written by newer code,
            or WAL mode cannot be enabled on it.
    """

    def __init__(self, location: SqliteLocation, timeout_s: float) -> None:
        self.location = location
        self._memory = str(location.path) == MEMORY
        self.path: Path | str = MEMORY if self._memory else Path(location.path)
        self._lock = threading.RLock()
        self._depth = 0
        self._owner_task: asyncio.Task[Any] | None = None
        self._conn: sqlite3.Connection | None = self._open(float(timeout_s))

    # ---- open, configure, migrate ------------------------------------------------------------

    def _open(self, timeout_s: float) -> sqlite3.Connection:
        created = not self._memory and not _nonempty_file(Path(self.path))
        try:
            conn = sqlite3.connect(
                str(self.path), timeout=timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc
        try:
            self._configure(conn, timeout_s)
            self._migrate(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        if created:  # make the new file's directory entry durable too
            _fsync_directory(Path(self.path).resolve().parent)
        return conn

    def _configure(self, conn: sqlite3.Connection, timeout_s: float) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        mode = _set_wal(conn, timeout_s)
        if mode != "wal" and not self._memory:
            raise StoreError(f"store {self.path}: WAL mode refused (journal_mode is {mode!r})")
        conn.execute("PRAGMA synchronous = FULL")  # fsync the WAL at every commit: see the docs
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        conn.execute("PRAGMA trusted_schema = OFF")

    def _migrate(self, conn: sqlite3.Connection) -> None:
        target = len(schema.MIGRATIONS)
        if self._header_ok(conn, target):
            return
        conn.execute("BEGIN IMMEDIATE")  # re-read under the write lock: another opener may race
        try:
            current = conn.execute("PRAGMA user_version").fetchone()[0]
            self._header_ok(conn, target)  # raises for a foreign or newer file
            for version in range(current, target):
                schema.run_migration(conn, schema.MIGRATIONS[version], version + 1)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if current != target:
            log.info("store.migrated", path=str(self.path), from_version=current, to=target)

    def _header_ok(self, conn: sqlite3.Connection, target: int) -> bool:
        """True if the file is at `target`; raise if it is foreign or newer than this code."""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if version > target:
            raise StoreError(
                f"store {self.path} has schema version {version}, newer than the {target} this "
                "cbo-agent knows: upgrade cbo-agent (downgrades are not supported)"
            )
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        foreign = app_id != schema.APPLICATION_ID and (app_id != 0 or version != 0 or tables)
        if foreign:
            raise StoreError(
                f"{self.path} is an SQLite database but not a cbo-agent store "
                f"(application_id {app_id:#x}, user_version {version}, {tables} schema objects)"
            )
        return version == target

    # ---- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent); refused inside an open transaction."""
        with self._lock:
            if self._conn is None:
                return
            if self._depth:
                raise StoreError(f"store {self.path}: close() inside an open transaction")
            self._conn.close()
            self._conn = None

    @property
    def closed(self) -> bool:
        return self._conn is None

    def live(self) -> sqlite3.Connection:
        """The open connection, without the lock (callers hold it); StoreError once closed."""
        if self._conn is None:
            raise StoreError(f"store {self.path} is closed")
        return self._conn

    def schema_version(self) -> int:
        with self.reading("schema_version") as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def size_bytes(self) -> int:
        """Bytes the database's pages take, free pages included (what the file grows to once
        the WAL is checkpointed into it; the WAL itself is cut back to `WAL_SIZE_LIMIT`)."""
        with self.reading("size_bytes") as conn:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            return int(pages) * int(conn.execute("PRAGMA page_size").fetchone()[0])

    # ---- what the store asks of a backend besides transactions -------------------------------

    def lock_experiment(self, conn: sqlite3.Connection, experiment: str) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` already holds the file's one write lock."""

    def clock(self, conn: sqlite3.Connection) -> float:
        """The database's clock, unix seconds: this machine's, the one every process sharing
        the file reads (an SQLite file is not shared across machines)."""
        return time.time()

    # ---- transactions ------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes into one atomic commit, durable when the outermost block exits.

        Nested blocks join the outer transaction as savepoints: an exception escaping an inner
        block undoes that block's writes only; one escaping the outer block undoes all. Other
        threads' calls wait until the outermost block exits. Do not ``await`` inside.
        """
        with self._lock:
            conn = self.live()
            depth = self._depth
            self._check_owner()
            try:
                conn.execute(f"SAVEPOINT sp{depth}" if depth else "BEGIN IMMEDIATE")
            except sqlite3.Error as exc:  # e.g. another writer held the lock past the timeout
                raise StoreError(f"store {self.path}: cannot begin a transaction: {exc}") from exc
            if not depth:
                self._owner_task = _current_task()
            self._depth = depth + 1
            try:
                yield
            except BaseException:
                self._depth = depth
                self._undo(conn, depth)
                raise
            self._depth = depth
            if depth:
                conn.execute(f"RELEASE sp{depth}")
            else:
                self._owner_task = None
                self._commit(conn)

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[sqlite3.Connection]:
        """One atomic write (a savepoint inside an open transaction); sqlite errors named."""
        try:
            with self.transaction():
                yield self.live()
        except sqlite3.Error as exc:
            raise StoreError(f"store {self.path}: {what}: {exc}") from exc

    @contextlib.contextmanager
    def reading(self, what: str, consistent: bool = False) -> Iterator[sqlite3.Connection]:
        """Reads under the lock; `consistent` wraps several SELECTs in one read transaction."""
        with self._lock:
            conn = self.live()
            self._check_owner()
            own = consistent and not self._depth
            try:
                if own:
                    conn.execute("BEGIN")
                yield conn
            except sqlite3.Error as exc:
                raise StoreError(f"store {self.path}: {what}: {exc}") from exc
            finally:
                if own and conn.in_transaction:
                    conn.execute("COMMIT")

    def _undo(self, conn: sqlite3.Connection, depth: int) -> None:
        try:
            if depth:
                conn.execute(f"ROLLBACK TO sp{depth}")
                conn.execute(f"RELEASE sp{depth}")
            else:
                self._owner_task = None
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        except sqlite3.Error as exc:  # keep the original exception; the failed undo is logged
            log.error("store.rollback_failed", path=str(self.path), error=str(exc))

    def _commit(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise StoreError(f"store {self.path}: commit failed: {exc}") from exc

    def _check_owner(self) -> None:
        if self._depth and self._owner_task is not None and _current_task() is not self._owner_task:
            raise StoreError(
                f"store {self.path}: called from another asyncio task while a transaction is "
                "open (do not await inside Store.transaction())"
            )


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop in this thread
        return None


def _nonempty_file(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms that cannot open directories; SQLite did its own syncs
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _set_wal(conn: sqlite3.Connection, timeout_s: float) -> str:
    """Switch to WAL, retrying while another connection holds the file: SQLite does not call
    its busy handler for a journal-mode change, so replicas opening a new store at the same
    moment would otherwise see "database is locked" at once. The journal mode it reports."""
    deadline = time.monotonic() + timeout_s
    delay_s = 0.005
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.2)
