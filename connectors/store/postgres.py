"""The PostgreSQL backend of the store: a database shared by the replicas of a fleet.

`PostgresDatabase` keeps the contract of `database.Database` with a psycopg 3 connection pool
(`psycopg_pool.ConnectionPool`, at most `POOL_SIZE` connections per `Store`):

Transactions
    A thread's outermost `transaction`, `writing` or `reading` takes a connection from the pool
    and binds it to the thread until the block ends; nested blocks reuse it, as savepoints.
    Other threads take their own connections, so they never join (or commit, or roll back)
    another thread's transaction, and they do not wait for it either — unlike SQLite, whose one
    connection serializes them — except where both write the same experiment. Write transactions
    run at READ COMMITTED (pinned, whatever the server's default), and the check-then-write
    steps of the table modules are made safe by the experiment's write lock: `lock_experiment`
    takes a transaction-level advisory lock keyed by the experiment's name
    (``pg_advisory_xact_lock(EXPERIMENT_LOCK_SPACE, hashtext(name))``) before the first write of
    an experiment in a transaction, and holds it to the end. Every write of an experiment's rows
    and of its control row — lease changes, pause and stop included — goes through
    `Store._writing`, which takes it. So the writers of one experiment — threads, processes,
    replicas — are serialized as SQLite's ``BEGIN IMMEDIATE`` serializes every writer, while
    different experiments write in parallel (two names with one hash share a lock: slower, never
    wrong). This keeps the budget never overspent (`ledger.reserve` sums and inserts under that
    lock) and makes a lease epoch check atomic with the write it guards (a new owner's
    `acquire_lease` waits for the writes in flight, and the writes after it read its epoch). An
    advisory lock rather than a row lock (``FOR UPDATE`` on the experiment's row): the same
    exclusion, without writing a lock into the row, and so into the WAL, at every transaction. A
    transaction should write one experiment: two that lock two experiments in opposite orders
    deadlock, and PostgreSQL aborts one (StoreError). A writer waits for the lock at most
    ``timeout_s`` (``lock_timeout``), and a transaction left idle for ``timeout_s / 2`` is ended
    by the server (``idle_in_transaction_session_timeout``): a replica frozen inside a
    transaction (SIGSTOP) loses it, its locks with it, so the replica that takes over its
    experiments is not kept waiting; the frozen one finds its transaction rolled back when it
    wakes (StoreError). ``consistent`` reads run in one REPEATABLE READ, READ ONLY transaction.

    A write inside an open transaction runs without a savepoint of its own (each would cost two
    round trips to the server). The table modules check before they write, so a write refused
    by a check (`BudgetExceeded`, `IllegalTransition`, `FencedError`, ...) has written nothing
    and the transaction goes on, as on SQLite. A statement the server refuses (a constraint)
    aborts the whole transaction instead: it rolls back when its block exits, and the commit of
    a block that caught that error and went on raises StoreError rather than committing
    nothing in silence. Nested `transaction` blocks are savepoints as on SQLite.

Durability
    A write returns after PostgreSQL's COMMIT, durable as the server is configured
    (``synchronous_commit = on``, the default, waits for the WAL flush, as SQLite's
    ``synchronous=FULL`` does). A connection lost mid-write raises StoreError; a lost COMMIT may
    or may not have been applied, as with any client-server database, so callers treat the
    write as unknown and re-read (the agent's recovery does).

Ids
    Reading, snapshot and dead-letter ids come from identity columns: allocated at insert,
    never reused, increasing. Under concurrent writers of one experiment they would be in
    allocation order rather than commit order, but the experiment lock serializes those writers,
    so per experiment ids still are arrival order (what `Store.readings(after_id=...)` needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import psycopg
import structlog
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from connectors.store import postgres_schema as schema
from connectors.store.errors import StoreError
from connectors.store.location import PostgresLocation
from connectors.store.schema import VERSIONS
from connectors.store.sql import Connection

__all__ = ["POOL_SIZE", "PostgresConnection", "PostgresDatabase"]

log = structlog.get_logger(__name__)

# pg_advisory_xact_lock(space, key)'s first key for "writing experiment <key>" locks.
EXPERIMENT_LOCK_SPACE: Final = 0x4342_4F41
POOL_SIZE: Final = 4  # the event loop, the policy's worker thread, and room for a spike
# Tables whose id is an identity column: their INSERTs get ``RETURNING id`` (psycopg has no
# lastrowid).
_IDENTITY_TABLES: Final = ("readings", "snapshots", "dead_letters")


class _Cursor(psycopg.Cursor[Any]):
    """A psycopg cursor with the `lastrowid` the table modules read after an INSERT."""

    lastrowid: int | None = None


class PostgresConnection:
    """A pooled connection as the table modules see it (`sql.Connection`): ``?`` marks become
    psycopg's ``%s``, and an INSERT into a table with an identity column sets `lastrowid`."""

    __slots__ = ("raw",)

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> _Cursor:
        query, returning = _translate(sql)
        cursor = cast(_Cursor, self.raw.execute(query, parameters))
        if returning:
            row = cursor.fetchone()
            cursor.lastrowid = None if row is None else int(row[0])
        return cursor

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> _Cursor:
        """`rowcount`: the rows every execution changed, together (no `lastrowid`: no
        ``RETURNING id`` either)."""
        cursor = cast(_Cursor, self.raw.cursor())
        cursor.executemany(sql.replace("?", "%s"), parameters)
        return cursor


