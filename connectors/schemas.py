"""Message schemas of the cbo-agent MQTT protocol and their JSON codec.

Every payload is a compact JSON object whose first two fields name its schema and version:
``{"schema": "cbo.reading", "version": 1, ...}``. The models below hold the other fields; the
codec adds and checks the envelope. A schema may be read in several versions (`READS`): an action
is written as version 2 when it carries `expires_at` and as version 1 otherwise, and both are
read. `decode` turns any bytes into a validated message or a
`DecodeError` whose `reason` is a short, stable code fit for a metric label and a dead letter.

Models are strict and closed: no type coercion ("3" is not a round), no unknown fields (typos
surface), no non-finite numbers (NaN, Infinity, or a literal like 1e999 that overflows).
"""

from __future__ import annotations

import base64
import json
import math
import struct
import time
import uuid
from collections.abc import Sequence
from functools import partial
from typing import (
    Annotated,
    Any,
    ClassVar,
    Final,
    Literal,
    Self,
    TypeAlias,
    TypeVar,
    get_args,
    overload,
)

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from connectors.arrays import ArrayPayload
from connectors.topics import validate_experiment_id, validate_identifier

SCHEMA_VERSION: Final = 1
DEFAULT_MAX_PAYLOAD_BYTES: Final = 65_536
DEADLETTER_TEXT_LIMIT: Final = 1024
MAX_SEQUENCE: Final = 2**63 - 1  # fits a signed 64-bit column in the durable store

DecodeReason = Literal[
    "oversized",
    "malformed_json",
    "not_an_object",
    "unknown_schema",
    "unsupported_version",
    "wrong_schema",
    "invalid",
]
DECODE_REASONS: Final[tuple[DecodeReason, ...]] = get_args(DecodeReason)


