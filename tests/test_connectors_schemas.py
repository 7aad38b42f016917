"""Property tests of the message codec and the topic layout."""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from paho.mqtt.client import topic_matches_sub

from connectors.schemas import (
    DECODE_REASONS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    MESSAGE_TYPES,
    Ack,
    Action,
    DeadLetter,
    DecodeError,
    EncodeError,
    MessageModel,
    Oracle,
    Reading,
    Recommended,
    Status,
    decode,
    encode,
)
from connectors.signing import DeviceKeys, unwrap
from connectors.topics import (
    DEVICE_TOPIC_KINDS,
    EXPERIMENT_TOPIC_KINDS,
    ForeignTopicError,
    InvalidIdentifierError,
    ParsedTopic,
    Topics,
    validate_experiment_id,
)

# ---------------------------------------------------------------------------------------------
# strategies

identifiers = st.from_regex(r"[A-Za-z0-9_.\-]{1,64}", fullmatch=True)
experiment_ids = identifiers.filter(lambda name: name != "agents")
names = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=128)
finite = st.floats(allow_nan=False, allow_infinity=False)
unix_times = st.floats(min_value=0, max_value=4e9)
counters = st.integers(min_value=0, max_value=2**63 - 1)
value_maps = st.dictionaries(names, finite, max_size=5)

actions = st.builds(
    Action,
    experiment=experiment_ids,
    round=counters,
    action_id=identifiers,
    intervention=value_maps,
    kind=st.sampled_from(["soft", "hard"]),
    issued_at=unix_times,
    attempt=st.integers(min_value=1, max_value=1000),
    expires_at=st.none() | unix_times,
)
acks = st.builds(
    Ack,
    experiment=experiment_ids,
    round=counters,
    action_id=identifiers,
    device_id=identifiers,
    status=st.sampled_from(["applied", "rejected"]),
    reason=st.none() | st.text(max_size=50),
    applied=value_maps,
    at=unix_times,
)
readings = st.builds(
    Reading,
    experiment=experiment_ids,
    round=counters,
    node=names,
    value=finite,
    seq=counters,
    device_id=identifiers,
    at=unix_times,
)
oracles = st.builds(
    Oracle,
    experiment=experiment_ids,
    round=counters,
    action_id=identifiers,
    expected_reward=finite,
    optimum=finite,
    device_id=identifiers,
    at=unix_times,
)
statuses = st.builds(
    Status,
    agent_id=identifiers,
    state=st.sampled_from(["online", "offline"]),
    experiments=st.lists(experiment_ids, max_size=4),
    software_version=st.text(min_size=1, max_size=64),
    at=unix_times,
)
dead_letters = st.builds(
    DeadLetter.for_rejected,
    topic=st.text(max_size=2000),
    payload=st.binary(max_size=3000),
    reason=st.sampled_from(DECODE_REASONS),
    detail=st.text(max_size=2000),
    at=unix_times,
)
recommendations = st.builds(
    Recommended,
    experiment=experiment_ids,
    values=value_maps,
    predicted=finite,
    fidelity=st.none() | finite,
    trials=counters,
    final=st.booleans(),
    at=unix_times,
)
messages = st.one_of(actions, acks, readings, oracles, statuses, dead_letters, recommendations)

json_scalars = st.none() | st.booleans() | st.integers() | finite | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
# Wrong for every field of every schema: no field is a list of objects.
WRONG_FOR_ANY_FIELD: Any = [{"": None}]


def document_of(message: MessageModel) -> dict[str, Any]:
    """The JSON object of an encoded message."""
    return json.loads(encode(message))


def reason_of(payload: bytes, expected: type[MessageModel] | None = None, **kwargs: Any) -> str:
    """Decode `payload`, which must fail, and return the reason."""
    with pytest.raises(DecodeError) as caught:
        decode(payload, expected, **kwargs)
    assert caught.value.reason in DECODE_REASONS
    assert caught.value.detail
    return caught.value.reason


def dumps(document: Any) -> bytes:
    return json.dumps(document, allow_nan=False).encode()


# ---------------------------------------------------------------------------------------------
# round trips