@functools.lru_cache(maxsize=1024)
def _translate(sql: str) -> tuple[str, bool]:
    """(psycopg's query, whether ``RETURNING id`` was appended). `sql`'s rules: ``?`` only as
    parameter marks, no ``%`` at all."""
    query = sql.replace("?", "%s")
    words = query.split(None, 3)
    returning = words[:2] == ["INSERT", "INTO"] and words[2] in _IDENTITY_TABLES
    return (f"{query} RETURNING id" if returning else query), returning


@dataclass
class _ThreadState:
    """What one thread holds: its connection while a block is open, the nesting depth, the
    asyncio task that opened the outermost transaction, and the experiments it has locked
    (experiment -> the depth whose block took the lock; a rolled-back savepoint releases it)."""

    conn: psycopg.Connection[Any] | None = None
    depth: int = 0
    owner_task: asyncio.Task[Any] | None = None
    locked: dict[str, int] = field(default_factory=dict)


class PostgresDatabase:
    """A PostgreSQL database holding a cbo-agent store, migrated to the current schema.

    Raises:
        StoreError: the server cannot be reached or refuses the login (the message is
            libpq's, on one line), the database holds another program's tables, or a schema
            newer than this code.
    """

    def __init__(
        self, location: PostgresLocation, timeout_s: float, pool_size: int = POOL_SIZE
    ) -> None:
        self.location = location
        self._timeout_s = float(timeout_s)
        self._local = threading.local()
        self._guard = threading.Lock()
        self._open_transactions = 0
        self._kwargs = self._connect_kwargs()
        with self._connect() as conn:  # a direct connection first: its error says what is wrong
            self._migrate(conn)
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = ConnectionPool(
            location.conninfo,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs=self._kwargs,
            configure=self._configure,
            timeout=self._timeout_s,
            name="cbo-store",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=self._timeout_s)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreError(f"cannot open store {self.display}: {exc}") from exc

    @property
    def display(self) -> str:
        return self.location.display

    # ---- connect and migrate -----------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        try:
            given = conninfo_to_dict(self.location.conninfo)
        except psycopg.Error as exc:
            raise StoreError(f"store {self.display}: {_one_line(exc)}") from exc
        kwargs: dict[str, Any] = {"autocommit": True, "cursor_factory": _Cursor}
        if "connect_timeout" not in given:
            kwargs["connect_timeout"] = max(2, round(self._timeout_s))
        if "application_name" not in given:
            kwargs["application_name"] = "cbo-agent"
        return kwargs

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(self.location.conninfo, **self._kwargs)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open store {self.display}: {_one_line(exc)}") from exc
        self._configure(conn)
        return conn

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Per connection: wait at most timeout_s for a lock (SQLite's busy timeout), and let
        the server end a transaction left idle for half that (see the module docstring)."""
        timeout_ms = int(self._timeout_s * 1000)
        conn.execute(f"SET lock_timeout = {timeout_ms}")
        conn.execute(f"SET idle_in_transaction_session_timeout = {max(1, timeout_ms // 2)}")

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        target = len(schema.MIGRATIONS)
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (schema.MIGRATION_LOCK,))
                current = self._applied_version(conn, target)
                for version in range(current, target):
                    for statement in schema.MIGRATIONS[version]:
                        conn.execute(statement)
                    conn.execute(
                        f"INSERT INTO {schema.MIGRATIONS_TABLE} (version, description) "
                        "VALUES (%s, %s)",
                        (version + 1, _description(version)),
                    )
        except psycopg.Error as exc:
            raise StoreError(f"cannot open store {self.display}: {_one_line(exc)}") from exc
        if current != target:
            log.info("store.migrated", store=self.display, from_version=current, to=target)

    def _applied_version(self, conn: psycopg.Connection[Any], target: int) -> int:
        """The database's schema version (creating the migrations table in an empty one);
        StoreError if it holds another program's tables or a newer schema."""
        table = schema.MIGRATIONS_TABLE
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,):
            found = conn.execute(
                "SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NOT NULL",
                (list(schema.STORE_TABLES),),
            ).fetchall()
            if found:
                raise StoreError(
                    f"{self.display} is a PostgreSQL database but not a cbo-agent store: it has "
                    f"tables {', '.join(r[0] for r in found)} and no {table} (use another "
                    "database, or another schema: ?options=-csearch_path%3Dcbo)"
                )
            conn.execute(schema.CREATE_MIGRATIONS_TABLE)
        versions = [r[0] for r in conn.execute(f"SELECT version FROM {table} ORDER BY version")]
        if versions != list(range(1, len(versions) + 1)):
            raise StoreError(f"store {self.display}: {table} lists versions {versions}, not 1..n")
        if len(versions) > target:
            raise StoreError(
                f"store {self.display} has schema version {len(versions)}, newer than the "
                f"{target} this cbo-agent knows: upgrade cbo-agent (downgrades are not supported)"
            )
        return len(versions)

    # ---- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the pool (idempotent); refused while a transaction is open."""
        with self._guard:
            if self._pool is None:
                return
            if self._open_transactions:
                raise StoreError(f"store {self.display}: close() inside an open transaction")
            pool, self._pool = self._pool, None
        pool.close()

    @property
    def closed(self) -> bool:
        return self._pool is None

    def schema_version(self) -> int:
        with self.reading("schema_version") as conn:
            row = conn.execute(f"SELECT max(version) FROM {schema.MIGRATIONS_TABLE}").fetchone()
            return int(row[0] or 0)

    def size_bytes(self) -> int:
        """Bytes the store's tables take with their indexes and TOAST (snapshots live there)."""
        with self.reading("size_bytes") as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(to_regclass(t))), 0)::bigint "
                "FROM unnest(?::text[]) AS t",
                (list(schema.STORE_TABLES),),
            ).fetchone()
            return int(row[0])

    # ---- what the store asks of a backend besides transactions -------------------------------

    def lock_experiment(self, conn: Connection, experiment: str) -> None:
        """Take the experiment's write lock until this transaction ends (once per transaction;
        a savepoint rolled back forgets what it took)."""
        state = self._state()
        if experiment in state.locked:
            return
        conn.execute(
            "SELECT pg_advisory_xact_lock(?, hashtext(?))", (EXPERIMENT_LOCK_SPACE, experiment)
        )
        state.locked[experiment] = state.depth

    def clock(self, conn: Connection) -> float:
        """The server's clock: the start of the current transaction, unix seconds."""
        row = conn.execute("SELECT EXTRACT(EPOCH FROM now())::double precision").fetchone()
        return float(row[0])

    # ---- transactions ------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        state = self._state()
        self._check_owner(state)
        depth = state.depth
        conn = self._bind(state) if not depth else state.conn
        assert conn is not None
        try:
            conn.execute(
                f"SAVEPOINT sp{depth}" if depth else "BEGIN ISOLATION LEVEL READ COMMITTED"
            )
        except psycopg.Error as exc:
            if not depth:
                self._unbind(state)
            raise StoreError(f"store {self.display}: cannot begin a transaction: {exc}") from exc
        if not depth:
            state.owner_task = _current_task()
        state.depth = depth + 1
        try:
            yield
        except BaseException:
            state.depth = depth
            self._undo(state, conn, depth)
            raise
        state.depth = depth
        if depth:
            self._release(conn, depth)
        else:
            self._commit(state, conn)

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[PostgresConnection]:
        """One write: its own transaction, or a part of the thread's open one — without a
        savepoint of its own there (two round trips saved per write; see the module
        docstring for what that means when the database refuses a statement)."""
        state = self._state()
        self._check_owner(state)
        try:
            if state.depth:
                assert state.conn is not None
                yield PostgresConnection(state.conn)
                return
            with self.transaction():
                assert state.conn is not None
                yield PostgresConnection(state.conn)
        except psycopg.Error as exc:
            raise StoreError(f"store {self.display}: {what}: {_one_line(exc)}") from exc

    @contextlib.contextmanager
    def reading(self, what: str, consistent: bool = False) -> Iterator[PostgresConnection]:
        state = self._state()
        self._check_owner(state)
        if state.depth:  # inside this thread's transaction: read what it wrote
            try:
                assert state.conn is not None
                yield PostgresConnection(state.conn)
            except psycopg.Error as exc:
                raise StoreError(f"store {self.display}: {what}: {_one_line(exc)}") from exc
            return
        conn = self._checkout()
        try:
            if consistent:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield PostgresConnection(conn)
        except psycopg.Error as exc:
            raise StoreError(f"store {self.display}: {what}: {_one_line(exc)}") from exc
        finally:
            self._end_read(conn)

    def _end_read(self, conn: psycopg.Connection[Any]) -> None:
        """End a read transaction (a read-only COMMIT) and give the connection back."""
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error as exc:  # a broken connection: the pool drops it
            log.warning("store.read_end_failed", store=self.display, error=_one_line(exc))
        finally:
            self._checkin(conn)

    def _state(self) -> _ThreadState:
        state: _ThreadState | None = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _ThreadState()
        return state

    def _bind(self, state: _ThreadState) -> psycopg.Connection[Any]:
        with self._guard:
            self._open_transactions += 1
        try:
            state.conn = self._checkout()
        except BaseException:
            with self._guard:
                self._open_transactions -= 1
            raise
        return state.conn

    def _unbind(self, state: _ThreadState) -> None:
        conn, state.conn = state.conn, None
        state.owner_task = None
        state.locked.clear()
        with self._guard:
            self._open_transactions -= 1
        if conn is not None:
            self._checkin(conn)

    def _checkout(self) -> psycopg.Connection[Any]:
        pool = self._pool
        if pool is None:
            raise StoreError(f"store {self.display} is closed")
        try:
            return pool.getconn(timeout=self._timeout_s)
        except PoolTimeout as exc:
            raise StoreError(f"store {self.display}: no database connection: {exc}") from exc

    def _checkin(self, conn: psycopg.Connection[Any]) -> None:
        pool = self._pool
        if pool is None:  # closed meanwhile
            conn.close()
        else:
            pool.putconn(conn)

    def _release(self, conn: psycopg.Connection[Any], depth: int) -> None:
        conn.execute(f"RELEASE sp{depth}")

    def _undo(self, state: _ThreadState, conn: psycopg.Connection[Any], depth: int) -> None:
        try:
            if depth:
                conn.execute(f"ROLLBACK TO sp{depth}")
                conn.execute(f"RELEASE sp{depth}")
                state.locked = {e: d for e, d in state.locked.items() if d <= depth}
            else:
                conn.execute("ROLLBACK")
        except psycopg.Error as exc:  # keep the original exception; the failed undo is logged
            log.error("store.rollback_failed", store=self.display, error=_one_line(exc))
        finally:
            if not depth:
                self._unbind(state)

    def _commit(self, state: _ThreadState, conn: psycopg.Connection[Any]) -> None:
        try:
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                # PostgreSQL would answer COMMIT with a silent ROLLBACK: a statement failed
                # inside the block and the caller went on. Say so instead.
                conn.execute("ROLLBACK")
                raise StoreError(
                    f"store {self.display}: the transaction was rolled back: a statement in it "
                    "failed earlier (the error was caught inside the transaction block)"
                )
            conn.execute("COMMIT")
        except psycopg.Error as exc:
            raise StoreError(f"store {self.display}: commit failed: {_one_line(exc)}") from exc
        finally:
            self._unbind(state)

    def _check_owner(self, state: _ThreadState) -> None:
        if state.depth and state.owner_task is not None and _current_task() is not state.owner_task:
            raise StoreError(
                f"store {self.display}: called from another asyncio task while a transaction is "
                "open (do not await inside Store.transaction())"
            )


def _description(version: int) -> str:
    return VERSIONS[version] if version < len(VERSIONS) else f"version {version + 1}"


def _one_line(exc: BaseException) -> str:
    """The server's message and hint on one line (libpq's text spans lines: the statement's
    context, a caret); the store's errors are one line."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None)
    if not primary:
        return " ".join(str(exc).split())
    hint = getattr(diag, "message_hint", None)
    return " ".join(f"{primary} ({hint})".split()) if hint else " ".join(primary.split())


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop in this thread
        return None
