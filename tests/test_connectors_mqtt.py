"""The MQTT client against real brokers: Mosquitto (v5 and 3.1.1) and amqtt (3.1.1 only)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from connectors.mqtt import (
    Backoff,
    BrokerConfig,
    BrokerUnreachableError,
    ConnectionLostError,
    ConnectRefusedError,
    IncomingMessage,
    MqttConnection,
    MqttConnectionError,
    Presence,
    SubscribeRefusedError,
    is_protocol_refusal,
    protocol_candidates,
    run_with_reconnect,
)
from connectors.schemas import Reading, Status, decode, encode
from connectors.topics import Topics
from tests.brokers import (
    MosquittoBroker,
    MosquittoOptions,
    amqtt_broker,
    free_port,
    generate_test_pki,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 10.0  # upper bound of every wait on the broker; the happy path takes milliseconds
FAST_BACKOFF = Backoff(base_s=0.05, cap_s=0.2, stable_after_s=1.0)
topics = Topics()


def reading(round_: int, value: float = 1.0) -> Reading:
    return Reading(
        experiment="exp1", round=round_, node="X", value=value, seq=round_, device_id="s1", at=1.0
    )


def config_for(port: int, **overrides: object) -> BrokerConfig:
    return BrokerConfig(port=port, timeout_s=5.0, **overrides)  # type: ignore[arg-type]


async def next_message(messages: AsyncIterator[IncomingMessage]) -> IncomingMessage:
    async with asyncio.timeout(WAIT_S):
        return await anext(messages)


async def retained_status(port: int, agent_id: str) -> Status:
    """What a newcomer reads on an agent's status topic."""
    async with MqttConnection(config_for(port)) as observer:
        await observer.subscribe(topics.status(agent_id))
        message = await next_message(observer.messages())
    assert message.retain
    return decode(message.payload, Status)


async def publish_once(port: int, topic: str, payload: bytes) -> None:
    async with MqttConnection(config_for(port)) as publisher:
        await publisher.publish(topic, payload, qos=1)


# ---------------------------------------------------------------------------------------------
# one connection, Mosquitto


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["auto", "5", "3.1.1"])
async def test_qos1_publish_subscribe_round_trip(mosquitto: MosquittoBroker, protocol: str) -> None:
    config = config_for(mosquitto.port, protocol=protocol)
    async with MqttConnection(config) as subscriber, MqttConnection(config) as publisher:
        assert subscriber.protocol == ("5" if protocol == "auto" else protocol)
        await subscriber.subscribe(topics.device_filter("reading"), qos=1)
        sent = [reading(round_) for round_ in range(3)]
        for message in sent:
            await publisher.publish_message(topics.reading("exp1", "s1"), message, qos=1)
        incoming = subscriber.messages()
        received = [await next_message(incoming) for _ in sent]
    assert [decode(message.payload, Reading) for message in received] == sent
    assert {(message.topic, message.qos, message.retain) for message in received} == {
        ("cbo/exp1/s1/reading", 1, False)
    }


@pytest.mark.integration
async def test_online_status_is_retained_and_a_clean_exit_leaves_offline(
    mosquitto: MosquittoBroker,
) -> None:
    presence = Presence("agent-1", ("exp1", "exp2"), software_version="1.2.3")
    async with MqttConnection(config_for(mosquitto.port), presence=presence):
        online = await retained_status(mosquitto.port, "agent-1")
    offline = await retained_status(mosquitto.port, "agent-1")
    assert (online.state, online.experiments, online.software_version) == (
        "online",
        ["exp1", "exp2"],
        "1.2.3",
    )
    assert offline.state == "offline"


