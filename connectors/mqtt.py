"""Async MQTT client for cbo-agent, on aiomqtt (paho-mqtt underneath).

Three layers, each usable alone:

- `BrokerConfig`: where and how to connect (also from a URL: ``mqtts://user:pass@host:8883``).
- `MqttConnection`: one connection as an async context manager. It speaks MQTT v5 where the
  broker has it (with protocol "auto" it falls back to 3.1.1 when the broker refuses v5, or
  leaves a v5 CONNECT unanswered for `probe_timeout_s`), and, given a `Presence`, sets a
  retained "offline" last will on the agent's status topic, publishes a retained "online"
  status on connect and a retained "offline" one on a clean exit.
- `run_with_reconnect`: a supervising loop. It opens a connection, hands it to the caller's
  session coroutine, and when the link fails, waits a fully jittered exponential backoff and
  starts a fresh connection and a fresh session (which re-subscribes). The session coroutine is
  therefore the one place where subscriptions and (re-)publishing of pending work live.

Link failures surface as `MqttConnectionError` (retried by the loop); a refused subscription
surfaces as `SubscribeRefusedError` (a configuration problem, not retried).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import random
import select
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, Self
from urllib.parse import unquote, urlsplit

import aiomqtt
import paho.mqtt.client as paho
import structlog
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from connectors.schemas import MessageModel, Status, encode
from connectors.topics import Topics, validate_agent_id, validate_experiment_id

log = structlog.get_logger(__name__)

ProtocolChoice = Literal["auto", "5", "3.1.1"]
Protocol = Literal["5", "3.1.1"]

# CONNACK codes meaning "I do not speak this protocol version": 1 in MQTT 3.1.1, 0x84 in v5
# (paho reports a 3.1.1 broker's 1 as 0x84 when the client asked for v5).
_PROTOCOL_REFUSAL_CODES: Final = frozenset({1, 0x84})
_SUBSCRIBE_FAILURE_CODE: Final = 0x80  # lowest failure code of SUBACK, both versions
_URL_SCHEMES: Final = {"mqtt": (False, 1883), "tcp": (False, 1883), "mqtts": (True, 8883)}
_GOODBYE_TIMEOUT_S: Final = 2.0  # a clean exit must not hang on a dying broker
# Packets paho reads per readable-socket callback, and messages handed over per batch, at most:
# a burst that is already on the socket is taken in one event-loop turn, yet a flood cannot
# keep the loop from its other tasks for long.
READ_BURST: Final = 512


class MqttConnectionError(Exception):
    """Connecting to the broker or talking with it failed; a new connection may succeed."""


class ConnectRefusedError(MqttConnectionError):
    """The broker answered CONNECT with a failure reason code (bad credentials, ...)."""

    def __init__(self, reason_code: int, reason: str) -> None:
        super().__init__(f"connection refused by broker: [{reason_code}] {reason}")
        self.reason_code = reason_code
        self.reason = reason


class BrokerUnreachableError(MqttConnectionError):
    """No TCP (or TLS) connection to the broker: nothing listens, or the network is down."""


class ConnectionLostError(MqttConnectionError):
    """An established connection broke (broker gone, network down, keepalive expired)."""


class TlsOptionsError(ValueError):
    """A CA, certificate or key file that cannot be read or used; retrying will not help."""


class SubscribeRefusedError(Exception):
    """The broker refused a subscription (an ACL, a bad filter); retrying will not help."""


class BrokerConfig(BaseModel):
    """Where and how to connect to the broker.

    `clean_start=False` with `session_expiry_s > 0` (and a fixed `client_id`) asks the broker to
    keep the session, subscriptions and queued QoS 1 messages across disconnects. Over MQTT
    3.1.1, `clean_start` becomes the clean-session flag and the expiry is the broker's own.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=1883, ge=1, le=65535)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    client_id: str | None = Field(default=None, min_length=1, max_length=128)
    keepalive: int = Field(default=30, ge=1, le=65535)
    protocol: ProtocolChoice = "auto"
    clean_start: bool = True
    session_expiry_s: int = Field(default=0, ge=0, le=2**32 - 1)
    # Acknowledge QoS 1 messages only when the caller says so (`MqttConnection.ack`), after it
    # stored them: with a persistent session, what was received but not yet stored when the
    # process died is delivered again.
    manual_ack: bool = False
    # MQTT v5 Receive Maximum: at most this many QoS 1 messages sent to us and not yet
    # acknowledged (None: the protocol's 65,535). With manual acks this bounds what the client
    # holds in memory whatever a flood sends; over 3.1.1 the broker's own limit applies
    # (Mosquitto's max_inflight_messages).
    receive_maximum: int | None = Field(default=None, ge=1, le=65535)
    timeout_s: float = Field(default=10.0, gt=0)  # CONNACK, SUBACK and PUBACK waits
    # Under "auto", how long a v5 CONNECT may go unanswered before trying 3.1.1: some 3.1.1
    # brokers (amqtt) choke on a v5 CONNECT carrying a will and never answer at all.
    probe_timeout_s: float = Field(default=3.0, gt=0)

    @model_validator(mode="after")
    def _check_consistency(self) -> Self:
        if not self.tls and (self.ca_file or self.cert_file or self.key_file):
            raise ValueError("ca_file, cert_file and key_file need tls=True")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.password is not None and self.username is None:
            raise ValueError("a password needs a username")
        if not self.clean_start and self.client_id is None:
            raise ValueError("a persistent session (clean_start=False) needs a fixed client_id")
        return self

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> BrokerConfig:
        """Parse ``mqtt://[user[:password]@]host[:port]`` (``mqtts://`` for TLS, port 8883).

        Keyword overrides set the other fields (``ca_file=...``, ``client_id=...``).
        """
        parts = urlsplit(url)
        if parts.scheme not in _URL_SCHEMES:
            raise ValueError(f"broker URL {url!r}: scheme must be one of {sorted(_URL_SCHEMES)}")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"broker URL {url!r}: no path, query or fragment expected")
        if not parts.hostname:
            raise ValueError(f"broker URL {url!r}: missing host")
        tls, default_port = _URL_SCHEMES[parts.scheme]
        fields: dict[str, Any] = {"host": parts.hostname, "port": parts.port or default_port}
        fields["tls"] = tls
        if parts.username is not None:
            fields["username"] = unquote(parts.username)
        if parts.password is not None:
            fields["password"] = unquote(parts.password)
        return cls(**(fields | overrides))

    def with_client_id(self) -> BrokerConfig:
        """This config with a generated client id if it has none (stable across reconnects)."""
        if self.client_id is not None:
            return self
        return self.model_copy(update={"client_id": f"cbo-{uuid.uuid4().hex[:16]}"})


