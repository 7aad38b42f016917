"""Snapshots of model state: arrays kept bit for bit as ``.npy`` blobs, metadata as JSON.

Nothing here unpickles: arrays are written and read with ``allow_pickle=False`` (object dtypes
are refused on the way in, and a stored blob that would need unpickling is refused on the way
out). numpy is imported inside the functions that need it, so `import connectors.store` stays
light for processes that never touch a snapshot.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from connectors.store import readings
from connectors.store.errors import StoreError
from connectors.store.rows import Snapshot
from connectors.store.sql import Connection

if TYPE_CHECKING:
    import numpy as np

__all__ = ["NPY_MAGIC", "decode_array", "encode_array", "latest", "save"]

NPY_MAGIC: Final = b"\x93NUMPY"


def save(
    conn: Connection,
    experiment: str,
    upto_reading_id: int,
    blobs: Mapping[str, bytes],
    meta_json: str,
    at: float,
    keep: int,
) -> int:
    """Insert a snapshot of encoded arrays and keep only the experiment's newest `keep`.

    Returns its id. StoreError if `upto_reading_id` is past the newest reading.
    """
    newest = readings.newest_id(conn)
    if upto_reading_id > newest:
        raise StoreError(
            f"snapshot of {experiment!r}: upto_reading_id {upto_reading_id} is past the newest "
            f"reading id {newest}"
        )
    cursor = conn.execute(
        "INSERT INTO snapshots (experiment, upto_reading_id, meta, created_at) VALUES (?, ?, ?, ?)",
        (experiment, upto_reading_id, meta_json, at),
    )
    snapshot_id = int(cursor.lastrowid or 0)
    conn.executemany(
        "INSERT INTO snapshot_arrays (snapshot_id, name, npy) VALUES (?, ?, ?)",
        [(snapshot_id, name, blob) for name, blob in blobs.items()],
    )
    conn.execute(  # the arrays of the dropped snapshots go with them (ON DELETE CASCADE)
        "DELETE FROM snapshots WHERE experiment = ? AND id NOT IN "
        "(SELECT id FROM snapshots WHERE experiment = ? ORDER BY id DESC LIMIT ?)",
        (experiment, experiment, keep),
    )
    return snapshot_id


def latest(conn: Connection, experiment: str) -> Snapshot | None:
    """The experiment's newest snapshot with its arrays decoded, or None.

    Run it in one consistent read: it reads two tables.
    """
    row = conn.execute(
        "SELECT id, upto_reading_id, meta, created_at FROM snapshots "
        "WHERE experiment = ? ORDER BY id DESC LIMIT 1",
        (experiment,),
    ).fetchone()
    if row is None:
        return None
    blobs = conn.execute(
        "SELECT name, npy FROM snapshot_arrays WHERE snapshot_id = ? ORDER BY name",
        (row[0],),
    ).fetchall()
    arrays = {name: decode_array(experiment, name, blob) for name, blob in blobs}
    return Snapshot(row[0], experiment, row[1], arrays, json.loads(row[2]), row[3])


def encode_array(experiment: str, name: str, value: object) -> bytes:
    """The array as ``.npy`` bytes; StoreError for an object dtype (it would need pickle)."""
    import numpy as np

    array = np.asarray(value)
    if array.dtype.hasobject:
        raise StoreError(
            f"snapshot array {name!r} of experiment {experiment!r} has dtype {array.dtype} "
            "holding Python objects; only plain numeric arrays are stored (no pickle)"
        )
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def decode_array(experiment: str, name: str, blob: bytes) -> np.ndarray:
    """A writeable array from ``.npy`` bytes; StoreError for anything that is not plain
    ``.npy`` data (it is never unpickled)."""
    import numpy as np

    if not bytes(blob[: len(NPY_MAGIC)]) == NPY_MAGIC:
        raise StoreError(f"snapshot array {name!r} of experiment {experiment!r} is not .npy data")
    try:
        array = np.lib.format.read_array(io.BytesIO(blob), allow_pickle=False)
    except ValueError as exc:  # an object array: numpy refuses to unpickle it
        raise StoreError(
            f"snapshot array {name!r} of experiment {experiment!r} cannot be loaded without "
            f"unpickling, refused: {exc}"
        ) from exc
    return array if array.flags.writeable else array.copy(order="K")
