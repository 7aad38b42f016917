"""Dead letters: input the agent rejected, kept for inspection, bounded per experiment.

Only the newest `keep` letters of each experiment are kept (letters that could not be tied to
an experiment, ``experiment`` NULL, are a group of their own), each payload cut to a limit while
`payload_size` records the original length.
"""

from __future__ import annotations

from connectors.store.rows import DEAD_LETTER_COLUMNS, DeadLetterRow
from connectors.store.sql import Connection

__all__ = ["add", "select"]


def add(
    conn: Connection,
    experiment: str | None,
    topic: str,
    reason: str,
    detail: str,
    payload: bytes,
    payload_size: int,
    at: float,
    keep: int,
) -> int:
    """Insert a letter and drop its group's letters older than the newest `keep`; its id."""
    cursor = conn.execute(
        "INSERT INTO dead_letters (experiment, topic, reason, detail, payload, "
        "payload_size, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (experiment, topic, reason, detail, payload, payload_size, at),
    )
    letter_id = int(cursor.lastrowid or 0)
    group, parameters = _group(experiment)
    conn.execute(
        f"DELETE FROM dead_letters WHERE {group} AND id <= (SELECT id FROM dead_letters "
        f"WHERE {group} ORDER BY id DESC LIMIT 1 OFFSET ?)",
        (*parameters, *parameters, keep),
    )
    return letter_id


def select(conn: Connection, experiment: str | None) -> list[DeadLetterRow]:
    """The group's letters, oldest first."""
    group, parameters = _group(experiment)
    rows = conn.execute(
        f"SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters WHERE {group} ORDER BY id", parameters
    ).fetchall()
    return [DeadLetterRow(*r) for r in rows]


def _group(experiment: str | None) -> tuple[str, tuple[str, ...]]:
    """The condition selecting an experiment's letters (``IS NULL`` for None: portable SQL)."""
    if experiment is None:
        return "experiment IS NULL", ()
    return "experiment = ?", (experiment,)