def _package_version() -> str:
    try:
        return importlib.metadata.version("cbo-agent")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True)
class Presence:
    """Who is connecting, for the retained status topic and the last will."""

    agent_id: str
    experiments: tuple[str, ...] = ()
    software_version: str = field(default_factory=_package_version)
    topics: Topics = field(default_factory=Topics)

    def __post_init__(self) -> None:
        validate_agent_id(self.agent_id)
        for experiment in self.experiments:
            validate_experiment_id(experiment)

    @property
    def topic(self) -> str:
        """The retained status topic of this agent."""
        return self.topics.status(self.agent_id)

    def status(self, state: Literal["online", "offline"], *, at: float | None = None) -> Status:
        """The status message for `state`, stamped now unless `at` is given."""
        return Status(
            agent_id=self.agent_id,
            state=state,
            experiments=list(self.experiments),
            software_version=self.software_version,
            at=time.time() if at is None else at,
        )


@dataclass(frozen=True, slots=True)
class IncomingMessage:
    """One message delivered by the broker.

    `retain` is True for a retained message replayed on subscribe (state, not a new event).
    `received_at` is the unix time the message was handed to the caller.
    """

    topic: str
    payload: bytes
    qos: int
    retain: bool
    mid: int
    received_at: float


def protocol_candidates(
    choice: ProtocolChoice, preferred: Protocol | None = None
) -> tuple[Protocol, ...]:
    """Protocol versions to try, in order: v5 first under "auto", unless `preferred` says else.

    `preferred` is the version that worked last time, so reconnects to a 3.1.1-only broker do
    not pay for a refused v5 attempt each time.
    """
    if choice != "auto":
        return (choice,)
    return ("3.1.1", "5") if preferred == "3.1.1" else ("5", "3.1.1")


