"""What the store's reads return: frozen row dataclasses, the columns each is read from, and
the decoders of the columns that hold JSON.

A row's fields are in the order of its ``*_COLUMNS`` list, so a plain row becomes a dataclass
with ``Row(*values)``; only rounds need a decoder (their interventions are JSON text).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

# numpy is imported where snapshots need it, so `import connectors.store` stays light.
if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "EXPERIMENT_COLUMNS",
    "LEDGER_COLUMNS",
    "ORACLE_COLUMNS",
    "READING_COLUMNS",
    "ROUND_COLUMNS",
    "DeadLetterRow",
    "ExperimentRow",
    "ExperimentStatus",
    "Lease",
    "LedgerRow",
    "LedgerTotals",
    "OracleRow",
    "ReadingRow",
    "RoundRow",
    "Snapshot",
    "round_row",
]


@dataclass(frozen=True, slots=True)
class ExperimentRow:
    """An experiment's control row: the desired state and the lease."""

    name: str
    state: str  # running, paused or stopped (experiments.EXPERIMENT_STATES)
    owner: str | None  # the replica holding the lease; None when released or never taken
    epoch: int  # bumped by every acquisition: writes carrying an older one are refused
    lease_expires_at: float | None  # the database's clock, unix seconds
    updated_at: float  # when the spec was written
    state_at: float | None  # when the state last changed (None: running since version 2)
    leased: bool  # an owner holds an unexpired lease, by the database's clock at the read


@dataclass(frozen=True, slots=True)
class ExperimentStatus:
    """An experiment's control row with its progress."""

    experiment: ExperimentRow
    rounds: int
    open_rounds: int  # proposed, published or acked
    readings: int
    spent: float  # reserved + settled budget


@dataclass(frozen=True, slots=True)
class Lease:
    """A replica's hold on an experiment, as granted or renewed."""

    experiment: str
    owner: str
    epoch: int  # pass it with every write (`Store.fenced`): a newer owner's epoch fences this
    expires_at: float  # the database's clock, unix seconds; renew well before
    state: str  # the desired state at the grant: how the control plane reaches the owner


@dataclass(frozen=True, slots=True)
class RoundRow:
    experiment: str
    round: int
    action_id: str
    intervention: dict[str, float]
    target_set: list[str]
    cost: float
    kind: str
    status: str
    attempt: int  # publications so far: 0 until the first `bump_attempt`
    reason: str | None
    proposed_at: float
    status_at: float
    applied: dict[str, float] | None = None  # what the device reported applied, if it differed
    expires_at: float | None = None  # when the agent gives up on the action (None: none sent)


@dataclass(frozen=True, slots=True)
class ReadingRow:
    id: int  # arrival order over the whole store; never reused
    experiment: str
    round: int
    node: str
    value: float
    seq: int
    device_id: str
    received_at: float
    measured_at: float | None
    variance: float | None = None  # of a mean over replications (multi-fidelity), else None
    replications: int | None = None
    array_dtype: str | None = None  # an array reading: 'float32' or 'float64', else None
    array_shape: str | None = None  # its shape, a JSON list
    array_data: bytes | None = None  # its little-endian C-order bytes (`value` is its mean)

    @property
    def is_array(self) -> bool:
        return self.array_dtype is not None

    def array(self) -> Any:
        """The array (numpy, read-only) of an array reading; None for a scalar one."""
        if self.array_dtype is None or self.array_shape is None or self.array_data is None:
            return None
        import numpy as np  # lazily, as snapshots: a scalar store never needs it

        dtype = np.dtype("<f4" if self.array_dtype == "float32" else "<f8")
        shape = [int(n) for n in json.loads(self.array_shape)]
        return np.frombuffer(bytes(self.array_data), dtype=dtype).reshape(shape)


@dataclass(frozen=True, slots=True)
class OracleRow:
    experiment: str
    round: int
    action_id: str
    expected_reward: float
    optimum: float
    at: float


@dataclass(frozen=True, slots=True)
class LedgerRow:
    experiment: str
    round: int
    amount: float
    state: str
    budget_total: float | None
    reserved_at: float
    settled_at: float | None
    released_at: float | None


@dataclass(frozen=True, slots=True)
class LedgerTotals:
    reserved: float  # outstanding reservations
    settled: float
    released: float

    @property
    def spent(self) -> float:
        """What counts against the budget: outstanding reservations plus settled costs."""
        return math.fsum((self.reserved, self.settled))


@dataclass(frozen=True, slots=True)
class Snapshot:
    id: int
    experiment: str
    upto_reading_id: int  # the model includes every reading with id <= this
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    created_at: float


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    id: int
    experiment: str | None
    topic: str
    reason: str
    detail: str
    payload: bytes = field(repr=False)
    payload_size: int  # of the original payload; `payload` may be truncated
    at: float


ROUND_COLUMNS: Final = (
    "experiment, round, action_id, intervention, target_set, cost, kind, status, attempt, "
    "reason, proposed_at, status_at, applied, expires_at"
)
READING_COLUMNS: Final = (
    "id, experiment, round, node, value, seq, device_id, received_at, measured_at, variance, "
    "replications, array_dtype, array_shape, array_data"
)
ORACLE_COLUMNS: Final = "experiment, round, action_id, expected_reward, optimum, at"
LEDGER_COLUMNS: Final = (
    "experiment, round, amount, state, budget_total, reserved_at, settled_at, released_at"
)
DEAD_LETTER_COLUMNS: Final = "id, experiment, topic, reason, detail, payload, payload_size, at"
# The last column, `leased`, compares the expiry with a `now` parameter that comes first.
EXPERIMENT_COLUMNS: Final = (
    "name, state, owner, epoch, lease_expires_at, updated_at, state_at, "
    "(owner IS NOT NULL AND lease_expires_at > ?)"
)


def round_row(row: Sequence[Any]) -> RoundRow:
    """A row of ROUND_COLUMNS as a `RoundRow`, its JSON columns decoded."""
    values = list(row)
    values[3] = json.loads(values[3])
    values[4] = json.loads(values[4])
    values[12] = None if values[12] is None else json.loads(values[12])
    return RoundRow(*values)