@given(messages)
def test_every_message_survives_encode_then_decode(message: MessageModel) -> None:
    payload = encode(message)
    assert decode(payload) == message
    assert decode(payload, type(message)) == message


@given(messages)
def test_encoded_payload_is_compact_strict_json_led_by_the_envelope(message: MessageModel) -> None:
    payload = encode(message)
    document = json.loads(payload, parse_constant=_no_constants)
    assert list(document)[:2] == ["schema", "version"]
    assert document["schema"] == message.SCHEMA
    # version 1 everywhere, but an action with an expiry is version 2, with an epoch 3
    expected = 2 if getattr(message, "expires_at", None) is not None else 1
    expected = 3 if getattr(message, "epoch", None) is not None else expected
    assert document["version"] == expected == message.wire()[0]
    assert payload == json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def _no_constants(literal: str) -> None:
    pytest.fail(f"encode wrote the non-JSON literal {literal}")


def test_schema_names_are_the_documented_ones() -> None:
    assert set(MESSAGE_TYPES) == {
        "cbo.action",
        "cbo.ack",
        "cbo.reading",
        "cbo.oracle",
        "cbo.status",
        "cbo.deadletter",
        "cbo.recommendation",
        "cbo.control",
        "cbo.control_reply",
    }


@given(actions, unix_times)
def test_a_retried_action_keeps_its_id_and_counts_the_attempt(action: Action, at: float) -> None:
    retry = action.next_attempt(at=at)
    assert (retry.action_id, retry.round, retry.intervention) == (
        action.action_id,
        action.round,
        action.intervention,
    )
    assert retry.attempt == action.attempt + 1
    assert retry.issued_at == at
    assert retry.expires_at == action.expires_at  # the agent's promise does not move


def test_actions_are_read_in_version_1_and_2_and_each_version_has_its_fields() -> None:
    action = Action.issue("exp", 3, {"x": 1.0}, at=100.0, expires_at=140.0)
    document = document_of(action)
    assert (document["version"], document["expires_at"]) == (2, 140.0)
    assert decode(encode(action)).expired(139.9) is False
    assert decode(encode(action)).expired(140.0) is True
    old = {k: v for k, v in document.items() if k != "expires_at"} | {"version": 1}
    legacy = decode(dumps(old), Action)  # a version 1 sender: no expiry, never expired
    assert legacy.expires_at is None and not legacy.expired(1e12)
    assert document_of(legacy) == old  # and what has no expiry is still written as version 1
    assert reason_of(dumps({**old, "expires_at": 140.0})) == "invalid"  # not a v1 field
    without = {k: v for k, v in document.items() if k != "expires_at"}
    assert reason_of(dumps(without)) == "invalid"  # required in version 2
    assert reason_of(dumps({**document, "expires_at": None})) == "invalid"
    assert reason_of(dumps({**document, "version": 3})) == "invalid"  # v3 needs an epoch
    assert reason_of(dumps({**document, "version": 4})) == "invalid"  # v4 carries vectors
    assert reason_of(dumps({**document, "version": 5})) == "unsupported_version"
    reading = Reading(experiment="e", round=0, node="Y", value=1.0, seq=0, device_id="d", at=0.0)
    assert reason_of(dumps({**document_of(reading), "version": 5})) == "unsupported_version"
    # version 4 is a reading with visited states: a scalar alone there is invalid
    assert reason_of(dumps({**document_of(reading), "version": 4})) == "invalid"
    # version 3 is an array reading: a scalar value there is invalid
    assert reason_of(dumps({**document_of(reading), "version": 3})) == "invalid"


def test_an_action_of_a_fleet_replica_carries_its_lease_epoch_in_version_3() -> None:
    action = Action.issue("exp", 3, {"x": 1.0}, at=100.0, expires_at=140.0).with_epoch(7)
    document = document_of(action)
    assert (document["version"], document["epoch"]) == (3, 7)
    assert decode(encode(action), Action) == action
    v2 = {k: v for k, v in document.items() if k != "epoch"} | {"version": 2}
    assert decode(dumps(v2), Action).epoch is None  # a single agent's action: no epoch
    assert reason_of(dumps({**v2, "epoch": 7})) == "invalid"  # not a field of version 2
    assert reason_of(dumps({**document, "epoch": -1})) == "invalid"
    no_expiry = {k: v for k, v in document.items() if k != "expires_at"}
    assert reason_of(dumps(no_expiry)) == "invalid"  # an epoch goes with an expiry


