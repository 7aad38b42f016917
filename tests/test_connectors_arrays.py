"""Property tests of the array encoding (connectors.arrays) and array readings (cbo.reading v3)."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from connectors.arrays import MAX_ARRAY_ELEMENTS, ArrayPayload
from connectors.schemas import DecodeError, Reading, decode, encode

dtypes = st.sampled_from(["float32", "float64"])
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=12)


@st.composite
def finite_arrays(draw: st.DrawFn) -> tuple[np.ndarray, str]:
    dtype = draw(dtypes)
    array = draw(
        hnp.arrays(
            np.dtype(dtype),
            draw(shapes),
            elements=st.floats(allow_nan=False, allow_infinity=False, width=32),
        )
    )
    return array, dtype


def reading(array: ArrayPayload | None = None, value: float | None = None) -> Reading:
    return Reading(
        experiment="e",
        round=3,
        node="field",
        value=value,
        seq=1,
        device_id="d",
        at=1.0,
        array=array,
    )


@settings(max_examples=200, deadline=None)
@given(finite_arrays())
def test_an_array_round_trips_bit_for_bit_through_a_reading(drawn: tuple[np.ndarray, str]) -> None:
    array, dtype = drawn
    message = reading(ArrayPayload.from_numpy(array, dtype))
    payload = encode(message)
    document = json.loads(payload)
    assert document["version"] == 3 and "value" not in document
    back = decode(payload, Reading)
    assert back == message
    out = back.array.to_numpy()
    assert out.shape == array.shape and out.dtype == np.dtype(dtype).newbyteorder("<")
    assert out.tobytes() == np.ascontiguousarray(array, dtype=f"<{out.dtype.char}").tobytes()
    # little-endian on the wire whatever the host: the bytes are the documented ones
    raw = base64.b64decode(document["array"]["data"])
    assert raw == array.astype(np.dtype(dtype).newbyteorder("<")).tobytes()


@settings(max_examples=100, deadline=None)
@given(finite_arrays(), st.integers(min_value=0), st.sampled_from([np.nan, np.inf, -np.inf]))
def test_a_non_finite_element_anywhere_is_rejected(
    drawn: tuple[np.ndarray, str], where: int, bad: float
) -> None:
    array, dtype = drawn
    array = array.copy()
    array.flat[where % array.size] = bad
    payload = json.dumps(
        {
            "schema": "cbo.reading",
            "version": 3,
            "experiment": "e",
            "round": 0,
            "node": "f",
            "seq": 0,
            "device_id": "d",
            "at": 0.0,
            "array": {
                "dtype": dtype,
                "shape": list(array.shape),
                "data": base64.b64encode(array.astype(f"<{array.dtype.char}").tobytes()).decode(),
            },
        }
    ).encode()
    with pytest.raises(DecodeError) as caught:
        decode(payload)
    assert caught.value.reason == "invalid" and "non-finite" in caught.value.detail


@settings(max_examples=100, deadline=None)
@given(finite_arrays(), st.integers(min_value=1, max_value=7))
def test_bytes_that_do_not_fill_the_shape_are_rejected(
    drawn: tuple[np.ndarray, str], cut: int
) -> None:
    array, dtype = drawn
    good = ArrayPayload.from_numpy(array, dtype)
    raw = base64.b64decode(good.data)
    for data in (raw[:-cut], raw + b"\0" * cut):
        with pytest.raises(ValueError, match="bytes"):
            ArrayPayload(dtype=dtype, shape=good.shape, data=base64.b64encode(data).decode())


@given(st.text(alphabet="!@#$%^&*()~`", min_size=1, max_size=20))
def test_data_outside_the_base64_alphabet_is_rejected(data: str) -> None:
    with pytest.raises(ValueError, match="base64"):
        ArrayPayload(dtype="float32", shape=[1], data=data)


def test_oversized_arrays_and_bad_shapes_are_refused() -> None:
    side = math.isqrt(MAX_ARRAY_ELEMENTS) + 1
    with pytest.raises(ValueError, match="elements"):
        ArrayPayload(dtype="float32", shape=[side, side], data="")
    for shape in ([], [1, 1, 1, 1], [0], [-2]):
        with pytest.raises(ValueError):
            ArrayPayload(dtype="float32", shape=shape, data="")
    with pytest.raises(ValueError):
        ArrayPayload(dtype="float16", shape=[1], data="AAA=")  # type: ignore[arg-type]
    # the largest array float32 allows fits the default payload limit; float64 of it does not
    big = reading(ArrayPayload.from_numpy(np.zeros(MAX_ARRAY_ELEMENTS), "float32"))
    assert decode(encode(big)) == big
    huge = reading(ArrayPayload.from_numpy(np.zeros(MAX_ARRAY_ELEMENTS), "float64"))
    with pytest.raises(Exception, match="payload of"):
        encode(huge)


def test_a_reading_has_exactly_one_of_value_and_array() -> None:
    payload = ArrayPayload.from_numpy(np.ones(3))
    with pytest.raises(ValueError, match="exactly one"):
        reading(payload, 1.0)
    with pytest.raises(ValueError, match="exactly one"):
        reading()
    scalar = json.loads(encode(reading(value=2.0)))
    assert scalar["version"] == 1 and "array" not in scalar
    with pytest.raises(DecodeError, match="send version 3"):
        decode(json.dumps({**scalar, "array": payload.model_dump()}).encode())
