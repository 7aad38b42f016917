"""The experiments table: one row per experiment, its spec as JSON."""

from __future__ import annotations

import json
from typing import Any

from connectors.store.errors import StoreError
from connectors.store.sql import Connection

__all__ = ["names", "require", "spec", "upsert"]


def upsert(conn: Connection, name: str, spec_json: str, at: float) -> None:
    """Create the experiment or replace its spec."""
    conn.execute(
        "INSERT INTO experiments (name, spec, updated_at) VALUES (?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, "
        "updated_at = excluded.updated_at",
        (name, spec_json, at),
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
