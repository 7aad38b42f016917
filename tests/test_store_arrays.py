"""Array readings through the durable store (SQLite and PostgreSQL) and the export."""

from __future__ import annotations

import csv
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from connectors.store import Store, StoreError

EXP = "fields"


@pytest.fixture
def store(store_target: str) -> Iterator[Store]:
    with Store(store_target) as opened:
        opened.upsert_experiment(EXP, {"nodes": ["field"]})
        opened.add_round(EXP, 0, "a0", {"M": 10.0}, ["M"], 1.0, "soft", 0.0)
        yield opened


def arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.normal(size=(3, 4)).astype(np.float64),
        rng.normal(size=(2, 4, 4)).astype(np.float32),
        np.array([1e-300, -0.0, 1.5e300]),  # extremes survive bit for bit
    ]


def test_array_readings_round_trip_through_the_store(store: Store) -> None:
    for seq, array in enumerate(arrays()):
        assert store.add_reading(EXP, 0, "field", float(array.mean()), seq, "d", 1.0, array=array)
    assert not store.add_reading(EXP, 0, "field", 0.0, 0, "d", 2.0, array=arrays()[0])  # dupe
    store.add_reading(EXP, 0, "score", -1.5, 0, "d", 1.0)
    rows = store.readings(EXP)
    for row, array in zip(rows, arrays(), strict=False):
        back = row.array()
        assert back.dtype == array.dtype.newbyteorder("<") and back.shape == array.shape
        assert back.tobytes() == array.astype(array.dtype.newbyteorder("<")).tobytes()
        assert row.value == pytest.approx(float(array.mean()))
    assert rows[-1].array() is None and not rows[-1].is_array


def test_bad_arrays_are_refused_by_the_store(store: Store) -> None:
    with pytest.raises(StoreError, match="finite"):
        store.add_reading(EXP, 0, "f", 0.0, 0, "d", 1.0, array=np.array([1.0, np.nan]))
    with pytest.raises(StoreError, match="float32 or float64"):
        store.add_reading(EXP, 0, "f", 0.0, 0, "d", 1.0, array=np.array([1, 2]))
    assert store.readings(EXP) == []


def test_arrays_are_exported_as_lists(store: Store, tmp_path: Path) -> None:
    for seq, array in enumerate(arrays()):
        store.add_reading(EXP, 0, "field", float(array.mean()), seq, "d", 1.0, array=array)
    store.add_reading(EXP, 0, "score", -1.5, 0, "d", 1.0)
    paths = store.export(EXP, tmp_path / "csv", "csv")
    readings = next(p for p in paths if p.name.endswith("_readings.csv"))
    with readings.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row, array in zip(rows, arrays(), strict=False):
        assert json.loads(row["array_shape"]) == list(array.shape)
        values = np.array(json.loads(row["array"]))
        assert values.tolist() == array.astype(np.float64).reshape(-1).tolist()
    assert rows[-1]["array"] == "" and rows[-1]["array_shape"] == ""
    if importlib.util.find_spec("pyarrow") is None:
        pytest.skip("pyarrow is not installed")
    import pyarrow.parquet as pq

    paths = store.export(EXP, tmp_path / "pq", "parquet")
    table = pq.read_table(next(p for p in paths if p.name.endswith("_readings.parquet")))
    import pyarrow as pa

    kind = table.schema.field("array").type
    assert pa.types.is_list(kind) and kind.value_type == pa.float64()
    column = table.column("array").to_pylist()
    for listed, array in zip(column, arrays(), strict=False):
        assert listed == array.astype(np.float64).reshape(-1).tolist()
    assert column[-1] is None
