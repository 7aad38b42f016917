"""Visited states on the wire (issue 13): a version 4 reading carries the reward's `value` and
the states [T, agents, obs] the controller visited, in `connectors.arrays`' encoding."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from connectors.arrays import ArrayPayload
from connectors.schemas import DecodeError, Reading, decode, encode

_SIDES = st.integers(1, 8)
_STATES = st.sampled_from([np.float32, np.float64]).flatmap(
    lambda dtype: hnp.arrays(
        dtype,
        st.tuples(_SIDES, _SIDES, _SIDES),
        elements=st.floats(allow_nan=False, allow_infinity=False, width=32),
    )
)


def _reading(states: np.ndarray, value: float = -3.5) -> Reading:
    dtype = "float32" if states.dtype == np.float32 else "float64"
    return Reading(
        experiment="hom",
        round=4,
        node="return",
        value=value,
        seq=4,
        device_id="d0",
        at=1.0,
        states=ArrayPayload.from_numpy(states, dtype),
    )


@settings(max_examples=60, deadline=None)
@given(states=_STATES, value=st.floats(-1e6, 1e6))
def test_states_survive_encode_and_decode_bit_for_bit(states: np.ndarray, value: float) -> None:
    payload = encode(_reading(states, value))
    document = json.loads(payload)
    assert document["version"] == 4 and document["value"] == value
    back = decode(payload)
    assert isinstance(back, Reading) and back.value == value and back.states is not None
    got = back.states.to_numpy()
    assert got.shape == states.shape and got.dtype == states.dtype.newbyteorder("<")
    assert got.tobytes() == states.astype(states.dtype.newbyteorder("<")).tobytes()


def test_plain_readings_stay_in_their_versions() -> None:
    plain = Reading(experiment="e", round=0, node="y", value=1.0, seq=0, device_id="d", at=1.0)
    assert json.loads(encode(plain))["version"] == 1


def _document(**change: object) -> bytes:
    document = json.loads(encode(_reading(np.zeros((2, 3, 4)))))
    document.update(change)
    return json.dumps({k: v for k, v in document.items() if v is not None}).encode()


@pytest.mark.parametrize(
    "change",
    [
        {"version": 3},  # states are not a field of version 3
        {"version": 1},
        {"states": None},  # version 4 carries states
        {"value": None},  # and a value
        {"states": {"dtype": "float64", "shape": [3], "data": "A" * 32}},  # not [T, agents, obs]
        {"states": {"dtype": "float64", "shape": [1, 1, 2], "data": "AAAAAAAA+H8AAAAAAAAAAA=="}},
        {"variance": 0.1},
    ],
)
def test_malformed_states_are_refused_as_invalid(change: dict) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(_document(**change))
    assert caught.value.reason == "invalid"