def is_protocol_refusal(reason_code: int) -> bool:
    """Whether a CONNACK reason code means the broker does not speak the requested version."""
    return reason_code in _PROTOCOL_REFUSAL_CODES


class MqttConnection:
    """One MQTT connection, as an async context manager.

    >>> async with MqttConnection(config, presence=Presence("agent-1")) as connection:
    ...     await connection.subscribe("cbo/+/reading")
    ...     async for message in connection.messages():
    ...         ...
    """

    def __init__(
        self,
        config: BrokerConfig,
        *,
        presence: Presence | None = None,
        preferred_protocol: Protocol | None = None,
    ) -> None:
        self._config = config.with_client_id()
        self._presence = presence
        self._preferred_protocol = preferred_protocol
        self._client: aiomqtt.Client | None = None
        self._protocol: Protocol | None = None
        self._log = log.bind(host=config.host, port=config.port, client_id=self._config.client_id)

    @property
    def client_id(self) -> str:
        """The MQTT client identifier in use."""
        assert self._config.client_id is not None  # with_client_id() guarantees it
        return self._config.client_id

    @property
    def protocol(self) -> Protocol:
        """The protocol version negotiated with the broker."""
        if self._protocol is None:
            raise MqttConnectionError("not connected")
        return self._protocol

    async def __aenter__(self) -> Self:
        if self._client is not None:
            raise RuntimeError("MqttConnection is already open; it is not reentrant")
        candidates = protocol_candidates(self._config.protocol, self._preferred_protocol)
        for protocol in candidates:
            last_chance = protocol == candidates[-1]
            try:
                self._client = await self._connect(protocol, probing=not last_chance)
            except MqttConnectionError as error:
                if last_chance or not _worth_another_protocol(error):
                    raise
                self._log.info("mqtt.protocol_fallback", refused=protocol, error=str(error))
                continue
            self._protocol = protocol
            break
        self._log.info("mqtt.connected", protocol=self._protocol)
        if self._presence is not None:
            await self._announce_online()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client, self._client, self._protocol = self._client, None, None
        if client is None:
            return
        if self._presence is not None:
            await self._say_goodbye(client)
        try:
            await client.__aexit__(exc_type, exc, tb)
        except aiomqtt.MqttError as error:
            self._log.warning("mqtt.disconnect_unclean", error=str(error))
        self._log.info("mqtt.disconnected", cause=None if exc is None else repr(exc))

    async def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Publish raw bytes; with QoS 1, returns once the broker acknowledged (PUBACK)."""
        if not isinstance(payload, bytes | bytearray):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        client = self._require_client()
        try:
            await client.publish(topic, bytes(payload), qos=qos, retain=retain)
        except aiomqtt.MqttError as error:
            raise ConnectionLostError(f"publish to {topic!r} failed: {error}") from error

    async def publish_message(
        self, topic: str, message: MessageModel, qos: int = 1, retain: bool = False
    ) -> None:
        """Encode a schema message and publish it."""
        await self.publish(topic, encode(message), qos=qos, retain=retain)

    async def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe; raise SubscribeRefusedError if the broker refuses the filter."""
        client = self._require_client()
        try:
            granted = await client.subscribe(topic_filter, qos=qos)
        except aiomqtt.MqttError as error:
            raise ConnectionLostError(f"subscribe to {topic_filter!r} failed: {error}") from error
        codes = [_reason_value(code) for code in granted]
        if any(code >= _SUBSCRIBE_FAILURE_CODE for code in codes):
            raise SubscribeRefusedError(f"broker refused {topic_filter!r}: codes {codes}")
        self._log.info("mqtt.subscribed", topic_filter=topic_filter, qos=qos)

    async def unsubscribe(self, topic_filter: str) -> None:
        """Drop a subscription (a fleet replica that no longer owns an experiment)."""
        client = self._require_client()
        try:
            await client.unsubscribe(topic_filter)
        except aiomqtt.MqttError as error:
            raise ConnectionLostError(f"unsubscribe {topic_filter!r} failed: {error}") from error
        self._log.info("mqtt.unsubscribed", topic_filter=topic_filter)

    def ack(self, message: IncomingMessage) -> bool:
        """Acknowledge a QoS 1 message (with `manual_ack`); False if this connection is gone.

        A message is acknowledged on the connection that delivered it; after a reconnect the
        broker redelivers what was never acknowledged (persistent session), so a lost ack only
        costs a duplicate, which receivers drop.
        """
        if not self._config.manual_ack or message.qos == 0:
            return True
        client = self._client
        if client is None:
            return False
        return paho_client(client).ack(message.mid, message.qos) == 0

    async def messages(self) -> AsyncIterator[IncomingMessage]:
        """Messages of every subscription, in arrival order; ConnectionLostError when it breaks."""
        iterator = self._require_client().messages
        while True:
            try:
                message = await anext(iterator)
            except aiomqtt.MqttError as error:
                raise ConnectionLostError(str(error)) from error
            yield _incoming(message, time.time())

    async def message_batches(
        self, limit: int = READ_BURST
    ) -> AsyncIterator[list[IncomingMessage]]:
        """Messages of every subscription in arrival order, as lists: each waits for one message,
        then takes (up to `limit`) every message already received, without waiting again.

        aiomqtt hands messages over one at a time, each through a task of its own and a few
        event-loop turns; a busy consumer (a fleet replica) takes what came in one go instead.
        Nothing is lost between batches: a message not yet taken stays in the client's queue.
        ConnectionLostError when the connection breaks.
        """
        client = self._require_client()
        iterator, queue = client.messages, _message_queue(client)
        while True:
            try:
                raw = [await anext(iterator)]
            except aiomqtt.MqttError as error:
                raise ConnectionLostError(str(error)) from error
            while queue is not None and len(raw) < limit and not queue.empty():
                raw.append(queue.get_nowait())
            now = time.time()
            yield [_incoming(message, now) for message in raw]

    def _require_client(self) -> aiomqtt.Client:
        if self._client is None:
            raise MqttConnectionError("not connected; use `async with MqttConnection(...)`")
        return self._client

    async def _connect(self, protocol: Protocol, *, probing: bool) -> aiomqtt.Client:
        # While another version remains to try, a silent broker gets the short probe timeout.
        config = self._config
        timeout_s = min(config.timeout_s, config.probe_timeout_s) if probing else config.timeout_s
        client = self._build_client(protocol, timeout_s)
        if config.manual_ack:
            # before connecting: a persistent session's queued messages arrive at once
            paho_client(client).manual_ack_set(True)
        try:
            await client.__aenter__()
        except aiomqtt.MqttError as error:
            _abandon(client)
            raise _connect_error(error, config, protocol) from error
        except asyncio.CancelledError:
            _abandon(client)
            raise
        client.timeout = config.timeout_s
        _read_in_bursts(paho_client(client))
        return client

    def _build_client(self, protocol: Protocol, timeout_s: float) -> aiomqtt.Client:
        config = self._config
        password = None if config.password is None else config.password.get_secret_value()
        version_options: dict[str, Any]
        if protocol == "5":
            version_options = {
                "protocol": aiomqtt.ProtocolVersion.V5,
                "clean_start": config.clean_start,
                "properties": _connect_properties(config.session_expiry_s, config.receive_maximum),
            }
        else:
            version_options = {
                "protocol": aiomqtt.ProtocolVersion.V311,
                "clean_session": config.clean_start,
            }
        return aiomqtt.Client(
            config.host,
            config.port,
            username=config.username,
            password=password,
            identifier=config.client_id,
            keepalive=config.keepalive,
            timeout=timeout_s,
            will=self._last_will(),
            tls_context=tls_context(config),
            **version_options,
        )

    def _last_will(self) -> aiomqtt.Will | None:
        if self._presence is None:
            return None
        offline = encode(self._presence.status("offline"))
        return aiomqtt.Will(self._presence.topic, offline, qos=1, retain=True)

    async def _announce_online(self) -> None:
        assert self._presence is not None
        try:
            await self.publish_message(
                self._presence.topic, self._presence.status("online"), retain=True
            )
        except BaseException:
            # Do not leave an open socket behind a failed __aenter__ (no __aexit__ will run).
            await self.__aexit__(None, None, None)
            raise

    async def _say_goodbye(self, client: aiomqtt.Client) -> None:
        # A clean exit does not trigger the last will, so replace the retained "online" here.
        assert self._presence is not None
        offline = encode(self._presence.status("offline"))
        try:
            await client.publish(
                self._presence.topic, offline, qos=1, retain=True, timeout=_GOODBYE_TIMEOUT_S
            )
        except aiomqtt.MqttError as error:
            self._log.info("mqtt.offline_status_skipped", error=str(error))