class DecodeError(Exception):
    """A payload that is not a valid message; `reason` is one of DECODE_REASONS."""

    def __init__(self, reason: DecodeReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: DecodeReason = reason
        self.detail = detail


class EncodeError(ValueError):
    """A message that would be rejected by receivers (today: larger than their size limit)."""


def _require_utf8(text: str) -> str:
    # JSON escapes like "\ud800" decode to lone surrogates, which cannot be re-encoded as UTF-8:
    # reject them here rather than fail later when the agent logs, stores or republishes them.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("string holds a lone surrogate (not valid Unicode)") from None
    return text


ExperimentId = Annotated[str, AfterValidator(validate_experiment_id)]
DeviceId = Annotated[str, AfterValidator(partial(validate_identifier, what="device id"))]
AgentId = Annotated[str, AfterValidator(partial(validate_identifier, what="agent id"))]
ActionId = Annotated[str, AfterValidator(partial(validate_identifier, what="action id"))]
# Node and intervention names come from experiment specs; allow any printable text.
Name = Annotated[
    str,
    Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$"),
    AfterValidator(_require_utf8),
]
Text = Annotated[str, Field(max_length=DEADLETTER_TEXT_LIMIT), AfterValidator(_require_utf8)]
ReasonCode = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
Round = Annotated[int, Field(ge=0, le=MAX_SEQUENCE)]
SequenceNumber = Annotated[int, Field(ge=0, le=MAX_SEQUENCE)]
Epoch = Annotated[int, Field(ge=0, le=MAX_SEQUENCE)]  # a lease epoch (connectors.store.leases)
UnixTime = Annotated[float, Field(ge=0)]


class MessageModel(BaseModel):
    """Base of every message: strict, closed, immutable, finite."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)

    SCHEMA: ClassVar[str]
    VERSION: ClassVar[int] = SCHEMA_VERSION  # the newest version, the one this code writes
    READS: ClassVar[tuple[int, ...]] = (SCHEMA_VERSION,)  # every version `decode` accepts

    def wire(self) -> tuple[int, dict[str, Any]]:
        """The version this message is written in and its fields as JSON values."""
        return self.VERSION, self.model_dump(mode="json")

    @classmethod
    def check_version_fields(cls, version: int, fields: dict[str, Any]) -> None:
        """Raise ValueError if `fields` do not belong to `version` (for schemas read in several)."""


class Action(MessageModel):
    """agent → actuators: the intervention of one round.

    A re-publish (after a crash or a lost ack) keeps `action_id` and bumps `attempt`.
    `expires_at` is when the agent gives up on the action and releases its budget: an actuator
    must not apply it from then on (it acks "rejected" with reason "expired"). A re-publish may
    carry a later `expires_at` (an agent restart gives it a new window), never an earlier one.
    Version 2 added `expires_at`; an action without one is written (and read) as version 1.
    Version 3 added `epoch`, the lease epoch of the replica that published it (a fleet's
    fencing token): a device drops an action whose epoch is older than one it has seen for the
    experiment. An action with an epoch has an expiry too; one without an epoch is written as
    version 2 (or 1).

    Version 4 adds `vectors`: a parameter vector θ (a spec's `parameters`) travels packed, as
    one base64 string of little-endian floats with its dtype and shape (`PackedVector`), instead
    of D entries of `intervention`. In memory the action is the same either way: `intervention`
    holds every coordinate `{name}.{i}`, and `vectors` names the vectors packed on the wire.
    A version 4 action carries `expires_at`, and `epoch` where a fleet replica sent it.
    """

    SCHEMA: ClassVar[str] = "cbo.action"
    VERSION: ClassVar[int] = 4
    READS: ClassVar[tuple[int, ...]] = (1, 2, 3, 4)

    experiment: ExperimentId
    round: Round
    action_id: ActionId
    intervention: dict[Name, float]
    kind: Literal["soft", "hard"]
    issued_at: UnixTime
    attempt: int = Field(ge=1)
    expires_at: UnixTime | None = None
    epoch: Epoch | None = None
    vectors: tuple[Name, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _unpack_vectors(cls, data: Any) -> Any:
        """On the wire `vectors` maps names to packed vectors: spread them into coordinates."""
        if not isinstance(data, dict) or not isinstance(data.get("vectors"), dict):
            return data
        intervention = data.get("intervention")
        if not isinstance(intervention, dict):
            return data  # the field's own validation reports it
        merged = dict(intervention)
        for name, packed in data["vectors"].items():
            values = unpack_vector(packed, str(name))
            for i, value in enumerate(values):
                key = f"{name}.{i}"
                if key in merged:
                    raise ValueError(f"vectors.{name}: coordinate {key} also in intervention")
                merged[key] = value
        return {**data, "intervention": merged, "vectors": tuple(data["vectors"])}

    @model_validator(mode="after")
    def _check_epoch_and_vectors(self) -> Self:
        if self.epoch is not None and self.expires_at is None:
            raise ValueError("epoch: an action with a lease epoch needs expires_at (version 3)")
        for name in self.vectors:
            if f"{name}.0" not in self.intervention:
                raise ValueError(f"vectors: {name!r} has no coordinates in intervention")
        return self

    def wire(self) -> tuple[int, dict[str, Any]]:
        fields = self.model_dump(mode="json")
        del fields["vectors"]
        if self.vectors:
            packed = {}
            for name in self.vectors:
                values = []
                while f"{name}.{len(values)}" in fields["intervention"]:
                    values.append(fields["intervention"].pop(f"{name}.{len(values)}"))
                packed[name] = pack_vector(values)
            fields["vectors"] = packed
            if self.epoch is None:
                del fields["epoch"]
            return 4, fields
        if self.epoch is not None:
            return 3, fields
        del fields["epoch"]
        if self.expires_at is None:
            del fields["expires_at"]
            return 1, fields
        return 2, fields

    @classmethod
    def check_version_fields(cls, version: int, fields: dict[str, Any]) -> None:
        if version == 1 and "expires_at" in fields:
            raise ValueError("expires_at: not a field of version 1 (send version 2)")
        if version >= 2 and fields.get("expires_at") is None:
            raise ValueError(f"expires_at: required in version {version}")
        if version < 3 and "epoch" in fields:
            raise ValueError(f"epoch: not a field of version {version} (send version 3)")
        if version == 3 and fields.get("epoch") is None:
            raise ValueError("epoch: required in version 3")
        if version < 4 and "vectors" in fields:
            raise ValueError(f"vectors: not a field of version {version} (send version 4)")
        if version == 4 and not isinstance(fields.get("vectors"), dict):
            raise ValueError("vectors: version 4 carries packed vectors (an object)")

    def with_epoch(self, epoch: int) -> Action:
        """This action as a fleet replica holding the experiment's lease at `epoch` sends it."""
        return self.model_copy(update={"epoch": epoch})

    def expired(self, now: float) -> bool:
        """Whether an actuator must refuse the action at `now` (unix seconds)."""
        return self.expires_at is not None and now >= self.expires_at

    @classmethod
    def issue(
        cls,
        experiment: str,
        round: int,
        intervention: dict[str, float],
        kind: Literal["soft", "hard"] = "hard",
        *,
        at: float | None = None,
        expires_at: float | None = None,
        vectors: tuple[str, ...] = (),
    ) -> Action:
        """First attempt of a new action, with a fresh uuid4 `action_id`."""
        return cls(
            experiment=experiment,
            round=round,
            action_id=uuid.uuid4().hex,
            intervention=intervention,
            kind=kind,
            issued_at=time.time() if at is None else at,
            attempt=1,
            expires_at=expires_at,
            vectors=vectors,
        )

    def next_attempt(self, *, at: float | None = None) -> Action:
        """The same action published again: same `action_id`, `attempt` + 1, new `issued_at`
        (and the same `expires_at`)."""
        issued_at = time.time() if at is None else at
        return self.model_copy(update={"attempt": self.attempt + 1, "issued_at": issued_at})


MAX_VECTOR_LENGTH: Final = 1000
_VECTOR_DTYPES: Final = {"float64": "d", "float32": "f"}  # struct codes, little-endian


def pack_vector(values: Sequence[float], dtype: str = "float64") -> dict[str, Any]:
    """A vector on the wire: `{"dtype": "float64", "shape": [D], "data": base64(LE bytes)}`."""
    raw = struct.pack(f"<{len(values)}{_VECTOR_DTYPES[dtype]}", *map(float, values))
    return {"dtype": dtype, "shape": [len(values)], "data": base64.b64encode(raw).decode("ascii")}


def unpack_vector(packed: Any, name: str = "vector") -> list[float]:
    """The floats of a packed vector (`pack_vector`); ValueError naming what is wrong."""
    if not isinstance(packed, dict) or set(packed) != {"dtype", "shape", "data"}:
        raise ValueError(f"vectors.{name}: expected an object with dtype, shape and data")
    dtype, shape, data = packed["dtype"], packed["shape"], packed["data"]
    if dtype not in _VECTOR_DTYPES:
        raise ValueError(f"vectors.{name}.dtype: {dtype!r}, expected float64 or float32")
    if (
        not isinstance(shape, list)
        or len(shape) != 1
        or type(shape[0]) is not int
        or not 1 <= shape[0] <= MAX_VECTOR_LENGTH
    ):
        raise ValueError(f"vectors.{name}.shape: expected [D] with 1 <= D <= {MAX_VECTOR_LENGTH}")
    if not isinstance(data, str):
        raise ValueError(f"vectors.{name}.data: expected a base64 string")
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ValueError(f"vectors.{name}.data: not valid base64") from None
    code = f"<{shape[0]}{_VECTOR_DTYPES[dtype]}"
    if len(raw) != struct.calcsize(code):
        raise ValueError(
            f"vectors.{name}.data: {len(raw)} bytes, expected {struct.calcsize(code)} for {shape}"
        )
    values = list(struct.unpack(code, raw))
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"vectors.{name}.data: values must be finite")
    return values


class Ack(MessageModel):
    """actuators → agent: what one device did with an action."""

    SCHEMA: ClassVar[str] = "cbo.ack"

    experiment: ExperimentId
    round: Round
    action_id: ActionId
    device_id: DeviceId
    status: Literal["applied", "rejected"]
    reason: Text | None = None
    applied: dict[Name, float]
    at: UnixTime


class Reading(MessageModel):
    """sensors → agent: one node value (or reward component) observed in one round.

    `seq` counts per device and node, so a QoS 1 redelivery is recognised as a duplicate.
    A multi-fidelity trial's reading is the mean of q' replications: `replications` says q'
    (fewer than the action's q when some did not run) and `variance` the variance of that mean
    (the replicates' sample variance / q'). Version 2 added both; a reading without them is
    written (and read) as version 1. Version 3 carries an `array` (a node with a `shape` in the
    spec: a sensor vector or a field, `connectors.arrays`) instead of `value`. Version 4 is a
    scalar reading that also carries `states`: the states (T, agents, obs) the device's
    controller visited in the round's episode (paper 000's surrogate Hessian; the encoding of
    `connectors.arrays`), sent with the reward reading of a parameter-vector round.
    """

    SCHEMA: ClassVar[str] = "cbo.reading"
    VERSION: ClassVar[int] = 4
    READS: ClassVar[tuple[int, ...]] = (1, 2, 3, 4)

    experiment: ExperimentId
    round: Round
    node: Name
    value: float | None = None
    seq: SequenceNumber
    device_id: DeviceId
    at: UnixTime
    variance: Annotated[float, Field(ge=0)] | None = None
    replications: Annotated[int, Field(ge=1, le=MAX_SEQUENCE)] | None = None
    array: ArrayPayload | None = None
    states: ArrayPayload | None = None

    @model_validator(mode="after")
    def _one_value(self) -> Reading:
        if (self.value is None) == (self.array is None):
            raise ValueError("a reading carries exactly one of value and array")
        if self.array is not None and (self.variance is not None or self.replications):
            raise ValueError("an array reading carries no variance or replications")
        if self.states is not None:
            if self.array is not None or self.variance is not None or self.replications:
                raise ValueError("states ride on a plain scalar reading (value only)")
            if len(self.states.shape) != 3:
                raise ValueError(f"states.shape: {self.states.shape}, expected [T, agents, obs]")
        return self

    def wire(self) -> tuple[int, dict[str, Any]]:
        fields = self.model_dump(mode="json")
        if self.states is not None:
            return 4, {k: v for k, v in fields.items() if v is not None}
        del fields["states"]
        if self.array is not None:
            return 3, {k: v for k, v in fields.items() if v is not None}
        del fields["array"]
        if self.variance is None and self.replications is None:
            del fields["variance"], fields["replications"]
            return 1, fields
        return 2, {k: v for k, v in fields.items() if v is not None}

    @classmethod
    def check_version_fields(cls, version: int, fields: dict[str, Any]) -> None:
        if version == 4:
            if "states" not in fields or fields.get("value") is None:
                raise ValueError("version 4 carries a value and its states")
            return
        if "states" in fields:
            raise ValueError(f"states: not a field of version {version} (send version 4)")
        if version == 3:
            if "array" not in fields or "value" in fields:
                raise ValueError("version 3 carries an array and no value")
            return
        if "array" in fields:
            raise ValueError("array: not a field of version 1 or 2 (send version 3)")
        if fields.get("value") is None:
            raise ValueError("value: required in versions 1 and 2")
        extra = sorted({"variance", "replications"} & set(fields))
        if version == 1 and extra:
            raise ValueError(f"{extra[0]}: not a field of version 1 (send version 2)")
        if version == 2 and not extra:
            raise ValueError("version 2 carries variance or replications")

    @property
    def is_array(self) -> bool:
        return self.array is not None


class Oracle(MessageModel):
    """simulators → agent: the noise-free E[y | action] and the optimum, for true regret."""

    SCHEMA: ClassVar[str] = "cbo.oracle"

    experiment: ExperimentId
    round: Round
    action_id: ActionId
    expected_reward: float
    optimum: float
    device_id: DeviceId
    at: UnixTime


class Status(MessageModel):
    """agent → anyone: the retained presence of one agent (the last will says "offline")."""

    SCHEMA: ClassVar[str] = "cbo.status"

    agent_id: AgentId
    state: Literal["online", "offline"]
    experiments: list[ExperimentId]
    software_version: Annotated[str, Field(min_length=1, max_length=64)]
    at: UnixTime


class Recommended(MessageModel):
    """agent → operators: the setting the experiment's policy would run if it stopped now.

    Retained on ``{prefix}/{experiment}/recommendation``, so whoever subscribes gets the latest;
    `final` once the experiment has finished (its budget or its rounds spent): then it is what
    the experiment leaves behind. `values` is the setting by action name (a multi-fidelity
    spec: θ without τ and q); `predicted` the model's predicted reward of it at `fidelity`
    (τ_max; null without fidelities); `trials` how many rounds' feedback the model held.
    """

    SCHEMA: ClassVar[str] = "cbo.recommendation"

    experiment: ExperimentId
    values: dict[Name, float]
    predicted: float
    fidelity: float | None
    trials: int = Field(ge=0)
    final: bool
    at: UnixTime


class ControlRequest(MessageModel):
    """operators → fleet replicas: one control-plane operation (`agent.control`).

    `verb` is submit (with `spec`, the experiment spec as a JSON object), list, or pause,
    resume, stop, status (with `experiment`). Replicas ignore a request older than
    `CONTROL_MAX_AGE_S` by their clock, so one queued for a restarted replica is not replayed
    after later changes. The reply goes to ``{prefix}/control/reply/{request_id}``.
    """

    SCHEMA: ClassVar[str] = "cbo.control"

    request_id: ActionId
    verb: Literal["submit", "list", "pause", "resume", "stop", "status"]
    experiment: ExperimentId | None = None
    spec: dict[str, Any] | None = None
    at: UnixTime


class ControlReply(MessageModel):
    """fleet replicas → operators: what one replica did with a control request. Every replica
    answers (the operations are idempotent: a second `pause` says ``changed: false``); take the
    first reply. `ok` false: `error` says why in one line, and nothing was changed."""

    SCHEMA: ClassVar[str] = "cbo.control_reply"

    request_id: ActionId
    replica: AgentId
    ok: bool
    error: Text | None = None
    result: Any = None
    at: UnixTime


CONTROL_MAX_AGE_S: Final = 30.0


class DeadLetter(MessageModel):
    """agent → operators: one rejected input, the reason code and the evidence."""

    SCHEMA: ClassVar[str] = "cbo.deadletter"

    topic: Text
    reason: ReasonCode
    detail: Text
    payload: Text
    at: UnixTime

    @classmethod
    def for_rejected(
        cls, topic: str, payload: bytes, reason: str, detail: str, *, at: float | None = None
    ) -> DeadLetter:
        """Dead letter for `payload`, decoded leniently and truncated to fit the limits."""
        return cls(
            topic=_utf8_prefix(topic),
            reason=reason,
            detail=_utf8_prefix(detail),
            payload=bytes(payload).decode("utf-8", errors="replace")[:DEADLETTER_TEXT_LIMIT],
            at=time.time() if at is None else at,
        )


def _utf8_prefix(text: str) -> str:
    safe = text.encode("utf-8", errors="replace").decode("utf-8")
    return safe[:DEADLETTER_TEXT_LIMIT]


Message: TypeAlias = (
    Action
    | Ack
    | Reading
    | Oracle
    | Status
    | DeadLetter
    | Recommended
    | ControlRequest
    | ControlReply
)
MESSAGE_TYPES: Final[dict[str, type[MessageModel]]] = {
    model.SCHEMA: model
    for model in (
        Action,
        Ack,
        Reading,
        Oracle,
        Status,
        DeadLetter,
        Recommended,
        ControlRequest,
        ControlReply,
    )
}
M = TypeVar("M", bound=MessageModel)


def encode(message: MessageModel, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
    """Compact UTF-8 JSON with the schema envelope; EncodeError if over `max_bytes`."""
    version, fields = message.wire()
    document: dict[str, Any] = {"schema": message.SCHEMA, "version": version}
    document.update(fields)
    payload = json.dumps(
        document, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
    if len(payload) > max_bytes:
        raise EncodeError(f"{message.SCHEMA} payload of {len(payload)} bytes > {max_bytes}")
    return payload


@overload
def decode(
    payload: bytes, expected: None = None, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> Message: ...


@overload
def decode(
    payload: bytes, expected: type[M], *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> M: ...


def decode(
    payload: bytes,
    expected: type[MessageModel] | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> MessageModel:
    """Validate `payload` into a message (of type `expected`, if given).

    Raises DecodeError, and nothing else, for any input bytes. The size limit is checked before
    any parsing, so an oversized payload costs nothing but its length.
    """
    if len(payload) > max_bytes:
        raise DecodeError("oversized", f"{len(payload)} bytes > limit of {max_bytes}")
    document = _parse_json(bytes(payload))
    if not isinstance(document, dict):
        raise DecodeError("not_an_object", f"top-level JSON value is {_json_type(document)}")
    model = _model_for(document)
    version = _check_version(document, model)
    fields = {key: value for key, value in document.items() if key not in ("schema", "version")}
    try:
        model.check_version_fields(version, fields)
    except ValueError as error:
        raise DecodeError("invalid", f"{model.SCHEMA} version {version}: {error}") from None
    try:
        message = model.model_validate(fields)
    except ValidationError as error:
        raise DecodeError("invalid", f"{model.SCHEMA}: {_summarize(error)}") from None
    if expected is not None and not isinstance(message, expected):
        raise DecodeError("wrong_schema", f"got {model.SCHEMA}, expected {expected.SCHEMA}")
    return message


class _NonFiniteNumber(Exception):
    """Raised from inside json.loads; kept apart from ValueError (which means malformed)."""


class _DuplicateKey(ValueError):
    pass


def _reject_non_finite(literal: str) -> float:
    raise _NonFiniteNumber(literal)


def _object_without_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Duplicate keys are legal-ish JSON, but which one wins differs between parsers: refuse.
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _DuplicateKey(f"duplicate key {duplicate!r}")
    return document


def _parse_json(payload: bytes) -> Any:
    try:
        return json.loads(
            payload,
            parse_constant=_reject_non_finite,
            object_pairs_hook=_object_without_duplicate_keys,
        )
    except _NonFiniteNumber as error:
        raise DecodeError("invalid", f"non-finite number literal {error}") from None
    except RecursionError:
        raise DecodeError("malformed_json", "nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, int digit limit, dupes
        raise DecodeError("malformed_json", _shorten(str(error))) from None


def _model_for(document: dict[str, Any]) -> type[MessageModel]:
    schema = document.get("schema")
    if schema is None:
        raise DecodeError("unknown_schema", "missing 'schema' field")
    if not isinstance(schema, str) or schema not in MESSAGE_TYPES:
        raise DecodeError("unknown_schema", f"schema {_shorten(repr(schema))} is not known")
    return MESSAGE_TYPES[schema]


def _check_version(document: dict[str, Any], model: type[MessageModel]) -> int:
    if "version" not in document:
        raise DecodeError("unsupported_version", f"{model.SCHEMA}: missing 'version' field")
    version = document["version"]
    # `type(...) is int` because True == 1 in Python and a bool is no version number.
    if type(version) is not int or version not in model.READS:
        supported = ", ".join(map(str, model.READS))
        raise DecodeError(
            "unsupported_version",
            f"{model.SCHEMA}: version {_shorten(repr(version))}, supported {supported}",
        )
    return version


def _summarize(error: ValidationError, limit: int = 3) -> str:
    problems = [
        f"{'.'.join(str(part) for part in problem['loc']) or '<root>'}: {problem['msg']}"
        for problem in error.errors(include_url=False, include_input=False)[:limit]
    ]
    more = error.error_count() - len(problems)
    if more > 0:
        problems.append(f"and {more} more")
    return _shorten("; ".join(problems))


def _json_type(value: Any) -> str:
    names: dict[type, str] = {list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
