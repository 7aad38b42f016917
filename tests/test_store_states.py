"""Visited states (issue 13) through the durable store, SQLite and PostgreSQL: what a device's
controller visited in a round survives a reopen bit for bit, once per (round, device)."""

from __future__ import annotations

import numpy as np
import pytest

from connectors.store import Store, StoreError

EXP = "hom"


def test_visited_states_round_trip_through_a_reopened_store(store_target: str) -> None:
    rng = np.random.default_rng(0)
    first = rng.normal(size=(5, 3, 16)).astype(np.float32)
    second = rng.normal(size=(2, 3, 16))  # float64
    with Store(store_target) as store:
        store.upsert_experiment(EXP, {"nodes": ["return"]})
        store.add_round(EXP, 0, "a0", {"theta.0": 0.5}, ["theta.0"], 1.0, "soft", 0.0)
        store.add_round(EXP, 1, "a1", {"theta.0": 0.1}, ["theta.0"], 1.0, "soft", 1.0)
        assert store.add_states(EXP, 0, "d0", first, 2.0)
        assert store.add_states(EXP, 1, "d0", second, 3.0)
        assert not store.add_states(EXP, 0, "d0", second, 4.0)  # a redelivery: the first stays
        with pytest.raises(StoreError, match="unknown round"):
            store.add_states(EXP, 7, "d0", first, 5.0)
        with pytest.raises(StoreError, match="finite"):
            store.add_states(EXP, 1, "d1", np.array([[[np.nan]]]), 5.0)
    with Store(store_target) as reopened:
        rows = reopened.visited_states(EXP)
    assert [(r.round, r.device_id, r.received_at) for r in rows] == [(0, "d0", 2.0), (1, "d0", 3.0)]
    for row, sent in zip(rows, (first, second), strict=True):
        back = row.array()
        assert back.dtype == sent.dtype and back.shape == sent.shape
        assert back.tobytes() == sent.tobytes()
