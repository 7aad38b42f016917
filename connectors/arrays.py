"""The wire encoding of an array reading: base64 of little-endian float32/float64, with its shape.

A field of 4,096 values as JSON numbers costs ~80 kB and a parse per number; as base64 of
float32 it costs 21.8 kB and one `frombuffer`. The encoding (docs/protocol.md):

    {"dtype": "float32", "shape": [2, 32, 32], "data": "<base64 of the C-order bytes>"}

`data` holds prod(shape) elements of `dtype`, little-endian, row-major (C order), encoded with
the standard base64 alphabet and padding. Decoding checks everything a receiver relies on: the
alphabet, the byte count against the shape, at most MAX_ARRAY_ELEMENTS elements (so the bytes
fit a default-sized payload), and finite values (NaN and infinities are faults, not data).
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

__all__ = ["ARRAY_DTYPES", "MAX_ARRAY_DIMS", "MAX_ARRAY_ELEMENTS", "ArrayPayload"]

ArrayDtype = Literal["float32", "float64"]
# numpy's little-endian type codes and item sizes; numpy itself is imported where an array is
# decoded, so that `import connectors` stays free of it (tests/test_connectors_imports.py)
ARRAY_DTYPES: Final[dict[str, str]] = {"float32": "<f4", "float64": "<f8"}
_ITEMSIZE: Final[dict[str, int]] = {"float32": 4, "float64": 8}
MAX_ARRAY_DIMS: Final = 3  # [t] or [c, h, w]
# 2 x 64 x 64 = 8,192 float32 are 32 KiB, 43.7 kB as base64: they fit the 64 KiB payload limit
# with room for the envelope; float64 of that size does not (the payload limit refuses it).
MAX_ARRAY_ELEMENTS: Final = 8_192
_MAX_DATA_CHARS: Final = 4 * math.ceil(MAX_ARRAY_ELEMENTS * 8 / 3)


class ArrayPayload(BaseModel):
    """An array as it travels: dtype, shape and base64 of its little-endian C-order bytes.

    Validation decodes the bytes once; `to_numpy()` returns that array (read-only).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    dtype: ArrayDtype
    shape: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_ARRAY_ELEMENTS)]],
        Field(min_length=1, max_length=MAX_ARRAY_DIMS),
    ]
    data: Annotated[str, Field(max_length=_MAX_DATA_CHARS)]

    _array: Any = PrivateAttr()  # the decoded numpy array

    @model_validator(mode="after")
    def _decode(self) -> ArrayPayload:
        count = math.prod(self.shape)
        if count > MAX_ARRAY_ELEMENTS:
            raise ValueError(f"array of {count} elements > limit of {MAX_ARRAY_ELEMENTS}")
        try:
            raw = base64.b64decode(self.data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("data: not standard base64") from None
        need = count * _ITEMSIZE[self.dtype]
        if len(raw) != need:
            raise ValueError(
                f"data: {len(raw)} bytes, shape {self.shape} of {self.dtype} needs {need}"
            )
        import numpy as np

        array = np.frombuffer(raw, dtype=ARRAY_DTYPES[self.dtype]).reshape(self.shape)
        bad = int(np.count_nonzero(~np.isfinite(array)))
        if bad:
            raise ValueError(f"array holds {bad} non-finite element(s) (NaN or infinity)")
        array.flags.writeable = False
        self._array = array
        return self

    def __eq__(self, other: object) -> bool:
        # the decoded array is a cache of `data`: equal fields are equal payloads
        if not isinstance(other, ArrayPayload):
            return NotImplemented
        return (self.dtype, self.shape, self.data) == (other.dtype, other.shape, other.data)

    def __hash__(self) -> int:
        return hash((self.dtype, tuple(self.shape), self.data))

    def to_numpy(self) -> Any:
        """The array, read-only, in its wire dtype (little-endian) and shape."""
        return self._array

    @classmethod
    def from_numpy(cls, array: Any, dtype: ArrayDtype = "float32") -> ArrayPayload:
        """Encode `array` (anything numpy converts) as `dtype`; ValueError as validation does."""
        import numpy as np

        values = np.ascontiguousarray(np.asarray(array, dtype=ARRAY_DTYPES[dtype]))
        data = base64.b64encode(values.tobytes(order="C")).decode("ascii")
        return cls(dtype=dtype, shape=[int(n) for n in values.shape], data=data)
