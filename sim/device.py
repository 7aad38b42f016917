"""Any environment as an MQTT device: the actuators and sensors of one experiment.

The device speaks as itself: it subscribes to ``{prefix}/{experiment}/{device_id}/action``
(QoS 1), publishes under ``{prefix}/{experiment}/{device_id}/...`` only (so a broker that grants
each login its own topics, `deploy/mosquitto/acl`, lets it in with its id as user name), and
for every action:

- with a key (`DeviceSettings.key`), an action that is not signed with it goes to the dead-letter
  topic ("unsigned", "bad_signature") and is not applied;
- a payload that does not decode (or names another experiment) goes to
  ``{prefix}/{experiment}/{device_id}/deadletter`` with the reason code, and the device
  carries on;
- an action whose lease ``epoch`` (protocol version 3, a fleet replica's) is older than the
  newest epoch seen for the experiment is dropped: neither applied nor acknowledged (the
  replica that sent it has lost the experiment to another);
- an ``action_id`` it has applied before is acknowledged again with the very same ack and not
  applied again (no new readings), so a re-published action is harmless; when it comes with a
  newer epoch than before (a replica took the experiment over and may have missed them), the
  readings already published for it are published again, with their seq;
- an action past its ``expires_at`` (the agent has given up on it and released its budget) is
  not applied: the ack says "rejected" with reason "expired" (an action without one, protocol
  version 1, never expires);
- an action the environment refuses (unknown action, out of bounds, a target set it does not
  allow, the wrong kind of intervention) gets an ack with status "rejected" and the reason;
- more than `max_in_flight` applied actions still waiting for their readings: the new action is
  rejected with reason "busy" and *not* remembered, so the agent's re-publish is applied later.
  (Rejecting rather than queueing keeps memory bounded and an ack prompt; the agent already
  re-publishes actions whose ack says nothing was applied.)
- otherwise the environment takes one step; the device publishes the "applied" ack, the oracle
  message (E[y | a] and the optimum, when `publish_oracle`), then one reading per node (reward
  components and the reward node included), each after ``delay_s + U(0, jitter_s)``, dropped
  with probability `drop_rate`, sent twice with the same seq with probability `duplicate_rate`.

Actions are applied one at a time, in arrival order (so a seed fixes every value and decision),
and their readings go out concurrently: a slow round does not hold up the next round's ack.
Publishes that fail because the link broke are retried on the next connection; the supervisor
(`connectors.mqtt.run_with_reconnect`) reconnects and re-subscribes. A publish retried after a
broken link may reach the agent twice, which the seq makes harmless.

Sequence numbers count per node from `seq_start`; by default that is the start time in
microseconds, so a restarted device (same `device_id`) keeps counting upwards as the protocol
asks. What the device remembers of applied actions lives in memory: a restarted device applies a
re-published action again.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Final, Self

import structlog
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from connectors.mqtt import (
    Backoff,
    BrokerConfig,
    MqttConnection,
    MqttConnectionError,
    run_with_reconnect,
)
from connectors.schemas import (
    Ack,
    Action,
    DeadLetter,
    DecodeError,
    MessageModel,
    Reading,
    decode,
    encode,
)
from connectors.signing import MIN_KEY_BYTES, DeviceKeys, SignatureError, sign, unwrap
from connectors.topics import DEFAULT_PREFIX, Topics, validate_experiment_id, validate_identifier
from sim._device_plan import Actuator, Noise, Plan, Rejected
from sim.base import Environment
from sim.registry import make_environment

log = structlog.get_logger(__name__)

BUSY_REASON: Final = "busy"
EXPIRED_REASON: Final = "expired"  # the agent gave up on the action: applying it would overspend
WRONG_EXPERIMENT: Final = "wrong_experiment"  # dead-letter code: payload and topic disagree
_RETRY_SAME_LINK_AFTER_S: Final = 1.0  # a publish that timed out on a live link is retried there


class DeviceSettings(BaseModel):
    """How a simulator device behaves on the wire.

    Attributes:
        experiment: the experiment whose action topic the device serves.
        device_id: stamped on acks, readings and oracle messages; default ``sim-{experiment}``.
        delay_s: seconds between applying an action and its readings.
        jitter_s: each reading waits a further U(0, jitter_s) seconds.
        drop_rate: probability that a reading is never sent.
        duplicate_rate: probability that a (not dropped) reading is sent twice with one seq.
        seed: seeds the environment's noise and the device's drops, duplicates and jitter.
        publish_oracle: publish E[y | a] and the optimum for every applied action.
        topic_prefix: the topic prefix (``cbo``, or several levels like ``site-a/cbo``).
        max_in_flight: applied actions whose readings are still pending; beyond: "busy".
        seq_start: first seq of every node; None: the start time in microseconds.
        remember_actions: how many applied action ids are kept for exactly-once effects.
        key: the device's HMAC-SHA256 key: every message it publishes is signed
            (`connectors.signing`), and it takes only actions signed with the key (others
            are dead-lettered as "unsigned" or "bad_signature"); None: unsigned.
        send_states: send the states an episode visited with the reward's reading (protocol
            `cbo.reading` version 4, for `hagpucb`'s `visited_states`; `cbo-agent sim NAME
            --send-states`); environments that record them only (`records_states`: MPE
            predator–prey, every variant, and MaMuJoCo's Swimmer and Ant).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    experiment: str
    device_id: str = ""
    delay_s: float = Field(default=0.0, ge=0.0, le=3600.0)
    jitter_s: float = Field(default=0.0, ge=0.0, le=3600.0)
    drop_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    duplicate_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int = 0
    publish_oracle: bool = True
    topic_prefix: str = DEFAULT_PREFIX
    max_in_flight: int = Field(default=64, ge=1)
    seq_start: int | None = Field(default=None, ge=0, le=2**62)
    remember_actions: int = Field(default=100_000, ge=1)
    key: SecretStr | None = None
    send_states: bool = False

    @field_validator("key")
    @classmethod
    def _check_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().encode()) < MIN_KEY_BYTES:
            raise ValueError(f"the key is shorter than {MIN_KEY_BYTES} bytes")
        return value

    @field_validator("experiment")
    @classmethod
    def _check_experiment(cls, value: str) -> str:
        return validate_experiment_id(value)

    @field_validator("topic_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        Topics(value)  # raises InvalidIdentifierError (a ValueError) naming the bad level
        return value

    @field_validator("device_id")
    @classmethod
    def _check_device_id(cls, value: str) -> str:
        return value and validate_identifier(value, "device id")  # "" means the default

    @model_validator(mode="after")
    def _default_device_id(self) -> Self:
        if not self.device_id:  # frozen model: fill the default once, while validating
            object.__setattr__(self, "device_id", f"sim-{self.experiment}"[:64])
        return self

    def noise(self) -> Noise:
        """The sensor misbehaviour part of the settings."""
        return Noise(self.delay_s, self.jitter_s, self.drop_rate, self.duplicate_rate)


class _Link:
    """The current connection, handed from the session to the publishing tasks."""

    def __init__(self) -> None:
        self.connection: MqttConnection | None = None
        self._changed = asyncio.Event()

    def set(self, connection: MqttConnection | None) -> None:
        self.connection = connection
        self._changed.set()
        self._changed = asyncio.Event()

    async def get(self, not_this: MqttConnection | None = None) -> MqttConnection:
        """The current connection once there is one (other than `not_this`)."""
        while self.connection is None or self.connection is not_this:
            await self._changed.wait()
        return self.connection


class SimulatorDevice:
    """An environment on MQTT for one experiment; `await run()` until cancelled.

    `ready` is set while the device is subscribed to its action topic (cleared when the link
    drops); `sessions` counts the subscriptions made, so a test can wait for a re-subscription
    after a broker restart. `applied` counts actions applied (environment steps).

    Args:
        env: the environment to simulate.
        broker: where to connect.
        settings: experiment, device id and sensor behaviour.
        backoff: the reconnect backoff (the supervisor's default when None).
    """

    def __init__(
        self,
        env: Environment,
        broker: BrokerConfig,
        settings: DeviceSettings,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self.env = env
        self.settings = settings
        self.ready = asyncio.Event()
        self.sessions = 0
        self.applied = 0
        self._broker = broker
        self._backoff = backoff
        topics = Topics(settings.topic_prefix)
        experiment = settings.experiment
        # the device's own topics: a broker ACL (deploy/mosquitto/acl) grants its login these
        self._topics = {
            kind: topics.device_topic(experiment, settings.device_id, kind)
            for kind in ("action", "ack", "reading", "oracle", "deadletter")
        }
        self._link = _Link()
        self._acks: collections.OrderedDict[str, Ack] = collections.OrderedDict()
        # action id -> (the newest epoch it came with, the readings published for it)
        self._sent: collections.OrderedDict[str, tuple[int | None, list[Reading]]] = (
            collections.OrderedDict()
        )
        self.epoch_seen: int | None = None  # the newest lease epoch of the experiment's actions
        self.stale_dropped = 0  # actions dropped for an epoch older than `epoch_seen`
        self._in_flight: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._actuator: Actuator | None = None
        self._log = log.bind(experiment=experiment, device_id=settings.device_id)

    async def run(self) -> None:
        """Serve actions until cancelled, reconnecting after broker restarts."""
        if self._actuator is not None:
            raise RuntimeError("SimulatorDevice.run() may be called once")
        settings = self.settings
        optimum = None
        if settings.publish_oracle:  # computed once, before the first action, off the loop
            optimum = float((await asyncio.to_thread(lambda: self.env.optimum)).value)
        seq_start = settings.seq_start
        if seq_start is None:
            seq_start = time.time_ns() // 1000
        self._actuator = Actuator(
            self.env,
            settings.device_id,
            settings.noise(),
            settings.seed,
            seq_start,
            optimum,
            send_states=settings.send_states,
        )
        self._log.info("device.starting", env=self.env.name, seq_start=seq_start)
        try:
            await run_with_reconnect(self._broker, self._session, backoff=self._backoff)
        finally:
            self.ready.clear()
            await self._cancel_tasks()

    async def _cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _session(self, connection: MqttConnection) -> None:
        await connection.subscribe(self._topics["action"], qos=1)
        self.sessions += 1
        self._link.set(connection)
        self.ready.set()
        self._log.info("device.subscribed", topic=self._topics["action"], session=self.sessions)
        try:
            async for message in connection.messages():
                try:
                    await self._on_message(message.topic, message.payload)
                except Exception:  # a bug in handling one message must not stop the device
                    self._log.exception("device.message_failed", topic=message.topic)
        finally:
            self.ready.clear()
            self._link.set(None)

    # ------------------------------------------------------------------------------ actions
    async def _on_message(self, topic: str, payload: bytes) -> None:
        """Handle one action message. Messages are handled one at a time, in arrival order (a
        duplicate that arrives during a step finds the step's ack), but the step itself runs
        in a worker thread: a slow simulator (the Brusselator's PDE solve, ~0.4 s) does not
        stall the event loop, which keeps publishing earlier rounds' readings, answering the
        broker and, in `cbo-agent demo`, running the agent."""
        key = self.settings.key
        if key is not None:  # with a key, only actions the agent signed with it
            keys = DeviceKeys({self.settings.device_id: key.get_secret_value().encode()})
            try:
                payload = unwrap(payload, self.settings.device_id, keys)
            except SignatureError as error:
                self._dead_letter(topic, payload, error.reason, error.detail)
                return
        try:
            action = decode(payload, Action)
        except DecodeError as error:
            self._dead_letter(topic, payload, error.reason, error.detail)
            return
        if action.experiment != self.settings.experiment:
            detail = f"action for experiment {action.experiment!r} on {topic!r}"
            self._dead_letter(topic, payload, WRONG_EXPERIMENT, detail)
            return
        alog = self._log.bind(round=action.round, action_id=action.action_id, epoch=action.epoch)
        alog.info(
            "device.action_received",
            attempt=action.attempt,
            kind=action.kind,
            intervention=action.intervention,
        )
        if self._stale_epoch(action, alog):
            return
        known = self._acks.get(action.action_id)
        if known is not None:
            alog.info("device.action_duplicate", attempt=action.attempt, status=known.status)
            self._spawn(self._publish("ack", known, alog, "device.ack_published", again=True))
            self._resend_for_new_owner(action, alog)
            return
        if action.expired(time.time()):
            self._reject(action, EXPIRED_REASON, alog)
            return
        if len(self._in_flight) >= self.settings.max_in_flight:
            self._reject(action, BUSY_REASON, alog)
            return
        try:
            plan = await asyncio.to_thread(self._apply, action)
        except Rejected as rejected:
            self._reject(action, str(rejected), alog)
            return
        self._remember(plan.ack)
        self._sent[plan.ack.action_id] = (action.epoch, [])
        while len(self._sent) > self.settings.remember_actions:
            self._sent.popitem(last=False)
        task = self._spawn(self._deliver(plan, asyncio.get_running_loop().time(), alog))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    def _stale_epoch(self, action: Action, alog: Any) -> bool:
        """Fencing: drop an action whose lease epoch is older than one seen for the experiment
        (a replica that lost its lease and does not know it yet). Nothing is applied or acked."""
        if action.epoch is None:
            return False
        if self.epoch_seen is not None and action.epoch < self.epoch_seen:
            self.stale_dropped += 1
            alog.warning("device.action_stale_epoch", epoch=action.epoch, seen=self.epoch_seen)
            return True
        self.epoch_seen = action.epoch
        return False

    def _resend_for_new_owner(self, action: Action, alog: Any) -> None:
        """A known action re-published under a newer epoch comes from a replica that took the
        experiment over and may have missed what was sent to the one before: send the readings
        already published again (same seq: the agent drops what it has)."""
        if action.epoch is None:
            return
        held = self._sent.get(action.action_id)
        if held is None or (held[0] is not None and held[0] >= action.epoch):
            return
        readings = held[1]
        self._sent[action.action_id] = (action.epoch, readings)
        alog.info("device.readings_resent", epoch=action.epoch, readings=len(readings))
        for reading in list(readings):
            self._spawn(
                self._publish(
                    "reading",
                    reading,
                    alog,
                    "device.reading_published",
                    again=True,
                    node=reading.node,
                    seq=reading.seq,
                )
            )

    def _apply(self, action: Action) -> Plan:
        assert self._actuator is not None
        try:
            plan = self._actuator.apply(action)
        except Rejected:
            raise
        except Exception as error:  # a simulator bug must not take the device down
            self._log.exception("device.simulator_error", round=action.round)
            raise Rejected(f"simulator error: {type(error).__name__}: {error}") from error
        self.applied += 1
        return plan

    def _remember(self, ack: Ack) -> None:
        self._acks[ack.action_id] = ack
        while len(self._acks) > self.settings.remember_actions:
            self._acks.popitem(last=False)

    def _reject(self, action: Action, reason: str, alog: Any) -> None:
        assert self._actuator is not None
        ack = self._actuator.reject(action, reason)
        alog.warning("device.action_rejected", reason=ack.reason)
        self._spawn(self._publish("ack", ack, alog, "device.ack_published", status="rejected"))

    def _dead_letter(self, topic: str, payload: bytes, reason: str, detail: str) -> None:
        self._log.warning("device.action_invalid", topic=topic, reason=reason, detail=detail)
        letter = DeadLetter.for_rejected(topic, payload, reason, detail)
        self._spawn(self._publish("deadletter", letter, self._log, "device.deadletter_published"))

    # ------------------------------------------------------------------------------ output
    async def _deliver(self, plan: Plan, applied_at: float, alog: Any) -> None:
        """Ack and oracle now, then each reading at its time (relative to `applied_at`)."""
        await self._publish("ack", plan.ack, alog, "device.ack_published", status="applied")
        if plan.oracle is not None:
            await self._publish(
                "oracle",
                plan.oracle,
                alog,
                "device.oracle_published",
                expected_reward=plan.oracle.expected_reward,
            )
        loop = asyncio.get_running_loop()
        ack = plan.ack
        for planned in plan.readings:
            await asyncio.sleep(max(0.0, applied_at + planned.delay_s - loop.time()))
            if planned.copies == 0:
                alog.info("device.reading_dropped", node=planned.node, seq=planned.seq)
                continue
            reading = planned.message(ack.experiment, ack.round, ack.device_id)
            held = self._sent.get(ack.action_id)
            if held is not None:
                held[1].append(reading)
            for copy in range(planned.copies):
                await self._publish(
                    "reading",
                    reading,
                    alog,
                    "device.reading_published",
                    node=reading.node,
                    seq=reading.seq,
                    value=reading.value,
                    copy=copy + 1,
                )

    async def _publish(
        self, kind: str, message: MessageModel, alog: Any, event: str, **fields: Any
    ) -> None:
        """Publish at QoS 1; after a broken link, again on the next connection."""
        topic, payload = self._topics[kind], encode(message)
        key = self.settings.key
        if key is not None:
            payload = sign(payload, self.settings.device_id, key.get_secret_value().encode())
        failed: MqttConnection | None = None
        while True:
            try:
                async with asyncio.timeout(_RETRY_SAME_LINK_AFTER_S if failed else None):
                    connection = await self._link.get(not_this=failed)
            except TimeoutError:  # the link is still up: the failure was a slow PUBACK
                connection = await self._link.get()
            try:
                await connection.publish(topic, payload, qos=1)
            except MqttConnectionError as error:
                alog.warning("device.publish_retry", topic=topic, error=str(error))
                failed = connection
                continue
            alog.info(event, topic=topic, **fields)
            return

    def _spawn(self, coroutine: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._guarded(coroutine))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _guarded(self, coroutine: Any) -> None:
        try:
            await coroutine
        except asyncio.CancelledError:
            raise
        except Exception:  # logged, not raised: one message must not stop the device
            self._log.exception("device.task_failed")


async def run_device(
    env_name: str,
    broker_url: str,
    settings: DeviceSettings,
    *,
    env_seed: int = 0,
    backoff: Backoff | None = None,
    **broker_options: Any,
) -> None:
    """Run environment `env_name` as the MQTT device of one experiment until cancelled.

    The entry point of ``cbo-agent sim ENV``. Intended flags, one per argument or setting:

    ========================  =============================================================
    ``ENV``                   `env_name`, a name of `sim.registry.environment_names()`
    ``--broker URL``          `broker_url`, ``mqtt://[user[:pass]@]host[:port]`` or ``mqtts://``
                              (default ``mqtt://127.0.0.1:1883``)
    ``--ca-file PATH``        ``broker_options["ca_file"]`` (likewise ``--cert-file``,
                              ``--key-file``, ``--client-id``)
    ``--experiment ID``       `settings.experiment` (required)
    ``--device-id ID``        `settings.device_id` (default ``sim-{experiment}``)
    ``--prefix P``            `settings.topic_prefix` (default ``cbo``)
    ``--delay S``             `settings.delay_s`
    ``--jitter S``            `settings.jitter_s`
    ``--drop-rate P``         `settings.drop_rate`
    ``--duplicate-rate P``    `settings.duplicate_rate`
    ``--seed N``              `settings.seed` (noise, drops, duplicates, jitter)
    ``--env-seed N``          `env_seed`: which instance of a randomly drawn environment
                              (decomposed-synthetic, weather); must match the agent's spec
    ``--no-oracle``           ``settings.publish_oracle = False`` (a "real" system)
    ``--max-in-flight N``     `settings.max_in_flight`
    ========================  =============================================================

    Raises:
        KeyError: unknown environment name.
        ValueError: a bad broker URL or option.
    """
    env = make_environment(env_name, env_seed)
    broker = BrokerConfig.from_url(broker_url, **broker_options)
    await SimulatorDevice(env, broker, settings, backoff=backoff).run()