def _abandon(client: aiomqtt.Client) -> None:
    """Close the socket of a client whose connect failed.

    aiomqtt leaves the socket open (and registered with the event loop) when no CONNACK comes
    in time; paho would only drop it after 1.5 keepalives. paho's own disconnect() closes it.
    """
    inner = getattr(client, "_client", None)  # see `paho_client`; never raise on this path
    if inner is not None:
        inner.disconnect()


def _incoming(message: aiomqtt.Message, received_at: float) -> IncomingMessage:
    return IncomingMessage(
        topic=message.topic.value,
        payload=bytes(message.payload),  # type: ignore[arg-type]  # always bytes from paho
        qos=message.qos,
        retain=bool(message.retain),
        mid=message.mid,
        received_at=received_at,
    )


def _message_queue(client: aiomqtt.Client) -> asyncio.Queue[aiomqtt.Message] | None:
    """The queue aiomqtt's `messages` iterator reads (private `_queue`: aiomqtt has no public
    way to take what is already there without a task per message); None on a version that
    keeps none there, and batches are then of one message."""
    queue = getattr(client, "_queue", None)
    return queue if isinstance(queue, asyncio.Queue) else None


def _read_in_bursts(inner: paho.Client) -> None:
    """Make paho read every packet already on the socket when the event loop says it is
    readable, up to READ_BURST, instead of one.

    aiomqtt's reader callback calls `loop_read()` once per readable event, and paho's reads one
    packet (it reads more only while it has QoS 2 or outgoing messages in flight): a burst of
    N messages takes N event-loop turns, each a `select` over every socket and a round of every
    ready task. This replaces `loop_read` on this paho client with one that reads again while
    the socket still has bytes (a zero-timeout poll) — the same packets in the same order,
    with paho's own error handling, and aiomqtt's handling of what it raises.
    """
    read_one = inner.loop_read
    poller: select.poll | None = None
    polled = -1

    def readable() -> bool:
        nonlocal poller, polled
        sock = inner.socket()
        if sock is None:
            return False
        fd = sock.fileno()
        if fd < 0:
            return False
        if poller is None or polled != fd:
            poller, polled = select.poll(), fd
            poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))

    def loop_read(max_packets: int = 1) -> paho.MQTTErrorCode:
        rc = read_one(max_packets)
        for _ in range(READ_BURST - 1):
            if rc != paho.MQTT_ERR_SUCCESS or not readable():
                break
            rc = read_one(max_packets)
        return rc

    inner.loop_read = loop_read  # type: ignore[method-assign]


