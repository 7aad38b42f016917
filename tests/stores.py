"""Stores for tests on both backends: a scratch PostgreSQL database per test (created and
dropped on the server at 127.0.0.1:5432, user postgres), and raw access to a store's database
that goes around `Store` (to plant rows, read the schema, tamper).

The server is the machine's (`.ci/run` starts it); if it is not running, `postgres_unavailable`
tries once to start the machine's cluster with ``pg_ctlcluster``, and says why it cannot when
neither works, for the tests to skip with. ``CBO_TEST_POSTGRES_URL`` names another server (an
administrative URL: its user must be allowed to create databases).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness.postgres import DEFAULT_ADMIN_URL
from bench.harness.postgres import scratch_database as harness_scratch_database
from connectors.store import PostgresLocation, parse_store_location

__all__ = [
    "ADMIN_URL",
    "RawDatabase",
    "StoreChild",
    "empty_store",
    "postgres_unavailable",
    "scratch_database",
]

REPO = Path(__file__).resolve().parents[1]
ADMIN_URL = os.environ.get("CBO_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL)


def _reachable() -> str | None:
    """None if the server answers, else why not (one line)."""
    import psycopg

    try:
        with psycopg.connect(ADMIN_URL, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return " ".join(str(exc).split())
    return None


@functools.cache
def postgres_unavailable() -> str | None:
    """None if a PostgreSQL server is there for tests (started if need be), else the reason."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]' psycopg-pool)"
    why = _reachable()
    if why is None:
        return None
    started = _start_local_cluster()
    for _ in range(20):
        if _reachable() is None:
            return None
        time.sleep(0.25)
    return f"no PostgreSQL at {ADMIN_URL} ({why}); starting one: {started}"


def _start_local_cluster() -> str:
    """Start the machine's Debian cluster (what .ci/run does); what happened, one line."""
    tool, clusters = shutil.which("pg_ctlcluster"), Path("/etc/postgresql")
    if tool is None or not clusters.is_dir():
        return "no pg_ctlcluster or /etc/postgresql here (apt-get install postgresql)"
    versions = sorted(p.name for p in clusters.iterdir())
    if not versions:
        return "no cluster under /etc/postgresql"
    command = [tool, "--skip-systemctl-redirect", versions[-1], "main", "start"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    return f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[:200]}"


def scratch_database() -> contextlib.AbstractContextManager[str]:
    """A new, empty database with a unique name on ADMIN_URL's server (its URL); dropped
    afterwards."""
    return harness_scratch_database(ADMIN_URL, prefix="cbo_test")


# Children before parents (foreign keys).
STORE_TABLES = (
    "snapshot_arrays",
    "snapshots",
    "oracle",
    "ledger",
    "readings",
    "visited_states",
    "dead_letters",
    "rounds",
    "experiments",
)


def empty_store(url: str) -> None:
    """Delete every row of the PostgreSQL store at `url`, in one transaction: a few
    milliseconds, where TRUNCATE (new files, fsynced) takes a hundred. Ids go on counting."""
    import psycopg

    with psycopg.connect(url) as conn:  # one transaction, committed on exit
        conn.execute("SET lock_timeout = '5s'")  # a test that left a transaction open: say so
        for table in STORE_TABLES:
            conn.execute(f"DELETE FROM {table}")


class RawDatabase:
    """A store's database without `Store`: statements with ``?`` marks, autocommitted."""

    def __init__(self, target: str | Path) -> None:
        location = parse_store_location(target)
        self.postgres = isinstance(location, PostgresLocation)
        if isinstance(location, PostgresLocation):
            import psycopg

            self._conn: Any = psycopg.connect(location.conninfo, autocommit=True)
        else:
            self._conn = sqlite3.connect(location.path, isolation_level=None)

    def __enter__(self) -> RawDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.postgres:
            sql = sql.replace("?", "%s")
        cursor = self._conn.execute(sql, parameters)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []

    def tables(self) -> set[str]:
        if self.postgres:
            query = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        else:
            query = "SELECT name FROM sqlite_master WHERE type = 'table'"
        return {r[0] for r in self.execute(query)}

    def columns(self, table: str) -> list[str]:
        if self.postgres:
            return [
                r[0]
                for r in self.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = ? "
                    "ORDER BY ordinal_position",
                    (table,),
                )
            ]
        return [r[1] for r in self.execute(f"PRAGMA table_info({table})")]

    def version(self) -> int:
        """The schema version as the database records it."""
        if self.postgres:
            rows = self.execute("SELECT coalesce(max(version), 0) FROM cbo_schema_migrations")
            return int(rows[0][0])
        return int(self.execute("PRAGMA user_version")[0][0])


class StoreChild:
    """A Python process running `script` with the store target as ``sys.argv[1]`` (then
    `args`), for what threads cannot show: kill -9, SIGSTOP, a second process. Its protocol
    lines on stdout start with "@" (logs may share stdout); its stderr goes to `log`."""

    def __init__(self, script: str, target: str | Path, log: Path, *args: str) -> None:
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), str(target), *args],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def next_line(self) -> str:
        """The child's next protocol line, without the "@ "; fails if it exits first."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("@ "):
                return line[2:].strip()
        raise AssertionError(f"child exited: {self.log.read_text()}")

    def send(self, line: str) -> None:
        """A line on the child's stdin (a script waiting with input() reads it)."""
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def finish(self, timeout_s: float = 30) -> list[str]:
        """Close its stdin, wait for a clean exit; the protocol lines it printed since the last
        one `next_line` read (through the same buffered stream, as `kill9` explains)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        rest = self.process.stdout.read()
        assert self.process.wait(timeout=timeout_s) == 0, self.log.read_text()
        return [line[2:].strip() for line in rest.splitlines() if line.startswith("@ ")]

    def kill9(self) -> list[str]:
        """SIGKILL the child; return the rest of the protocol lines it printed before dying.

        The rest is read through the same buffered stream `next_line` used: `communicate` reads
        the raw pipe and would skip what that stream had already read ahead, starting
        mid-line. Only newline-terminated lines count; a line cut by the kill was not fully
        printed.
        """
        assert self.process.stdout is not None
        os.kill(self.process.pid, signal.SIGKILL)
        rest = self.process.stdout.read()
        self.process.stdout.close()
        assert self.process.wait(timeout=30) == -signal.SIGKILL
        complete = rest.split("\n")[:-1]
        return [line[2:].strip() for line in complete if line.startswith("@ ")]
