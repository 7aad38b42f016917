"""Scratch PostgreSQL databases: created with a unique name on a server the caller names by an
administrative URL (its user may create databases), dropped afterwards. The store benchmark
writes into them, and so do the tests (`tests/stores.py`)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

__all__ = ["DEFAULT_ADMIN_URL", "scratch_database"]

# The development machines' server: PostgreSQL on loopback, user postgres, trust.
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@contextlib.contextmanager
def scratch_database(
    admin_url: str = DEFAULT_ADMIN_URL, prefix: str = "cbo_scratch"
) -> Iterator[str]:
    """A new, empty database named `prefix`_pid_random on `admin_url`'s server; its URL (the
    admin URL naming it). Dropped on exit, with the connections still open to it."""
    import psycopg

    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