def paho_client(client: aiomqtt.Client) -> paho.Client:
    """The paho client under an aiomqtt client: its private `_client`, the one way to paho's
    manual acknowledgement (aiomqtt has no public one). pyproject pins aiomqtt to the tested
    range, and tests/test_connectors_mqtt.py checks this on the installed version.

    Raises:
        RuntimeError: the installed aiomqtt keeps no paho client there (a version outside the
            pinned range).
    """
    inner = getattr(client, "_client", None)
    if not isinstance(inner, paho.Client):
        raise RuntimeError(
            f"aiomqtt {aiomqtt.__version__} keeps no paho client in `Client._client`; "
            "manual acknowledgement needs the pinned aiomqtt (see pyproject.toml)"
        )
    return inner


def _connect_error(
    error: aiomqtt.MqttError, config: BrokerConfig, protocol: Protocol
) -> MqttConnectionError:
    """Our exception for an aiomqtt connect failure."""
    if isinstance(error, MqttConnectError):
        return ConnectRefusedError(_reason_value(error.rc), str(error))
    # aiomqtt raises socket errors `from None`; the OSError is still the context. A
    # TimeoutError (an OSError too) is aiomqtt's wait for CONNACK running out.
    context = error.__context__
    if isinstance(context, OSError) and not isinstance(context, TimeoutError):
        return BrokerUnreachableError(f"{config.host}:{config.port}: {error}")
    return MqttConnectionError(f"no CONNACK over MQTT {protocol}: {error}")


