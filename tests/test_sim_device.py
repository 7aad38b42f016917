"""The simulator device against a real Mosquitto: acks, readings, oracle, exactly-once, faults."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import ValidationError
from structlog.testing import capture_logs

from connectors.mqtt import (
    Backoff,
    BrokerConfig,
    ConnectionLostError,
    MqttConnection,
    run_with_reconnect,
)
from connectors.schemas import (
    Ack,
    Action,
    DeadLetter,
    MessageModel,
    Oracle,
    Reading,
    decode,
    encode,
)
from connectors.topics import Topics
from sim._device_plan import Actuator
from sim.base import Environment
from sim.device import DeviceSettings, SimulatorDevice, run_device
from sim.psagraph import PSAGraph
from sim.registry import make_environment
from sim.toygraph import ToyGraph
from tests.brokers import MosquittoBroker, MosquittoOptions

WAIT_S = 10.0  # bound of every wait; the happy path takes milliseconds
FAST_BACKOFF = Backoff(base_s=0.05, cap_s=0.2, stable_after_s=1.0)
EXPERIMENT = "exp1"
DEVICE = "sim-exp1"  # the default device id of experiment exp1
topics = Topics()


def settings(**overrides: Any) -> DeviceSettings:
    return DeviceSettings(**({"experiment": EXPERIMENT, "seq_start": 0} | overrides))


def action(round_: int, intervention: dict[str, float], kind: str = "hard") -> Action:
    return Action.issue(EXPERIMENT, round_, intervention, kind)  # type: ignore[arg-type]


class Observer:
    """Watches `cbo/exp1/#` (reconnecting, with a persistent session) and publishes actions."""

    def __init__(self, port: int) -> None:
        self.config = BrokerConfig(
            port=port,
            timeout_s=5.0,
            client_id="observer",
            clean_start=False,
            session_expiry_s=600,
        )
        self.received: list[tuple[str, MessageModel]] = []
        self.ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._connection: MqttConnection | None = None

    async def _session(self, connection: MqttConnection) -> None:
        await connection.subscribe(f"cbo/{EXPERIMENT}/#", qos=1)
        self._connection = connection
        self.ready.set()
        try:
            async for message in connection.messages():
                kind = topics.parse(message.topic).kind
                if kind != "action":
                    self.received.append((kind, decode(message.payload)))
                    self._changed.set()
        finally:
            self.ready.clear()
            self._connection = None

    def of(self, kind: str, round_: int | None = None) -> list[Any]:
        """Messages of one kind (and round) received so far, in arrival order."""
        return [
            message
            for got, message in self.received
            if got == kind and (round_ is None or getattr(message, "round", None) == round_)
        ]

    async def wait_for(self, condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    async def publish(self, message: MessageModel | bytes) -> None:
        async with asyncio.timeout(WAIT_S):
            await self.ready.wait()
        assert self._connection is not None
        topic = topics.action(EXPERIMENT, DEVICE)
        if isinstance(message, bytes):
            await self._connection.publish(topic, message)
        else:
            await self._connection.publish_message(topic, message)


@contextlib.asynccontextmanager
async def observing(port: int) -> AsyncIterator[Observer]:
    observer = Observer(port)
    task = asyncio.create_task(
        run_with_reconnect(observer.config, observer._session, backoff=FAST_BACKOFF)
    )
    try:
        async with asyncio.timeout(WAIT_S):
            await observer.ready.wait()
        yield observer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def running(
    env: Environment, port: int, device_settings: DeviceSettings
) -> AsyncIterator[SimulatorDevice]:
    device = SimulatorDevice(
        env, BrokerConfig(port=port, timeout_s=5.0), device_settings, backoff=FAST_BACKOFF
    )
    task = asyncio.create_task(device.run())
    try:
        async with asyncio.timeout(WAIT_S):
            await device.ready.wait()
        yield device
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def count_steps(env: Environment, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts env.step calls (in a one-element list)."""
    calls = [0]
    step = env.step

    def counting_step(*args: Any, **kwargs: Any) -> dict[str, float]:
        calls[0] += 1
        return step(*args, **kwargs)

    monkeypatch.setattr(env, "step", counting_step)
    return calls