def test_a_parameter_vector_travels_packed_in_version_4_and_reads_back_exactly() -> None:
    theta = {f"theta.{i}": (-1.0) ** i * i / 7.0 for i in range(300)}
    action = Action.issue(
        "exp", 3, {"x": 0.5, **theta}, "soft", at=100.0, expires_at=140.0, vectors=("theta",)
    )
    document = document_of(action)
    assert document["version"] == 4 and document["intervention"] == {"x": 0.5}
    assert "epoch" not in document  # a single agent's action
    fenced = document_of(action.with_epoch(5))
    assert (fenced["version"], fenced["epoch"]) == (4, 5)
    assert decode(encode(action.with_epoch(5)), Action) == action.with_epoch(5)
    packed = document["vectors"]["theta"]
    assert (packed["dtype"], packed["shape"]) == ("float64", [300])
    assert base64.b64decode(packed["data"]) == struct.pack("<300d", *theta.values())
    assert decode(encode(action), Action) == action  # every coordinate, bit for bit
    assert len(encode(action)) < len(encode(action.model_copy(update={"vectors": ()}))) / 2
    single = {
        **packed,
        "dtype": "float32",
        "data": base64.b64encode(struct.pack("<300f", *theta.values())).decode(),
    }
    read = decode(dumps({**document, "vectors": {"theta": single}}), Action)
    assert read.intervention["theta.1"] == struct.unpack("<f", struct.pack("<f", -1 / 7))[0]
    for bad in (
        {**packed, "shape": [299]},  # data of 300
        {**packed, "dtype": "int8"},
        {**packed, "data": "not base64!"},
        {**packed, "data": base64.b64encode(struct.pack("<1d", math.inf)).decode(), "shape": [1]},
        {"dtype": "float64", "shape": [300]},
    ):
        assert reason_of(dumps({**document, "vectors": {"theta": bad}})) == "invalid"
    clash = {**document, "intervention": {"theta.0": 1.0}}
    assert reason_of(dumps(clash)) == "invalid"  # a coordinate twice
    assert reason_of(dumps({**document, "version": 2})) == "invalid"  # vectors need version 4
    assert reason_of(dumps({**document, "version": 3, "epoch": 1})) == "invalid"


def test_issued_actions_get_distinct_ids() -> None:
    ids = {Action.issue("exp", 0, {"x": 1.0}).action_id for _ in range(100)}
    assert len(ids) == 100


@given(st.text(max_size=3000), st.binary(max_size=5000), st.text(max_size=3000))
def test_dead_letters_fit_their_limits_whatever_they_carry(
    topic: str, payload: bytes, detail: str
) -> None:
    letter = DeadLetter.for_rejected(topic, payload, "malformed_json", detail, at=1.0)
    assert len(letter.payload) <= 1024
    assert len(letter.topic) <= 1024 and len(letter.detail) <= 1024
    assert payload.decode("utf-8", errors="replace").startswith(letter.payload)
    assert decode(encode(letter)) == letter


def test_encode_refuses_a_message_receivers_would_reject_as_oversized() -> None:
    big = Action.issue("exp", 0, {f"node{i}": float(i) for i in range(5000)})
    with pytest.raises(EncodeError):
        encode(big)
    assert decode(encode(big, max_bytes=10**6), max_bytes=10**6) == big


# ---------------------------------------------------------------------------------------------
# fuzzing: decode raises DecodeError and nothing else, with the right reason


@settings(max_examples=300)
@given(st.binary(max_size=2000))
def test_random_bytes_never_raise_anything_but_decode_error(payload: bytes) -> None:
    try:
        decode(payload)
    except DecodeError as error:
        assert error.reason in DECODE_REASONS


@settings(max_examples=300)
@given(json_values)
def test_random_json_values_are_rejected_with_a_structural_reason(value: Any) -> None:
    is_object = isinstance(value, dict)
    assume(
        not (
            is_object and isinstance(value.get("schema"), str) and value["schema"] in MESSAGE_TYPES
        )
    )
    assert reason_of(dumps(value)) == ("unknown_schema" if is_object else "not_an_object")


