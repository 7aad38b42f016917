"""What the two backends' schemas share: the numbered versions, and the values their CHECK
constraints allow.

Each backend writes its own DDL (`sqlite_schema.MIGRATIONS`, `postgres_schema.MIGRATIONS`):
``MIGRATIONS[i]`` takes a store from version ``i`` to ``i + 1``, the same logical change in
both, so a version number means the same tables and columns whichever database holds them
(tests/test_connectors_store.py checks that both lists have one entry per `VERSIONS`). To change
the schema, append a version here and a migration to both lists; never edit one that shipped.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "EXPERIMENT_STATES",
    "LEDGER_STATES",
    "ROUND_STATUSES",
    "VERSIONS",
    "in_list",
    "schema_version",
]

# What each version adds, in order: VERSIONS[i] is version i + 1 (the PostgreSQL migrations
# table records it beside the number).
VERSIONS: Final = (
    "initial schema: experiments, rounds, readings, oracle, ledger, snapshots, dead letters",
    "rounds: what a device applied, and the action's expiry",
    "experiments: desired state (running, paused, stopped) and lease (owner, epoch, expiry)",
    "readings: the variance of a mean and its replications; ledger: the part of a settled "
    "reservation released (a partial multi-fidelity trial)",
    # version 5 (issue 15)
    "readings: arrays (a node with a shape): dtype, shape and little-endian bytes",
    # version 6 (issue 13)
    "visited_states: the states a device's controller visited in a round (paper 000)",
)

# The values the CHECK constraints allow, frozen with the migration that wrote them (its DDL
# text is in every store). The code's lists are `rounds.RoundStatus`, `ledger.LEDGER_STATES`
# and `experiments.EXPERIMENT_STATES`; a test keeps them equal.
ROUND_STATUSES: Final = ("proposed", "published", "acked", "rejected", "closed", "expired")
LEDGER_STATES: Final = ("reserved", "settled", "released")
EXPERIMENT_STATES: Final = ("running", "paused", "stopped")  # version 3


def schema_version() -> int:
    """The version this code writes: the number of versions."""
    return len(VERSIONS)


def in_list(values: tuple[str, ...]) -> str:
    """SQL ``('a', 'b')`` for a CHECK constraint (the values are the constants above)."""
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"