def readings_done(observer: Observer, env: Environment, round_: int) -> Callable[[], bool]:
    return lambda: {r.node for r in observer.of("reading", round_)} == set(env.node_names)


# ---------------------------------------------------------------------------------------------
# the happy path


@pytest.mark.integration
@pytest.mark.parametrize("env_name", ["toygraph", "sir"])
async def test_an_action_is_acked_read_and_scored(
    mosquitto: MosquittoBroker, env_name: str
) -> None:
    env = make_environment(env_name)
    interventions = (
        [{"do_X1": -3.2}, {"do_X0": 1.0}] if env_name == "toygraph" else env.initial_design(0)[:2]
    )
    with capture_logs() as events:
        async with observing(mosquitto.port) as observer, running(env, mosquitto.port, settings()):
            sent = [action(3 + i, x, env.intervention_type) for i, x in enumerate(interventions)]
            for message in sent:
                await observer.publish(message)
                await observer.wait_for(readings_done(observer, env, message.round))
                await observer.wait_for(lambda m=message: len(observer.of("oracle", m.round)) == 1)

    for seq, message in enumerate(sent):
        (ack,) = observer.of("ack", message.round)
        assert isinstance(ack, Ack)
        assert (ack.action_id, ack.status, ack.reason, ack.device_id) == (
            message.action_id,
            "applied",
            None,
            "sim-exp1",
        )
        assert ack.applied == pytest.approx(message.intervention)
        readings = observer.of("reading", message.round)
        assert sorted(r.node for r in readings) == sorted(env.node_names)  # reward node, parts
        assert all(isinstance(r, Reading) and r.seq == seq for r in readings)
        assert {r.device_id for r in readings} == {"sim-exp1"}
        (oracle,) = observer.of("oracle", message.round)
        assert isinstance(oracle, Oracle)
        assert oracle.action_id == message.action_id
        assert oracle.expected_reward == env.expected_reward(message.intervention)
        assert oracle.optimum == env.optimum.value
    if env_name == "toygraph":  # do(X1 = -3.2): the sensor of X1 reads the set value
        assert next(r.value for r in observer.of("reading", 3) if r.node == "X1") == -3.2

    logged = Counter(e["event"] for e in events if e.get("round") == 3)
    assert logged["device.action_received"] == 1
    assert logged["device.ack_published"] == 1
    assert logged["device.oracle_published"] == 1
    assert logged["device.reading_published"] == len(env.node_names)
    assert all(e["experiment"] == EXPERIMENT for e in events if e["event"].startswith("device."))


# ---------------------------------------------------------------------------------------------
# exactly once, rejections, dead letters