def _worth_another_protocol(error: MqttConnectionError) -> bool:
    # An unreachable broker, or a refusal for any reason but the protocol (credentials, server
    # busy), would repeat under another version; an explicit version refusal, or a broker that
    # chokes on a v5 CONNECT and never answers, may not.
    if isinstance(error, BrokerUnreachableError):
        return False
    if isinstance(error, ConnectRefusedError):
        return is_protocol_refusal(error.reason_code)
    return True


def _reason_value(code: Any) -> int:
    # paho gives ReasonCode objects for v5 and plain ints for 3.1.1.
    return int(getattr(code, "value", code))


def _connect_properties(session_expiry_s: int, receive_maximum: int | None) -> Properties | None:
    if session_expiry_s == 0 and receive_maximum is None:
        return None  # the protocol's defaults
    properties = Properties(PacketTypes.CONNECT)
    if session_expiry_s:  # 0 is the protocol default: the session ends with the connection
        properties.SessionExpiryInterval = session_expiry_s
    if receive_maximum is not None:
        properties.ReceiveMaximum = receive_maximum
    return properties


def tls_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The TLS context of `config` (None without TLS); TlsOptionsError naming the file and the
    cause when a CA, certificate or key cannot be read or used. Call it before connecting to
    check the options once, at start."""
    if not config.tls:
        return None
    try:
        context = ssl.create_default_context(cafile=config.ca_file)
    except (OSError, ssl.SSLError) as error:
        raise TlsOptionsError(f"ca_file {config.ca_file}: {_ssl_cause(error)}") from None
    if config.cert_file is not None:
        try:
            context.load_cert_chain(config.cert_file, config.key_file)
        except (OSError, ssl.SSLError) as error:
            raise TlsOptionsError(
                f"cert_file {config.cert_file} / key_file {config.key_file}: {_ssl_cause(error)}"
            ) from None
    return context


def _ssl_cause(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: delay ~ U(0, min(cap, base · 2^attempt)).

    A connection that stayed up `stable_after_s` resets the attempt count, so a broker that
    accepts and then immediately drops us still backs off instead of spinning.
    """

    base_s: float = 0.5
    cap_s: float = 30.0
    stable_after_s: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {self.base_s}, {self.cap_s}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before reconnect attempt `attempt` (0-based)."""
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(attempt, 62))
        return rng.uniform(0.0, ceiling)


Session = Callable[[MqttConnection], Awaitable[None]]
FailureHook = Callable[[MqttConnectionError], None]
REMINDER_S: Final = 60.0  # while the broker stays out of reach, a warning this often at most


async def run_with_reconnect(
    config: BrokerConfig,
    on_connected: Session,
    *,
    presence: Presence | None = None,
    backoff: Backoff | None = None,
    max_failures: int | None = None,
    rng: random.Random | None = None,
    on_failure: FailureHook | None = None,
) -> None:
    """Run `on_connected(connection)` on every successful connection until it returns.

    `on_connected` is a session: subscribe, re-publish pending work, then consume messages. When
    it returns, the connection closes cleanly and this function returns. When the link fails
    (it raises MqttConnectionError, alone or inside an ExceptionGroup from a TaskGroup), the
    connection is dropped, `on_failure(error)` is called, a jittered backoff passes, and a new
    connection runs a new session. After `max_failures` consecutive failures (None: never) the
    last error is raised. Any other exception propagates unchanged; cancel the task to stop.

    Each failure is logged as `mqtt.reconnect_scheduled`: at warning level for the first failure
    of an outage and then every `REMINDER_S` while it lasts, at debug level otherwise, so a
    broker that never answers is reported once, clearly, and then only now and then.
    """
    config = config.with_client_id()
    backoff = backoff or Backoff()
    rng = rng or random.Random()
    failures = 0
    preferred: Protocol | None = None
    outage = _Outage()
    while True:
        session = _SupervisedSession(on_connected)
        try:
            async with MqttConnection(
                config, presence=presence, preferred_protocol=preferred
            ) as connection:
                preferred = connection.protocol
                await session.run(connection)
            return
        except* MqttConnectionError as group:
            error = _first_leaf(group)
        if session.uptime_s() >= backoff.stable_after_s:
            failures = 0
        if session.uptime_s() > 0.0:  # it was connected: a new outage begins
            outage = _Outage()
        failures += 1
        if on_failure is not None:
            on_failure(error)
        if max_failures is not None and failures > max_failures:
            log.error("mqtt.giving_up", failures=failures - 1, error=str(error))
            raise error
        delay_s = backoff.delay(failures - 1, rng)
        report = log.warning if outage.remind() else log.debug
        report(
            "mqtt.reconnect_scheduled",
            host=config.host,
            port=config.port,
            attempt=failures,
            delay_s=round(delay_s, 3),
            error=str(error),
            uptime_s=round(session.uptime_s(), 3),
            down_s=round(outage.seconds(), 3),
        )
        await asyncio.sleep(delay_s)


class _Outage:
    """How long the broker has been out of reach, and whether it is time to say so again."""

    def __init__(self) -> None:
        self._since = time.monotonic()
        self._said: float | None = None

    def seconds(self) -> float:
        return time.monotonic() - self._since

    def remind(self) -> bool:
        now = time.monotonic()
        if self._said is None or now - self._said >= REMINDER_S:
            self._said = now
            return True
        return False


class _SupervisedSession:
    """Runs one session and remembers how long its connection lived."""

    def __init__(self, on_connected: Session) -> None:
        self._on_connected = on_connected
        self._started: float | None = None

    async def run(self, connection: MqttConnection) -> None:
        self._started = time.monotonic()
        await self._on_connected(connection)

    def uptime_s(self) -> float:
        return 0.0 if self._started is None else time.monotonic() - self._started


def _first_leaf(group: BaseExceptionGroup[MqttConnectionError]) -> MqttConnectionError:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