@settings(max_examples=150)
@given(
    st.sampled_from(sorted(MESSAGE_TYPES)),
    st.dictionaries(st.text(max_size=12), json_values, max_size=6),
)
def test_known_schema_with_random_fields_is_invalid(schema: str, fields: dict[str, Any]) -> None:
    document = {**fields, "schema": schema, "version": 1}
    assert reason_of(dumps(document)) == "invalid"


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(messages, st.data())
def test_targeted_mutations_get_their_reason(message: MessageModel, data: st.DataObject) -> None:
    document = document_of(message)
    fields = [key for key in document if key not in ("schema", "version")]
    mutation = data.draw(st.sampled_from(sorted(MUTATIONS)))
    payload, expected_reason = MUTATIONS[mutation](document, fields, data)
    assert reason_of(payload) == expected_reason, mutation


def _non_finite_literal(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    field = data.draw(st.sampled_from(fields))
    literal = data.draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
    marker = "__non_finite__"
    document[field] = marker
    return dumps(document).replace(f'"{marker}"'.encode(), literal.encode()), "invalid"


def _overflowing_number(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    numeric = [key for key in fields if isinstance(document[key], float)]
    field = data.draw(st.sampled_from(numeric or fields))
    marker = "__overflow__"
    document[field] = marker
    return dumps(document).replace(f'"{marker}"'.encode(), b"1e999"), "invalid"


def _wrong_type(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    document[data.draw(st.sampled_from(fields))] = WRONG_FOR_ANY_FIELD
    return dumps(document), "invalid"


def _number_as_string(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    numeric = [key for key in fields if type(document[key]) in (int, float)]
    field = data.draw(st.sampled_from(numeric))
    document[field] = str(document[field])  # strict models do not coerce "3" into 3
    return dumps(document), "invalid"


def _missing_field(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    required = [key for key in fields if key != "reason"]  # Ack.reason is optional
    del document[data.draw(st.sampled_from(required))]
    return dumps(document), "invalid"


def _extra_field(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    name = data.draw(st.text(min_size=1, max_size=12).filter(lambda key: key not in document))
    document[name] = data.draw(json_values)
    return dumps(document), "invalid"


def _negative_counter(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    counters_here = [
        key
        for key in ("round", "seq", "attempt", "at", "issued_at", "expires_at")
        if key in document
    ]
    document[data.draw(st.sampled_from(counters_here))] = data.draw(st.integers(max_value=-1))
    return dumps(document), "invalid"


def _unknown_schema(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    schema = data.draw(st.text(max_size=20) | json_values)
    document["schema"] = schema
    if isinstance(schema, str) and schema in MESSAGE_TYPES:
        del document["schema"]
    return dumps(document), "unknown_schema"


def _missing_schema(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    del document["schema"]
    return dumps(document), "unknown_schema"


def _unsupported_version(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    reads = MESSAGE_TYPES[document["schema"]].READS
    version = data.draw(
        json_values.filter(lambda value: not (type(value) is int and value in reads))
    )
    document["version"] = version
    return dumps(document), "unsupported_version"


def _missing_version(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    del document["version"]
    return dumps(document), "unsupported_version"


def _truncated(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    payload = dumps(document)
    return payload[: data.draw(st.integers(0, len(payload) - 1))], "malformed_json"


def _duplicate_key(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    payload = dumps(document)
    return payload[:-1] + b',"schema":"cbo.action"}', "malformed_json"


def _invalid_utf8(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    payload = dumps(document)
    cut = data.draw(st.integers(0, len(payload)))
    return payload[:cut] + b"\xff" + payload[cut:], "malformed_json"


def _lone_surrogate(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    texts = [key for key in fields if isinstance(document[key], str)]
    field = data.draw(st.sampled_from(texts))
    marker = "__surrogate__"
    document[field] = marker
    # A JSON escape of half a surrogate pair: parses, but is not Unicode text.
    return dumps(document).replace(marker.encode(), b"\\ud800"), "invalid"


def _oversized(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    payload = dumps(document)
    padding = DEFAULT_MAX_PAYLOAD_BYTES + 1 - len(payload)
    return payload + b" " * max(padding, 0), "oversized"


def _not_an_object(document: dict, fields: list[str], data: st.DataObject) -> tuple:
    return dumps([document]), "not_an_object"


MUTATIONS = {
    "non_finite_literal": _non_finite_literal,
    "overflowing_number": _overflowing_number,
    "wrong_type": _wrong_type,
    "number_as_string": _number_as_string,
    "missing_field": _missing_field,
    "extra_field": _extra_field,
    "negative_counter": _negative_counter,
    "unknown_schema": _unknown_schema,
    "missing_schema": _missing_schema,
    "unsupported_version": _unsupported_version,
    "missing_version": _missing_version,
    "truncated": _truncated,
    "duplicate_key": _duplicate_key,
    "invalid_utf8": _invalid_utf8,
    "lone_surrogate": _lone_surrogate,
    "oversized": _oversized,
    "not_an_object": _not_an_object,
}


@given(messages, st.sampled_from(list(MESSAGE_TYPES.values())))
def test_a_valid_message_of_another_kind_is_wrong_schema(
    message: MessageModel, expected: type[MessageModel]
) -> None:
    assume(not isinstance(message, expected))
    assert reason_of(encode(message), expected) == "wrong_schema"


@given(st.binary(min_size=1, max_size=200))
def test_size_is_checked_before_parsing(garbage: bytes) -> None:
    assert reason_of(garbage, max_bytes=len(garbage) - 1) == "oversized"


def test_boolean_and_float_versions_are_not_version_one() -> None:
    reading = document_of(
        Reading(experiment="e", round=0, node="n", value=1.0, seq=0, device_id="d", at=0.0)
    )
    for version in (True, 1.0, "1"):
        assert reason_of(dumps({**reading, "version": version})) == "unsupported_version"


def test_deeply_nested_json_is_malformed_not_a_crash() -> None:
    assert reason_of(b"[" * 60_000) == "malformed_json"


def test_non_finite_values_cannot_be_built_either() -> None:
    with pytest.raises(ValueError):
        Reading(experiment="e", round=0, node="n", value=math.nan, seq=0, device_id="d", at=0.0)


# ---------------------------------------------------------------------------------------------
# topics

prefixes = st.lists(identifiers, min_size=1, max_size=3).map("/".join)
kinds = st.sampled_from(DEVICE_TOPIC_KINDS)


@given(prefixes, experiment_ids, identifiers, kinds)
def test_device_topics_parse_back(prefix: str, experiment: str, device: str, kind: str) -> None:
    topics = Topics(prefix)
    topic = topics.device_topic(experiment, device, kind)  # type: ignore[arg-type]
    assert topic == f"{prefix}/{experiment}/{device}/{kind}"
    assert topics.parse(topic) == ParsedTopic(experiment, kind, device)  # type: ignore[arg-type]
    if kind != "deadletter":
        assert getattr(topics, kind)(experiment, device) == topic
    assert topic_matches_sub(topics.device_filter(kind), topic)  # type: ignore[arg-type]
    assert topic_matches_sub(topics.device_filter(kind, experiment), topic)  # type: ignore[arg-type]
    assert topic_matches_sub(topics.device_filter(kind, experiment, device), topic)  # type: ignore[arg-type]
    assert not topic_matches_sub(topics.device_filter(kind, experiment, device + "x"), topic)  # type: ignore[arg-type]


@given(prefixes, experiment_ids)
def test_the_agents_dead_letter_topic_parses_back(prefix: str, experiment: str) -> None:
    topics = Topics(prefix)
    topic = topics.deadletter(experiment)
    assert topic == f"{prefix}/{experiment}/deadletter"
    assert topics.parse(topic) == ParsedTopic(experiment, "deadletter")
    for kind in set(DEVICE_TOPIC_KINDS) - set(EXPERIMENT_TOPIC_KINDS):
        with pytest.raises(ForeignTopicError):  # the old layout, without a device level
            topics.parse(f"{prefix}/{experiment}/{kind}")


@given(prefixes, experiment_ids)
def test_the_recommendation_topic_parses_back(prefix: str, experiment: str) -> None:
    topics = Topics(prefix)
    topic = topics.recommendation(experiment)
    assert topic == f"{prefix}/{experiment}/recommendation"
    assert topics.parse(topic) == ParsedTopic(experiment, "recommendation")


@given(prefixes, identifiers)
def test_status_topics_parse_back(prefix: str, agent_id: str) -> None:
    topics = Topics(prefix)
    topic = topics.status(agent_id)
    assert topics.parse_status(topic) == agent_id
    assert topic_matches_sub(topics.status_filter(), topic)
    with pytest.raises(ForeignTopicError):
        topics.parse(topic)


@given(st.text(max_size=80))
def test_any_topic_either_parses_to_itself_or_is_foreign(topic: str) -> None:
    topics = Topics()
    try:
        parsed = topics.parse(topic)
    except ForeignTopicError:
        return
    if parsed.device is None:
        assert topics.experiment_topic(parsed.experiment, parsed.kind) == topic  # type: ignore[arg-type]
    else:
        assert topics.device_topic(parsed.experiment, parsed.device, parsed.kind) == topic


@given(experiment_ids, kinds, st.sampled_from(["other", "cbo/x", "cb", "cbox"]))
def test_topics_under_another_prefix_are_foreign(experiment: str, kind: str, prefix: str) -> None:
    with pytest.raises(ForeignTopicError):
        Topics().parse(f"{prefix}/{experiment}/dev/{kind}")


@pytest.mark.parametrize(
    "topic",
    [
        "cbo/exp/reading/extra",
        "cbo/exp/dev/reading/extra",
        "cbo/exp/reading",
        "cbo/exp/+/reading",
        "cbo/+/dev/ack",
        "cbo/exp/d+v/ack",
        "cbo/agents/dev/reading",
        "cbo/exp/dev/status",
        "cbo/exp",
        "cbo/exp/unknown",
        "cbo//reading",
        "cbo/+/reading",
        "cbo/#",
        "cbo/agents/reading",
        "cbo/agents/a/b/status",
        "/cbo/exp/reading",
        "cbo/exp/reading/",
    ],
)
def test_malformed_or_foreign_topics_raise(topic: str) -> None:
    with pytest.raises(ForeignTopicError):
        Topics().parse(topic)


bad_ids = st.one_of(
    st.just(""),
    st.just("agents"),
    st.text(min_size=65, max_size=100, alphabet="abc"),
    st.tuples(identifiers, st.sampled_from("/+# $é\x00\n"), identifiers).map("".join),
)


@given(bad_ids, kinds)
def test_bad_experiment_ids_are_refused_when_building(experiment: str, kind: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        Topics().device_topic(experiment, "dev", kind)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifierError):
        Topics().deadletter(experiment)
    with pytest.raises(InvalidIdentifierError):
        validate_experiment_id(experiment)


@given(bad_ids)
def test_messages_refuse_bad_experiment_ids(experiment: str) -> None:
    with pytest.raises(ValueError):
        Reading(experiment=experiment, round=0, node="n", value=1.0, seq=0, device_id="d", at=0.0)


@pytest.mark.parametrize("prefix", ["", "a//b", "a/+", "#", "$SYS", "cbo/"])
def test_bad_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        Topics(prefix)


# ---------------------------------------------------------------------------------------------
# the protocol document

PROTOCOL_DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"


def test_every_json_example_in_the_protocol_document_decodes() -> None:
    examples = re.findall(r"```json\n(.*?)```", PROTOCOL_DOC.read_text(), flags=re.DOTALL)
    keys = DeviceKeys.parse("sensor-7 example-key-0123456789abcdef", "the example key")
    signed = [e.encode() for e in examples if '"cbo.signed"' in e]
    assert len(signed) == 1  # the signature example, verified under the documented key
    opened = unwrap(signed[0], "sensor-7", keys)
    assert opened != signed[0] and decode(opened).SCHEMA == "cbo.reading"
    decoded = [decode(example.encode()) for example in examples if '"cbo.signed"' not in example]
    assert {message.SCHEMA for message in decoded} == set(MESSAGE_TYPES)


def test_the_protocol_document_lists_every_rejection_reason() -> None:
    text = PROTOCOL_DOC.read_text()
    assert all(f"| `{reason}` |" in text for reason in DECODE_REASONS)
