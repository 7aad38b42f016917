"""The visited_states table: the states a device's controller visited in one round's episode.

Paper 000's surrogate Hessian averages ∂²π/∂θ² over the states the devices visit; a device sends
them with the round's reward reading (docs/protocol.md, "Visited states") and the agent keeps
them here, so that a restarted agent hands the same states to its policy. One trace per
(experiment, round, device): the first is kept, a repeat (a QoS 1 redelivery) writes nothing.
The array is kept as an array reading's: dtype, shape (JSON) and little-endian C-order bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from connectors.store import rounds
from connectors.store.sql import Connection

__all__ = ["StatesRow", "add", "select"]

_INSERT = (
    "INSERT INTO visited_states (experiment, round, device_id, dtype, shape, data, "
    "received_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (experiment, round, device_id) DO NOTHING"
)


@dataclass(frozen=True, slots=True)
class StatesRow:
    """One stored trace: `array()` is the states, (T, agents, obs), float32 or float64."""

    id: int
    round: int
    device_id: str
    dtype: str
    shape: str
    data: bytes
    received_at: float

    def array(self) -> Any:
        """The states as a read-only numpy array in their stored dtype and shape."""
        import numpy as np  # lazily: a store without parameter vectors never needs it

        dtype = np.dtype("<f4" if self.dtype == "float32" else "<f8")
        shape = [int(n) for n in json.loads(self.shape)]
        return np.frombuffer(bytes(self.data), dtype=dtype).reshape(shape)


def add(
    conn: Connection,
    experiment: str,
    round: int,
    device_id: str,
    packed: tuple[str, str, bytes],
    received_at: float,
) -> bool:
    """Insert the trace (`packed`: dtype, shape as JSON, bytes); False if the round already has
    one from this device. StoreError if the round is unknown."""
    rounds.require(conn, experiment, round)
    dtype, shape, data = packed
    parameters = (experiment, round, device_id, dtype, shape, data, received_at)
    return conn.execute(_INSERT, parameters).rowcount == 1


def select(conn: Connection, experiment: str) -> list[StatesRow]:
    """The experiment's traces in arrival order."""
    rows = conn.execute(
        "SELECT id, round, device_id, dtype, shape, data, received_at FROM visited_states "
        "WHERE experiment = ? ORDER BY id",
        (experiment,),
    ).fetchall()
    return [StatesRow(*row) for row in rows]