DYING_AGENT = """
import asyncio, sys
from connectors.mqtt import BrokerConfig, MqttConnection, Presence

async def main() -> None:
    config = BrokerConfig(port=int(sys.argv[1]), protocol=sys.argv[3])
    async with MqttConnection(config, presence=Presence(sys.argv[2], ("exp1",))):
        print("AGENT-CONNECTED", flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


async def start_agent_process(
    port: int, agent_id: str, protocol: str
) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DYING_AGENT,
        str(port),
        agent_id,
        protocol,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    async with asyncio.timeout(WAIT_S):
        while (line := await process.stdout.readline()) != b"AGENT-CONNECTED\n":
            if not line:
                raise AssertionError("agent process exited before connecting")
    return process


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_last_will_marks_a_killed_agent_offline(
    mosquitto: MosquittoBroker, protocol: str
) -> None:
    async with MqttConnection(config_for(mosquitto.port)) as observer:
        await observer.subscribe(topics.status("doomed"))
        updates = observer.messages()
        process = await start_agent_process(mosquitto.port, "doomed", protocol)
        try:
            online = decode((await next_message(updates)).payload, Status)
            process.kill()  # SIGKILL: no DISCONNECT, no goodbye; the kernel closes the socket
            await asyncio.wait_for(process.wait(), WAIT_S)
            will = decode((await next_message(updates)).payload, Status)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert (online.agent_id, online.state) == ("doomed", "online")
    assert (will.agent_id, will.state, will.experiments) == ("doomed", "offline", ["exp1"])
    assert (await retained_status(mosquitto.port, "doomed")).state == "offline"


async def test_using_a_closed_connection_raises() -> None:
    connection = MqttConnection(config_for(free_port()))
    with pytest.raises(MqttConnectionError):
        await connection.publish("cbo/exp1/reading", b"{}")
    with pytest.raises(MqttConnectionError):
        await connection.subscribe("cbo/#")


@pytest.mark.integration
async def test_refused_credentials_raise_without_protocol_fallback(
    mosquitto_factory, tmp_path: Path
) -> None:
    password_file = tmp_path / "passwords"
    subprocess.run(
        ["mosquitto_passwd", "-b", "-c", str(password_file), "agent", "right"],
        check=True,
        timeout=WAIT_S,
    )
    options = MosquittoOptions(allow_anonymous=False, password_file=password_file)
    broker = mosquitto_factory(options)
    good = config_for(broker.port, username="agent", password="right")
    async with MqttConnection(good) as connection:
        assert connection.protocol == "5"
    bad = config_for(broker.port, username="agent", password="wrong")
    with capture_logs() as events, pytest.raises(ConnectRefusedError) as refused:
        async with MqttConnection(bad):
            pass
    assert not is_protocol_refusal(refused.value.reason_code)
    assert "mqtt.protocol_fallback" not in [event["event"] for event in events]


@pytest.mark.integration
async def test_a_subscription_the_broker_refuses_raises() -> None:
    # Mosquitto 2.0 grants every subscription and filters on delivery; amqtt's taboo plugin
    # answers SUBACK 0x80 for its taboo topics.
    taboo = {"amqtt.plugins.topic_checking.TopicTabooPlugin": {}}
    async with (
        amqtt_broker(plugins=taboo) as port,
        MqttConnection(config_for(port, protocol="3.1.1")) as connection,
    ):
        await connection.subscribe("cbo/exp1/reading")
        with pytest.raises(SubscribeRefusedError):
            await connection.subscribe("prohibited")


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_a_persistent_session_keeps_subscriptions_and_queued_messages(
    mosquitto: MosquittoBroker, protocol: str
) -> None:
    persistent = config_for(
        mosquitto.port,
        protocol=protocol,
        client_id=f"persistent-{protocol}",
        clean_start=False,
        session_expiry_s=60,
    )
    async with MqttConnection(persistent) as agent:
        await agent.subscribe(topics.reading("exp1", "s1"), qos=1)
    # While the agent is away, the broker queues QoS 1 messages for its session.
    await publish_once(mosquitto.port, topics.reading("exp1", "s1"), encode(reading(5)))
    async with MqttConnection(persistent) as agent:  # no subscribe this time
        queued = await next_message(agent.messages())
    assert decode(queued.payload) == reading(5)


@pytest.mark.integration
async def test_tls_with_the_test_ca_and_only_with_it(mosquitto_factory, tmp_path: Path) -> None:
    try:
        pki = generate_test_pki(tmp_path / "pki")
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    broker = mosquitto_factory(MosquittoOptions(tls=pki))
    url = f"mqtts://127.0.0.1:{broker.tls_port}"
    trusted = BrokerConfig.from_url(url, ca_file=str(pki.ca_file), timeout_s=5.0)
    async with MqttConnection(trusted) as secure:
        await secure.subscribe(topics.reading("exp1", "s1"))
        await secure.publish_message(topics.reading("exp1", "s1"), reading(3))
        assert decode((await next_message(secure.messages())).payload) == reading(3)
    # The system trust store does not know the test CA: the handshake fails, no fallback.
    untrusted = BrokerConfig.from_url(url, timeout_s=5.0)
    with capture_logs() as events, pytest.raises(BrokerUnreachableError):
        async with MqttConnection(untrusted):
            pass
    assert "mqtt.protocol_fallback" not in [event["event"] for event in events]


# ---------------------------------------------------------------------------------------------
# protocol fallback


def test_protocol_candidates() -> None:
    assert protocol_candidates("auto") == ("5", "3.1.1")
    assert protocol_candidates("auto", preferred="5") == ("5", "3.1.1")
    assert protocol_candidates("auto", preferred="3.1.1") == ("3.1.1", "5")
    assert protocol_candidates("5", preferred="3.1.1") == ("5",)
    assert protocol_candidates("3.1.1") == ("3.1.1",)


def test_only_version_refusals_count_as_protocol_refusals() -> None:
    assert is_protocol_refusal(1)  # MQTT 3.1.1: unacceptable protocol version
    assert is_protocol_refusal(0x84)  # MQTT 5: unsupported protocol version
    for other in (0, 2, 3, 4, 5, 0x80, 0x86, 0x87, 0x88, 0x8A):
        assert not is_protocol_refusal(other)


@pytest.mark.integration
@pytest.mark.parametrize("with_will", [False, True], ids=["refuses-v5", "chokes-on-v5-will"])
async def test_auto_falls_back_to_311_on_a_311_only_broker(with_will: bool) -> None:
    # amqtt refuses a plain v5 CONNECT with code 1, but never answers one that carries a will:
    # the first case falls back at once, the second after the probe timeout.
    presence = Presence("agent-amqtt", ("exp1",)) if with_will else None
    async with amqtt_broker() as port:
        config = config_for(port, probe_timeout_s=0.5)
        started = time.monotonic()
        async with (
            MqttConnection(config, presence=presence) as agent,
            MqttConnection(config) as sensor,
        ):
            connect_s = time.monotonic() - started
            assert (agent.protocol, sensor.protocol) == ("3.1.1", "3.1.1")
            await agent.subscribe(topics.reading("exp1", "s1"))
            await sensor.publish_message(topics.reading("exp1", "s1"), reading(7))
            received = await next_message(agent.messages())
    assert decode(received.payload, Reading) == reading(7)
    assert connect_s < 3.0


@pytest.mark.integration
async def test_v5_only_is_refused_by_a_311_only_broker() -> None:
    async with amqtt_broker() as port:
        with pytest.raises(ConnectRefusedError) as refused:
            async with MqttConnection(config_for(port, protocol="5")):
                pass
    assert is_protocol_refusal(refused.value.reason_code)


# ---------------------------------------------------------------------------------------------
# reconnecting supervisor


@pytest.mark.integration
async def test_messages_flow_again_after_the_broker_restarts(mosquitto: MosquittoBroker) -> None:
    connections: asyncio.Queue[str] = asyncio.Queue()
    received: asyncio.Queue[IncomingMessage] = asyncio.Queue()

    async def session(connection: MqttConnection) -> None:
        await connection.subscribe(topics.device_filter("reading"))
        await connections.put(connection.client_id)
        async for message in connection.messages():
            await received.put(message)

    presence = Presence("agent-r", ("exp1",))
    supervisor = asyncio.create_task(
        run_with_reconnect(
            config_for(mosquitto.port), session, presence=presence, backoff=FAST_BACKOFF
        )
    )
    try:
        async with asyncio.timeout(WAIT_S):
            first_client_id = await connections.get()
            await publish_once(mosquitto.port, topics.reading("exp1", "s1"), encode(reading(1)))
            assert decode((await received.get()).payload) == reading(1)

            await asyncio.to_thread(mosquitto.restart)  # retained state is gone with it

            assert await connections.get() == first_client_id  # same identity, new session
            await publish_once(mosquitto.port, topics.reading("exp1", "s1"), encode(reading(2)))
            assert decode((await received.get()).payload) == reading(2)
            assert (await retained_status(mosquitto.port, "agent-r")).state == "online"
    finally:
        supervisor.cancel()
        with pytest.raises(asyncio.CancelledError):
            await supervisor
    assert (await retained_status(mosquitto.port, "agent-r")).state == "offline"


@pytest.mark.integration
async def test_a_session_that_returns_ends_the_supervisor(mosquitto: MosquittoBroker) -> None:
    sessions = 0

    async def session(connection: MqttConnection) -> None:
        nonlocal sessions
        sessions += 1

    async with asyncio.timeout(WAIT_S):
        await run_with_reconnect(config_for(mosquitto.port), session, backoff=FAST_BACKOFF)
    assert sessions == 1


@pytest.mark.integration
async def test_link_failures_inside_a_task_group_are_retried(mosquitto: MosquittoBroker) -> None:
    sessions = 0

    async def lose_the_link() -> None:
        raise ConnectionLostError("simulated")

    async def session(connection: MqttConnection) -> None:
        nonlocal sessions
        sessions += 1
        if sessions == 1:
            async with asyncio.TaskGroup() as group:
                group.create_task(lose_the_link())
                group.create_task(asyncio.sleep(WAIT_S))

    async with asyncio.timeout(WAIT_S):
        await run_with_reconnect(config_for(mosquitto.port), session, backoff=FAST_BACKOFF)
    assert sessions == 2


@pytest.mark.integration
async def test_other_errors_are_not_retried(mosquitto: MosquittoBroker) -> None:
    sessions = 0

    async def session(connection: MqttConnection) -> None:
        nonlocal sessions
        sessions += 1
        raise KeyError("a bug, not a broken link")

    with pytest.raises(KeyError):
        async with asyncio.timeout(WAIT_S):
            await run_with_reconnect(config_for(mosquitto.port), session, backoff=FAST_BACKOFF)
    assert sessions == 1


@pytest.mark.integration
async def test_gives_up_after_max_failures_when_nothing_listens() -> None:
    attempts = 0

    async def session(connection: MqttConnection) -> None:
        nonlocal attempts
        attempts += 1

    started = time.monotonic()
    with capture_logs() as events, pytest.raises(BrokerUnreachableError):
        async with asyncio.timeout(WAIT_S):
            await run_with_reconnect(
                config_for(free_port()), session, backoff=FAST_BACKOFF, max_failures=3
            )
    assert attempts == 0
    logged = [event["event"] for event in events]
    assert logged.count("mqtt.reconnect_scheduled") == 3
    assert "mqtt.protocol_fallback" not in logged  # no point asking a closed port for 3.1.1
    assert time.monotonic() - started < 3 * FAST_BACKOFF.cap_s + 2.0


@given(
    base=st.floats(min_value=1e-3, max_value=5.0),
    factor=st.floats(min_value=1.0, max_value=100.0),
    attempt=st.integers(min_value=0, max_value=10_000),
    seed=st.integers(),
)
def test_backoff_delay_stays_within_its_full_jitter_window(
    base: float, factor: float, attempt: int, seed: int
) -> None:
    backoff = Backoff(base_s=base, cap_s=base * factor)
    delay = backoff.delay(attempt, random.Random(seed))
    assert 0.0 <= delay <= min(backoff.cap_s, base * 2.0 ** min(attempt, 62))


def test_backoff_jitter_spreads_over_the_whole_window() -> None:
    backoff = Backoff(base_s=1.0, cap_s=8.0)
    rng = random.Random(0)
    delays = [backoff.delay(10, rng) for _ in range(2000)]
    assert max(delays) > 7.5 and min(delays) < 0.5  # capped at 8 s, and full jitter reaches 0
    assert 3.5 < sum(delays) / len(delays) < 4.5


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(base_s=2.0, cap_s=1.0)
    with pytest.raises(ValueError):
        Backoff(base_s=0.0)


# ---------------------------------------------------------------------------------------------
# configuration


def test_broker_config_from_url() -> None:
    plain = BrokerConfig.from_url("mqtt://broker.example:1884")
    assert (plain.host, plain.port, plain.tls, plain.username) == (
        "broker.example",
        1884,
        False,
        None,
    )
    secure = BrokerConfig.from_url("mqtts://agent:p%40ss%3Aword@[::1]", client_id="a1")
    assert (secure.host, secure.port, secure.tls) == ("::1", 8883, True)
    assert secure.username == "agent"
    assert secure.password is not None and secure.password.get_secret_value() == "p@ss:word"
    assert "p@ss" not in repr(secure)
    assert secure.client_id == "a1"


@pytest.mark.parametrize(
    "url",
    ["http://host", "mqtt://", "mqtt://host/path", "mqtt://host?x=1", "mqtt://host:99999"],
)
def test_broker_config_refuses_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        BrokerConfig.from_url(url)


def test_broker_config_refuses_inconsistent_settings() -> None:
    with pytest.raises(ValueError):
        BrokerConfig(clean_start=False)  # a persistent session needs a fixed client id
    with pytest.raises(ValueError):
        BrokerConfig(ca_file="/ca.pem")  # TLS files without TLS
    with pytest.raises(ValueError):
        BrokerConfig(tls=True, cert_file="/c.pem")  # a certificate without its key
    with pytest.raises(ValueError):
        BrokerConfig(protocol="4")  # type: ignore[arg-type]


def test_generated_client_ids_are_stable_once_set() -> None:
    config = BrokerConfig().with_client_id()
    assert config.client_id is not None and config.client_id.startswith("cbo-")
    assert config.with_client_id() is config
    assert BrokerConfig().with_client_id().client_id != config.client_id


def _publish_burst(port: int, payloads: list[bytes]) -> None:
    """Publish at QoS 0 (no in-flight window) from a blocking paho client, the last at QoS 1:
    once its PUBACK is in, the broker has them all."""
    import paho.mqtt.client as paho

    client = paho.Client(paho.CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        topic = topics.reading("exp1", "s1")
        for payload in payloads[:-1]:
            client.publish(topic, payload, qos=0)
        client.publish(topic, payloads[-1], qos=1).wait_for_publish(WAIT_S)
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.integration
async def test_a_burst_already_on_the_socket_comes_in_a_batch_or_two_in_order(
    mosquitto: MosquittoBroker,
) -> None:
    """300 messages wait on the subscriber's socket while its event loop is blocked; once the
    loop runs, `message_batches` hands them over in arrival order in at most a few batches
    (paho reads every packet already on the socket per readable event, and the batch takes all
    that aiomqtt queued). One packet per event-loop turn would take about 300 batches."""
    config = config_for(mosquitto.port)
    async with MqttConnection(config) as subscriber:
        await subscriber.subscribe(topics.device_filter("reading"), qos=1)
        batches = subscriber.message_batches()
        # published from another client while this event loop is blocked, so the burst waits
        # on the subscriber's socket, not in aiomqtt's queue
        _publish_burst(mosquitto.port, [encode(reading(round_)) for round_ in range(301)])
        time.sleep(0.3)  # still blocked: the broker writes the burst to the subscriber's socket
        received: list[list[IncomingMessage]] = []
        async with asyncio.timeout(WAIT_S):
            while sum(map(len, received)) < 301:
                received.append(await anext(batches))
    rounds = [decode(m.payload, Reading).round for batch in received for m in batch]
    assert rounds == list(range(301))
    assert len(received) <= 3, [len(batch) for batch in received]


# ---------------------------------------------------------------------------------------------
# manual acknowledgement: aiomqtt's private paho client (pinned range, see pyproject.toml)


async def test_installed_aiomqtt_keeps_the_paho_client_manual_acks_need() -> None:
    """Fails loudly when an aiomqtt outside the pinned range moves its private `_client`."""
    import aiomqtt
    import paho.mqtt.client as paho
    from packaging.requirements import Requirement

    from connectors.mqtt import paho_client

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    line = next(x for x in pyproject.splitlines() if x.strip().startswith('"aiomqtt'))
    assert Requirement(line.strip().strip(",").strip('"')).specifier.contains(aiomqtt.__version__)
    client = aiomqtt.Client("127.0.0.1")
    inner = paho_client(client)
    assert isinstance(inner, paho.Client)
    assert callable(inner.ack) and callable(inner.manual_ack_set)
    # `message_batches` takes what aiomqtt queued from its private `_queue`, and burst reading
    # replaces paho's `loop_read` on the instance (what aiomqtt's reader callback calls)
    assert isinstance(client._queue, asyncio.Queue)
    assert callable(inner.loop_read) and callable(inner.socket)


def test_paho_client_says_which_aiomqtt_lacks_it() -> None:
    from connectors.mqtt import paho_client

    with pytest.raises(RuntimeError, match="keeps no paho client"):
        paho_client(object())  # type: ignore[arg-type]


@pytest.mark.integration
async def test_a_message_not_acknowledged_is_redelivered_and_an_acknowledged_one_is_not(
    mosquitto: MosquittoBroker,
) -> None:
    """With manual acks and a persistent session, only what was acked is gone after a reconnect."""
    session = config_for(
        mosquitto.port,
        protocol="5",
        client_id="manual-ack-test",
        clean_start=False,
        session_expiry_s=60,
        manual_ack=True,
    )
    topic = topics.reading("exp1", "s1")
    async with MqttConnection(session) as subscriber:
        await subscriber.subscribe(topics.device_filter("reading"), qos=1)
    sent = [reading(0), reading(1)]
    async with MqttConnection(config_for(mosquitto.port)) as publisher:
        for message in sent:
            await publisher.publish_message(topic, message, qos=1)
    async with MqttConnection(session) as subscriber:
        incoming = subscriber.messages()
        first, second = await next_message(incoming), await next_message(incoming)
        assert subscriber.ack(first)  # the second is received and never acknowledged
        await asyncio.sleep(0.2)  # the PUBACK leaves before the connection closes
    async with MqttConnection(session) as subscriber:
        again = await next_message(subscriber.messages())
    assert decode(again.payload, Reading) == decode(second.payload, Reading)
    assert decode(first.payload, Reading) != decode(second.payload, Reading)
