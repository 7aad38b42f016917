"""Per-device HMAC-SHA256 signatures on payloads, for brokers that cannot give each device its
own topics (no per-client ACL).

A signed message is an envelope around the exact bytes of an ordinary payload:

    {"schema": "cbo.signed", "version": 1, "device_id": "sensor-7",
     "body": "{\\"schema\\":\\"cbo.reading\\", ...}", "hmac": "<64 hex digits>"}

`hmac` is HMAC-SHA256 over the UTF-8 bytes of `body` under the device's key; `body` is the
message as it would be sent unsigned. Signing exact bytes (not a re-serialization) lets a device
in any language sign what it sends. The body names its experiment, device and round (or action
id, or sequence number), so a copy replayed on another topic is refused by the checks that
follow, and a copy replayed on the same topic is a duplicate.

`DeviceKeys` holds the keys (from a file or the environment: `DeviceKeys.parse`); it never shows
them (`repr` lists device ids only). `unwrap` checks a payload against the keys: a device with
a key must sign, a signature must verify, and an envelope's `device_id` must be the sender's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from typing import Final

from connectors.schemas import DEFAULT_MAX_PAYLOAD_BYTES
from connectors.topics import validate_identifier

SIGNED_SCHEMA: Final = "cbo.signed"
SIGNED_VERSION: Final = 1
MIN_KEY_BYTES: Final = 16  # 128 bits; `openssl rand -hex 32` gives 32 bytes of hex text
_ENVELOPE_KEYS: Final = {"schema", "version", "device_id", "body", "hmac"}
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


class SignatureError(Exception):
    """A payload a device's key refuses; `reason` is "unsigned", "bad_signature" or
    "device_mismatch" (the codes of `connectors.metrics.UNTRUSTED_REASONS`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class KeyFileError(ValueError):
    """Device keys that cannot be read: one line naming the entry and what is wrong."""


class DeviceKeys:
    """device id -> HMAC key. Empty: nothing is signed, nothing is checked."""

    def __init__(self, keys: Mapping[str, bytes] | None = None) -> None:
        self._keys = dict(keys or {})

    @classmethod
    def parse(cls, text: str, source: str) -> DeviceKeys:
        """Read ``DEVICE_ID KEY`` entries, one per line (or separated by ``;``); ``#`` starts
        a comment. The key is the UTF-8 of the text after the id (at least MIN_KEY_BYTES).

        Raises:
            KeyFileError: naming `source` and the entry's number, never the key.
        """
        keys: dict[str, bytes] = {}
        entries = [e.strip() for line in text.splitlines() for e in line.split(";")]
        for number, entry in enumerate(entries, start=1):
            if not entry or entry.startswith("#"):
                continue
            parts = entry.split()
            if len(parts) != 2:
                raise KeyFileError(f"{source}: entry {number}: need 'DEVICE_ID KEY'")
            device, key = parts
            try:
                validate_identifier(device, "device id")
            except ValueError as error:
                raise KeyFileError(f"{source}: entry {number}: {error}") from None
            if device in keys:
                raise KeyFileError(f"{source}: entry {number}: a second key for {device!r}")
            secret = key.encode("utf-8")
            if len(secret) < MIN_KEY_BYTES:
                raise KeyFileError(
                    f"{source}: entry {number}: the key of {device!r} is shorter than "
                    f"{MIN_KEY_BYTES} bytes"
                )
            keys[device] = secret
        return cls(keys)

    @property
    def devices(self) -> list[str]:
        """The device ids that have a key (and so must sign)."""
        return sorted(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __contains__(self, device: object) -> bool:
        return device in self._keys

    def __repr__(self) -> str:  # never the keys
        return f"DeviceKeys(devices={self.devices})"

    def key(self, device: str) -> bytes | None:
        return self._keys.get(device)

    def merged(self, others: Iterable[DeviceKeys]) -> DeviceKeys:
        """These keys and the others'; a device with keys in two sources is an error."""
        keys = dict(self._keys)
        for other in others:
            both = sorted(set(keys) & set(other._keys))
            if both:
                raise KeyFileError(f"devices with keys in two places: {both}")
            keys |= other._keys
        return DeviceKeys(keys)


def digest(key: bytes, body: bytes) -> str:
    """HMAC-SHA256 of `body` under `key`, as 64 lowercase hex digits."""
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def sign(payload: bytes, device_id: str, key: bytes) -> bytes:
    """The signed envelope of `payload` (an encoded message, UTF-8 JSON) from `device_id`."""
    body = payload.decode("utf-8")
    document = {
        "schema": SIGNED_SCHEMA,
        "version": SIGNED_VERSION,
        "device_id": device_id,
        "body": body,
        "hmac": digest(key, payload),
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def unwrap(payload: bytes, sender: str, keys: DeviceKeys) -> bytes:
    """The message inside `payload` from `sender` (the topic's device), checked against `keys`.

    A plain payload passes unchanged when `sender` has no key; a signed one is opened when its
    signature verifies under the sender's key. Anything that does not parse as an envelope is
    handed on as it is, for the decoder to reject with its own reason.

    Raises:
        SignatureError: "unsigned" (the sender has a key, the payload is plain),
            "bad_signature" (no key for a signed payload, or a signature that does not verify),
            "device_mismatch" (an envelope naming another device).
    """
    envelope = _envelope(payload)
    if envelope is None:
        if sender in keys:
            raise SignatureError("unsigned", f"device {sender!r} signs its messages (has a key)")
        return payload
    if envelope["device_id"] != sender:
        raise SignatureError(
            "device_mismatch", f"envelope names {envelope['device_id']!r} on {sender!r}'s topic"
        )
    key = keys.key(sender)
    if key is None:
        raise SignatureError("bad_signature", f"no key for device {sender!r}")
    body = envelope["body"].encode("utf-8")
    if not hmac.compare_digest(digest(key, body), envelope["hmac"]):
        raise SignatureError("bad_signature", f"the HMAC does not verify under {sender!r}'s key")
    return body


def _envelope(payload: bytes) -> dict[str, str] | None:
    """The fields of a well-formed signed envelope, or None for anything else."""
    if SIGNED_SCHEMA.encode() not in payload or len(payload) > 2 * DEFAULT_MAX_PAYLOAD_BYTES:
        return None  # cheap: plain messages are not parsed twice
    try:
        document = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("schema") != SIGNED_SCHEMA:
        return None
    if set(document) != _ENVELOPE_KEYS or document["version"] != SIGNED_VERSION:
        return None
    fields = (document["device_id"], document["body"], document["hmac"])
    if not all(isinstance(value, str) for value in fields):
        return None
    if not _HEX_DIGEST.fullmatch(document["hmac"]):
        return None
    try:
        document["body"].encode("utf-8")
    except UnicodeEncodeError:
        return None
    return document