@pytest.mark.integration
async def test_a_repeated_action_id_is_acked_again_but_applied_once(
    mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = ToyGraph()
    steps = count_steps(env, monkeypatch)
    first = action(0, {"do_X1": 2.0})
    async with observing(mosquitto.port) as observer, running(env, mosquitto.port, settings()):
        await observer.publish(first)
        await observer.wait_for(readings_done(observer, env, 0))
        await observer.publish(first)  # a QoS 1 redelivery look-alike
        await observer.publish(first.next_attempt())  # the agent re-publishes after a crash
        await observer.wait_for(lambda: len(observer.of("ack", 0)) == 3)
        fence = action(1, {})  # later in the device's queue than both copies
        await observer.publish(fence)
        await observer.wait_for(readings_done(observer, env, 1))

    acks = observer.of("ack", 0)
    assert acks[0] == acks[1] == acks[2]  # the very same ack, `at` included
    assert acks[0].status == "applied"
    assert len(observer.of("reading", 0)) == len(env.node_names)  # no second set of readings
    assert len(observer.of("oracle", 0)) == 1
    assert steps[0] == 2  # round 0 once, the fence once


@pytest.mark.integration
async def test_fencing_an_older_epoch_is_dropped_and_a_new_owner_gets_the_readings_again(
    mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = ToyGraph()
    steps = count_steps(env, monkeypatch)
    expires = time.time() + 60.0
    first = Action.issue(EXPERIMENT, 0, {"do_X1": 2.0}, expires_at=expires).with_epoch(4)
    stale = Action.issue(EXPERIMENT, 1, {"do_X1": 1.0}, expires_at=expires).with_epoch(3)
    with capture_logs() as events:
        async with (
            observing(mosquitto.port) as observer,
            running(env, mosquitto.port, settings()) as device,
        ):
            await observer.publish(first)
            await observer.wait_for(readings_done(observer, env, 0))
            await observer.publish(stale)  # a replica that lost the lease, still acting
            await observer.publish(first.next_attempt())  # same epoch: acked, nothing resent
            await observer.wait_for(lambda: len(observer.of("ack", 0)) == 2)
            await observer.publish(first.next_attempt().with_epoch(5))  # the new owner
            await observer.wait_for(
                lambda: len(observer.of("reading", 0)) == 2 * len(env.node_names)
            )
            await observer.publish(first.next_attempt().with_epoch(5))  # told once per epoch
            await observer.wait_for(lambda: len(observer.of("ack", 0)) == 4)
            fence = Action.issue(EXPERIMENT, 2, {}, expires_at=expires).with_epoch(5)
            await observer.publish(fence)
            await observer.wait_for(readings_done(observer, env, 2))
            assert (device.epoch_seen, device.stale_dropped) == (5, 1)

    assert observer.of("ack", 1) == [] and observer.of("reading", 1) == []  # never applied
    assert steps[0] == 2  # round 0 once, the fence once
    readings = observer.of("reading", 0)
    half = len(env.node_names)
    assert readings[:half] == readings[half:]  # the same readings, the same seq
    assert len(readings) == 2 * half
    assert [e["event"] for e in events].count("device.action_stale_epoch") == 1


@pytest.mark.integration
async def test_an_expired_action_is_refused_and_one_applied_in_time_is_acked_again(
    mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = ToyGraph()
    steps = count_steps(env, monkeypatch)
    now = time.time()
    expired = Action.issue(EXPERIMENT, 0, {"do_X1": 1.0}, expires_at=now - 1.0)
    legacy = action(1, {"do_X0": 0.5})  # protocol version 1: no expires_at, never expires
    soon = Action.issue(EXPERIMENT, 2, {"do_X1": 2.0}, expires_at=now + 1.0)
    assert encode(legacy).startswith(b'{"schema":"cbo.action","version":1,')
    async with observing(mosquitto.port) as observer, running(env, mosquitto.port, settings()):
        for message in (expired, legacy, soon):
            await observer.publish(message)
        await observer.wait_for(readings_done(observer, env, 1))
        await observer.wait_for(readings_done(observer, env, 2))
        await asyncio.sleep(max(0.0, soon.expires_at - time.time()) + 0.05)
        await observer.publish(soon.next_attempt())  # expired now, but applied in time
        await observer.wait_for(lambda: len(observer.of("ack", 2)) == 2)

    (refused,) = observer.of("ack", 0)
    assert (refused.status, refused.reason, refused.applied) == ("rejected", "expired", {})
    assert observer.of("reading", 0) == [] and observer.of("oracle", 0) == []
    assert [ack.status for ack in observer.of("ack", 1)] == ["applied"]
    first, again = observer.of("ack", 2)
    assert first == again and first.status == "applied"  # the same ack: the id is known
    assert len(observer.of("reading", 2)) == len(env.node_names)
    assert steps[0] == 2  # rounds 1 and 2, once each


@pytest.mark.integration
async def test_invalid_actions_are_rejected_with_a_reason_and_no_readings(
    mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = ToyGraph()
    steps = count_steps(env, monkeypatch)
    invalid = {
        "unknown action": action(0, {"do_Z": 1.0}),
        "outside": action(1, {"do_X1": 100.0}),
        "not an allowed target set": action(2, {"do_X0": 0.0, "do_X1": 0.0}),
        "hard interventions, not soft": action(3, {"do_X1": 0.0}, kind="soft"),
    }
    async with observing(mosquitto.port) as observer, running(env, mosquitto.port, settings()):
        for message in invalid.values():
            await observer.publish(message)
        await observer.wait_for(lambda: len(observer.of("ack")) == len(invalid))
        await observer.publish(action(4, {"do_X0": 0.5}))
        await observer.wait_for(readings_done(observer, env, 4))

    for (expected_reason, message), ack in zip(invalid.items(), observer.of("ack"), strict=False):
        assert (ack.action_id, ack.status, ack.applied) == (message.action_id, "rejected", {})
        assert expected_reason in ack.reason
    assert {r.round for r in observer.of("reading")} == {4}
    assert {o.round for o in observer.of("oracle")} == {4}
    assert steps[0] == 1


@pytest.mark.integration
async def test_bad_payloads_go_to_the_dead_letter_topic_and_the_device_carries_on(
    mosquitto: MosquittoBroker,
) -> None:
    env = ToyGraph()
    bad = {
        "malformed_json": b"{not json",
        "invalid": b'{"schema":"cbo.action","version":1,"experiment":"exp1","round":-1}',
        "wrong_schema": Reading(
            experiment=EXPERIMENT, round=0, node="X", value=1.0, seq=0, device_id="s", at=1.0
        ),
        "wrong_experiment": Action.issue("other", 0, {}),
    }
    async with observing(mosquitto.port) as observer, running(env, mosquitto.port, settings()):
        for payload in bad.values():
            await observer.publish(payload)
        await observer.wait_for(lambda: len(observer.of("deadletter")) == len(bad))
        await observer.publish(action(0, {"do_X1": 1.0}))
        await observer.wait_for(readings_done(observer, env, 0))

    letters = observer.of("deadletter")
    assert [letter.reason for letter in letters] == list(bad)
    assert all(isinstance(letter, DeadLetter) for letter in letters)
    assert {letter.topic for letter in letters} == {topics.action(EXPERIMENT, DEVICE)}
    assert letters[0].payload == "{not json"
    assert [ack.status for ack in observer.of("ack")] == ["applied"]


# ---------------------------------------------------------------------------------------------
# sensor faults and timing


@pytest.mark.integration
async def test_drops_and_duplicates_follow_the_rates_and_the_seed(
    mosquitto: MosquittoBroker,
) -> None:
    env = PSAGraph()  # 6 nodes
    config = settings(drop_rate=0.5, duplicate_rate=0.5, seed=7)
    sent = [action(i, {"do_aspirin": 0.5} if i % 2 else {}) for i in range(40)]
    # The same seed in a device without a broker says exactly what must arrive.
    twin = Actuator(PSAGraph(), "sim-exp1", config.noise(), config.seed, 0, None)
    expected = Counter(
        (message.round, planned.node, planned.seq)
        for message in sent
        for planned in twin.apply(message).readings
        for _ in range(planned.copies)
    )
    total = len(sent) * len(env.node_names)  # 240 readings planned
    unique = len({key for key in expected})
    duplicated = sum(1 for count in expected.values() if count == 2)
    assert 0.35 * total <= unique <= 0.65 * total
    assert 0.3 * unique <= duplicated <= 0.7 * unique

    async with observing(mosquitto.port) as observer, running(env, mosquitto.port, config):
        for message in sent:
            await observer.publish(message)
        await observer.wait_for(lambda: len(observer.of("reading")) >= expected.total())
        await observer.wait_for(lambda: len(observer.of("ack")) == len(sent))

    readings = observer.of("reading")
    assert Counter((r.round, r.node, r.seq) for r in readings) == expected
    by_identity: dict[tuple[str, int], set[tuple[int, float]]] = {}
    for r in readings:  # a duplicate repeats the round and the value under its seq
        by_identity.setdefault((r.node, r.seq), set()).add((r.round, r.value))
    assert all(len(variants) == 1 for variants in by_identity.values())


@pytest.mark.integration
async def test_delays_run_concurrently_and_do_not_hold_up_acks(
    mosquitto: MosquittoBroker,
) -> None:
    env = ToyGraph()
    async with (
        observing(mosquitto.port) as observer,
        running(env, mosquitto.port, settings(delay_s=0.5)),
    ):
        started = time.monotonic()
        await observer.publish(action(0, {"do_X1": 1.0}))
        await observer.publish(action(1, {"do_X1": 2.0}))
        await observer.wait_for(lambda: len(observer.of("ack")) == 2)
        assert observer.of("reading") == []  # the delay holds the readings, not the acks
        await observer.wait_for(readings_done(observer, env, 0))
        await observer.wait_for(readings_done(observer, env, 1))
        done_s = time.monotonic() - started

    # The device's own stamps time it without the broker's and the observer's latency.
    acks = {ack.round: ack.at for ack in observer.of("ack")}
    readings = observer.of("reading")
    assert acks[1] - acks[0] < 0.25
    assert all(r.at - acks[r.round] >= 0.5 for r in readings)
    assert max(r.at for r in readings) - acks[0] < 0.9  # serially it would take over 1 s
    assert 0.5 <= done_s < 1.5


@pytest.mark.integration
async def test_beyond_max_in_flight_an_action_is_rejected_as_busy_until_there_is_room(
    mosquitto: MosquittoBroker,
) -> None:
    env = ToyGraph()
    config = settings(delay_s=0.3, max_in_flight=1)
    async with observing(mosquitto.port) as observer, running(env, mosquitto.port, config):
        second = action(1, {"do_X1": 2.0})
        await observer.publish(action(0, {"do_X1": 1.0}))
        await observer.publish(second)
        await observer.wait_for(lambda: len(observer.of("ack")) == 2)
        await observer.wait_for(readings_done(observer, env, 0))
        await observer.publish(second.next_attempt())  # "busy" is not remembered: retry works
        await observer.wait_for(readings_done(observer, env, 1))

    assert [(a.round, a.status, a.reason) for a in observer.of("ack")] == [
        (0, "applied", None),
        (1, "rejected", "busy"),
        (1, "applied", None),
    ]


@pytest.mark.integration
async def test_the_device_survives_a_broker_restart(mosquitto_factory, tmp_path: Path) -> None:
    # Persistence keeps the observer's session, so nothing published while it reconnects is lost.
    broker = mosquitto_factory(MosquittoOptions(persistence_dir=tmp_path / "persist"))
    env = ToyGraph()
    async with (
        observing(broker.port) as observer,
        running(env, broker.port, settings(delay_s=0.5)) as device,
    ):
        await observer.publish(action(0, {"do_X1": 1.0}))
        await observer.wait_for(lambda: len(observer.of("ack", 0)) >= 1)
        await asyncio.to_thread(broker.restart)  # round 0's readings are still pending
        async with asyncio.timeout(WAIT_S):
            while not (device.sessions == 2 and device.ready.is_set()):
                await asyncio.sleep(0.02)
        await observer.wait_for(readings_done(observer, env, 0))
        await observer.publish(action(1, {"do_X0": 0.0}))
        await observer.wait_for(lambda: len(observer.of("ack", 1)) >= 1)
        await asyncio.to_thread(broker.stop)  # round 1's readings fall due while it is down
        await asyncio.sleep(0.7)
        assert not device.ready.is_set()
        await asyncio.to_thread(broker.start)
        await observer.wait_for(readings_done(observer, env, 1))
        await observer.publish(action(2, {}))
        await observer.wait_for(readings_done(observer, env, 2))

    for round_ in range(3):  # a publish cut by the outage may arrive twice: QoS 1 allows it
        assert {r.seq for r in observer.of("reading", round_)} == {round_}
        assert {(a.action_id, a.status) for a in observer.of("ack", round_)} == {
            (observer.of("ack", round_)[0].action_id, "applied")
        }
    assert device.sessions == 3


class FlakyConnection:
    """Stands in for an MqttConnection whose link may already be broken."""

    def __init__(self, broken: bool) -> None:
        self.broken = broken
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        if self.broken:
            raise ConnectionLostError("simulated")
        self.published.append((topic, payload))


async def test_a_publish_on_a_broken_link_is_retried_on_the_next_connection() -> None:
    device = SimulatorDevice(ToyGraph(), BrokerConfig(), settings())
    broken, fresh = FlakyConnection(broken=True), FlakyConnection(broken=False)
    device._link.set(broken)  # type: ignore[arg-type]
    ack = Actuator(device.env, "sim-exp1", settings().noise(), 0, 0, None).reject(
        action(0, {}), "test"
    )
    publishing = asyncio.create_task(device._publish("ack", ack, structlog.get_logger(), "e"))
    await asyncio.sleep(0.05)
    assert not publishing.done()  # waits for another connection rather than spinning
    device._link.set(fresh)  # type: ignore[arg-type]
    async with asyncio.timeout(WAIT_S):
        await publishing
    assert fresh.published == [(topics.ack(EXPERIMENT, DEVICE), encode(ack))]


# ---------------------------------------------------------------------------------------------
# without a broker


def test_settings_refuse_nonsense_naming_the_field() -> None:
    for field, value in [
        ("experiment", "a/b"),
        ("device_id", "no spaces"),
        ("drop_rate", 1.5),
        ("duplicate_rate", -0.1),
        ("delay_s", float("inf")),
        ("jitter_s", -1.0),
        ("topic_prefix", "cbo/#"),
        ("max_in_flight", 0),
    ]:
        with pytest.raises(ValidationError) as error:
            DeviceSettings(**({"experiment": "exp1"} | {field: value}))
        assert error.value.errors()[0]["loc"] == (field,)
    assert DeviceSettings(experiment="exp1").device_id == "sim-exp1"


def test_the_plan_honours_rates_delays_and_sequences() -> None:
    env = ToyGraph()
    noise = DeviceSettings(experiment="x", delay_s=1.0, jitter_s=0.5, duplicate_rate=1.0).noise()
    actuator = Actuator(env, "d", noise, seed=1, seq_start=10, optimum=None)
    plans = [actuator.apply(action(i, {})) for i in range(3)]
    for i, plan in enumerate(plans):
        assert plan.oracle is None
        assert {(r.seq, r.copies) for r in plan.readings} == {(10 + i, 2)}
        assert all(1.0 <= r.delay_s <= 1.5 for r in plan.readings)
        assert [r.delay_s for r in plan.readings] == sorted(r.delay_s for r in plan.readings)
    dropping = Actuator(env, "d", DeviceSettings(experiment="x", drop_rate=1.0).noise(), 1, 0, 0.0)
    assert {r.copies for r in dropping.apply(action(0, {})).readings} == {0}


async def test_run_device_names_an_unknown_environment() -> None:
    with pytest.raises(KeyError, match="unknown environment"):
        await run_device("no-such-env", "mqtt://127.0.0.1:1", DeviceSettings(experiment="exp1"))


@pytest.mark.integration
async def test_a_slow_step_runs_off_the_event_loop_and_messages_keep_their_order(
    mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A simulator step as slow as the Brusselator's solve (0.4 s) runs in a worker thread: the
    loop keeps ticking meanwhile (on the loop the largest gap would be the whole step), and a
    duplicate that arrives during the step is answered with the step's ack, not stepped again."""
    env = ToyGraph()
    step = env.step
    calls = [0]

    def slow_step(*args: Any, **kwargs: Any) -> dict[str, float]:
        calls[0] += 1
        time.sleep(0.4)  # holds the GIL only in short slices, as numpy's solve
        return step(*args, **kwargs)

    monkeypatch.setattr(env, "step", slow_step)
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async with observing(mosquitto.port) as observer, running(env, mosquitto.port, settings()):
        ticker = asyncio.create_task(tick())
        first = action(0, {"do_X1": 1.0})
        await observer.publish(first)
        await observer.publish(first)  # arrives while the step runs
        await observer.publish(action(1, {"do_X1": 2.0}))
        await observer.wait_for(readings_done(observer, env, 1))
        await observer.wait_for(lambda: len(observer.of("ack", 0)) == 2)
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker

    assert calls[0] == 2  # round 0 once, round 1 once
    assert [a.round for a in observer.of("ack")] == [0, 0, 1]  # in arrival order
    acks = observer.of("ack", 0)
    assert acks[0] == acks[1] and acks[0].status == "applied"
    assert len(gaps) > 40 and max(gaps) < 0.2, max(gaps)
