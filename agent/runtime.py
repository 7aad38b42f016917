"""The agent service: experiments as independent state machines over one MQTT connection.

One task per experiment (its *driver*) owns that experiment: it proposes (the policy runs in a
worker thread), publishes actions, and drains the experiment's inbox in batches — so a round's
readings update every node in one batched GP call, and nothing touches an experiment's model
while its policy is thinking. Hyperparameter refits and the rebuilds after them run in another
worker thread on a copy of the data and are swapped in by the driver between batches
(`agent.refits`). What a driver writes to the store — a batch of acks, readings and oracle
values with the GP rows they append, timeouts, publication marks — runs in a worker thread too
(`_beside`), one call at a time per experiment (the driver awaits each), so the experiment's
writes keep their order and a PostgreSQL round trip or an fsync never stalls the event loop,
which decodes, checks, routes and publishes.

The MQTT session only routes incoming messages to inboxes, a burst of them per event-loop turn
(`MqttConnection.message_batches`); it is re-created after every reconnect
(`connectors.mqtt.run_with_reconnect`), and drivers publish through a `Link` that waits for the
current connection.

Bad input never stops the agent: whatever cannot be decoded or does not fit is rejected with a
reason (a log event, `cbo_messages_total{outcome="rejected",reason=...}`, the experiment's
dead-letter topic and the store), and nothing already accepted is lost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from agent import identity, recommend, recovery
from agent.config import AgentConfig
from agent.experiment import Experiment, reserve_share
from agent.refits import BackgroundRefits, FitWorker
from agent.rounds import EventSink, LiveRound, Verdict
from agent.tasks import stop_tasks
from connectors.metrics import AgentMetrics, MetricsServer, Readiness
from connectors.mqtt import (
    IncomingMessage,
    MqttConnection,
    MqttConnectionError,
    Presence,
    run_with_reconnect,
)
from connectors.schemas import Ack, Action, DeadLetter, DecodeError, Oracle, Reading, decode, encode
from connectors.signing import SignatureError, sign, unwrap
from connectors.store import Store
from connectors.topics import ParsedTopic, TopicError, Topics
from core.spec import ExperimentSpec

log = structlog.get_logger(__name__)
_T = TypeVar("_T")

INBOX_LIMIT = 50_000  # per experiment; beyond it input is rejected as a flood
INBOX_BYTES_LIMIT = 64 * 2**20  # per experiment: payload bytes waiting there, also a flood beyond
COALESCE_S = 0.005  # group commit window: input arriving together is stored and learned together
# ... and past it, input keeps joining the batch while it comes this close together: a backlog
# (the broker sending what queued while the last batch was handled) is taken whole, up to
# BATCH_LIMIT, so the batch's fixed costs (one commit, one fsync, one GP block per node) are
# paid once for all of it; input that trickles in ends the batch after COALESCE_S as before.
BACKLOG_GAP_S = 0.001
BATCH_LIMIT = 2_000
LINGER_S = 1.0  # a finished experiment with incomplete rounds reads late feedback until this quiet
LINGER_CAP_S = 30.0  # ... and never longer than this, whatever keeps arriving
SESSION_WAIT_S = 30.0  # how long lingering waits for a broker session to read what it queued
DEAD_LETTERS_PER_S = 50  # per experiment; beyond it rejects are counted and logged only
PUBLISH_RETRY_S = 0.5  # a publish that failed is tried again after this
DEAD_LETTERS_QUEUED = 100  # waiting to be published (a link down); beyond, stored only
SENDERS_TRACKED = 10_000  # rate-limit buckets kept; the longest unseen sender is forgotten
_KIND_SCHEMAS = {"reading": Reading, "ack": Ack, "oracle": Oracle}


class _TokenBucket:
    """At most `rate` events per second per key, with bursts up to `burst`.

    At most `max_keys` keys are remembered (memory stays bounded whatever keys a flood makes
    up); beyond, the key seen longest ago is forgotten, and starts again with a full burst.
    """

    def __init__(self, rate: float, burst: float, max_keys: int = SENDERS_TRACKED) -> None:
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._tokens: collections.OrderedDict[object, tuple[float, float]] = (
            collections.OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._tokens)

    def take(self, key: object) -> bool:
        now = time.monotonic()
        tokens, last = self._tokens.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        allowed = tokens >= 1.0
        self._tokens[key] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._tokens) > self.max_keys:
            self._tokens.popitem(last=False)
        return allowed


@dataclass(frozen=True)
class _Letter:
    """A dead letter waiting to be stored (`Store.add_dead_letter`'s arguments)."""

    exp: Experiment
    topic: str
    reason: str
    detail: str
    payload: bytes
    at: float


@dataclass(frozen=True)
class _Incoming:
    kind: str
    message: IncomingMessage | None
    connection: MqttConnection | None = None  # acknowledged there once handled
    at: float = 0.0  # when it was queued: wall time; monotonic for "reconnected"
    decoded: Reading | Ack | Oracle | None = None  # checked by the router


class BrokerUnavailable(Exception):
    """No broker session within `broker.connect_timeout_s`: the service gives up."""

    def __init__(self, url: str, waited_s: float, error: str | None) -> None:
        reason = error or "no answer"
        super().__init__(f"no broker session with {url} within {waited_s:g} s ({reason})")
        self.url, self.waited_s, self.error = url, waited_s, reason


class Link:
    """The current broker connection, for publishers that outlive any single connection."""

    def __init__(self) -> None:
        self._connection: MqttConnection | None = None
        self._connected = asyncio.Event()
        self._disconnected = asyncio.Event()
        self._disconnected.set()

    def attach(self, connection: MqttConnection) -> None:
        self._connection = connection
        self._connected.set()
        self._disconnected.clear()

    def detach(self) -> None:
        self._connection = None
        self._connected.clear()
        self._disconnected.set()

    async def wait_attached(self) -> None:
        await self._connected.wait()

    async def wait_detached(self) -> None:
        await self._disconnected.wait()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> None:
        """Publish on the current connection, waiting for one if the link is down."""
        while True:
            await self._connected.wait()
            connection = self._connection
            if connection is None:
                continue
            try:
                await connection.publish(topic, payload, qos=qos, retain=retain)
                return
            except MqttConnectionError as error:
                # A broken link ends its session, which detaches it; a new session attaches the
                # next. A PUBACK slower than the timeout (a broker busy saving a flood) fails the
                # same way on a link that lives on: detaching here would leave every publisher
                # waiting for a connection that never comes while the session still delivers
                # (and nothing drains the inboxes). So: wait a moment, then publish again on
                # whatever connection is current (QoS 1: receivers drop the duplicate).
                log.warning("mqtt.publish_retry", topic=topic, error=str(error))
                await asyncio.sleep(PUBLISH_RETRY_S)


class AgentService:
    """Runs experiments from specs until they finish (or forever, for open-ended ones).

    Args:
        config: where and as whom to run.
        specs: the experiments.
        on_event: receives every `RoundEvent` (the demo's live view).
        store: an open store to use instead of opening `config.store.path`.
        on_learned: receives (experiment, [(reading, time.time() when routed)], time.time()
            now) once a batch's readings are stored and learned (benchmarks measure latency).
        background_refits: refits run beside the event loop (`agent.refits`); False runs them
            inside the batch that makes them due, as before (benchmarks compare the two).
        freeze_gc: keep what lives once the service started out of the garbage collector's
            full passes (`freeze_long_lived`); False leaves the collector as Python has it
            (benchmarks compare the two).
    """

    def __init__(
        self,
        config: AgentConfig,
        specs: Sequence[ExperimentSpec],
        *,
        on_event: EventSink | None = None,
        store: Store | None = None,
        on_learned: Callable[[str, list[tuple[Reading, float]], float], None] | None = None,
        background_refits: bool = True,
        freeze_gc: bool = True,
    ) -> None:
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"experiment names must be unique; got {names}")
        self.config = config
        self.specs = list(specs)
        self.on_event = on_event
        self.on_learned = on_learned
        self.background_refits = background_refits
        self.freeze_gc = freeze_gc
        self.topics = Topics(config.topic_prefix)
        self.metrics = AgentMetrics()
        self.readiness = Readiness("broker_connected", "experiments_loaded")
        self.link = Link()
        self.device_keys = config.load_device_keys()  # never logged: only the ids show
        self._subscribed = asyncio.Event()  # this life has had a broker session
        # (experiment, kind, outcome) -> messages handled: a cheap count for tests and benchmarks
        self.handled: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.experiments: dict[str, Experiment] = {}
        self._inboxes: dict[str, asyncio.Queue[_Incoming]] = {}
        self.refits: dict[str, BackgroundRefits] = {}
        self._fit_worker = FitWorker()
        self._inbox_bytes: collections.Counter[str] = collections.Counter()
        self._dead_letters: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(
            maxsize=DEAD_LETTERS_QUEUED
        )
        # rejected input to keep in the store, written beside the event loop in batches
        self._letters_to_store: asyncio.Queue[_Letter] = asyncio.Queue(maxsize=DEAD_LETTERS_QUEUED)
        self._store = store
        self._letter_budget = _TokenBucket(DEAD_LETTERS_PER_S, burst=DEAD_LETTERS_PER_S)
        self._sender_budget = _TokenBucket(
            config.input.sender_rate_per_s, burst=config.input.sender_burst
        )
        self.metrics_server: MetricsServer | None = None
        self._last_broker_error: str | None = None
        self._working: set[asyncio.Future[Any]] = set()  # store work in worker threads
        self._sparing: dict[str, asyncio.Future[None]] = {}  # spare GP buffers being made

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Serve until every experiment has finished; cancel to stop earlier."""
        own_store = self._store is None
        store = self._store or Store(self.config.store.path)
        server = MetricsServer(
            self.metrics.registry,
            self.readiness,
            host=self.config.metrics.host,
            port=self.config.metrics.port,
        )
        server.start()
        self.metrics_server = server
        log.info(
            "agent.started",
            agent_id=self.config.agent_id,
            metrics=server.url,
            experiments=[s.name for s in self.specs],
        )
        try:
            self._load(store)
            if self.refits:
                self._fit_worker.warm()
            if self.freeze_gc:
                freeze_long_lived()
            await self._serve()
        finally:
            if self.freeze_gc:
                gc.unfreeze()
            server.close()
            self._fit_worker.close()
            if own_store:
                store.close()
            log.info("agent.stopped", agent_id=self.config.agent_id)

    def _load(self, store: Store) -> None:
        for spec in self.specs:
            self.experiments[spec.name] = Experiment(
                spec,
                store,
                seed=spec.initial_design.seed,
                metrics=self.metrics,
                on_event=self.on_event,
                device=self.config.device,
                background_refits=self.background_refits,
                reserve_bytes=reserve_share(len(self.specs), self.config.reserve_mb * 2**20),
            )
            inbox: asyncio.Queue[_Incoming] = asyncio.Queue(maxsize=INBOX_LIMIT)
            self._inboxes[spec.name] = inbox
            if self.background_refits:
                wake = _Incoming("refitted", None)
                self.refits[spec.name] = BackgroundRefits(
                    self.experiments[spec.name],
                    lambda inbox=inbox, wake=wake: self._offer(inbox, wake),
                    self._fit_worker,
                )
            self.metrics.register_experiment(spec.name)
        self.readiness.set("experiments_loaded", True)

    async def _serve(self) -> None:
        client_id = self.config.client_id(list(self.experiments))
        broker = self.config.broker.to_broker_config(client_id=client_id)
        presence = Presence(
            self.config.agent_id, experiments=tuple(self.experiments), topics=self.topics
        )
        self.readiness.set("broker_connected", False, f"connecting to {self._broker_url}")
        connection = asyncio.create_task(
            run_with_reconnect(
                broker, self._session, presence=presence, on_failure=self._broker_failed
            ),
            name="mqtt",
        )
        letters = asyncio.create_task(self._publish_dead_letters(), name="dead-letters")
        kept = asyncio.create_task(self._store_dead_letters(), name="dead-letter-store")
        watchdog = asyncio.create_task(self._connect_deadline(), name="connect-deadline")
        drivers = [
            asyncio.create_task(self._driver(exp), name=f"drive:{exp.name}")
            for exp in self.experiments.values()
        ]
        try:
            pending = {connection, watchdog, kept, *drivers}
            while any(task in pending for task in drivers):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # a driver bug or a fatal broker error stops the service
                if connection in done:
                    break
        finally:
            await stop_tasks((connection, letters, kept, watchdog, *drivers))
            await self._settle()
            self._write_letters(_drain(self._letters_to_store))  # what was still waiting

    # ------------------------------------------------------------------ broker reachability
    @property
    def _broker_url(self) -> str:
        return self.config.broker.address.url

    def _broker_failed(self, error: MqttConnectionError) -> None:
        """The reconnect loop lost (or never got) the broker: /readyz says which and why."""
        self.readiness.set("broker_connected", False, f"{self._broker_url}: {error}")
        self._last_broker_error = str(error)

    async def _connect_deadline(self) -> None:
        """Give up when no broker session starts within `broker.connect_timeout_s` — at start
        or after a connection was lost. Without a timeout, wait forever (return at once)."""
        timeout_s = self.config.broker.connect_timeout_s
        if timeout_s is None:
            return
        while True:
            try:
                async with asyncio.timeout(timeout_s):  # not wait_for: see agent.tasks
                    await self.link.wait_attached()
            except TimeoutError:
                raise BrokerUnavailable(
                    self._broker_url, timeout_s, self._last_broker_error
                ) from None
            await self.link.wait_detached()

    # ------------------------------------------------------------------ MQTT session
    async def _session(self, connection: MqttConnection) -> None:
        """One connection's life: subscribe, tell drivers, route messages until it drops."""
        await self._subscribe_all(connection)
        self.link.attach(connection)
        self._subscribed.set()
        self.readiness.set("broker_connected", True)
        for inbox in self._inboxes.values():
            self._offer(inbox, _Incoming("reconnected", None, at=time.monotonic()))
        log.info("agent.subscribed", experiments=list(self.experiments))
        try:
            # everything the connection has received is routed in one go (in arrival order)
            async for batch in connection.message_batches():
                for message in batch:
                    self._route(message, connection)
        finally:
            self.readiness.set("broker_connected", False)
            if self.link.connected:
                self.link.detach()

    async def _subscribe_all(self, connection: MqttConnection) -> None:
        """Subscribe to every experiment's input on a new connection."""
        for name in self.experiments:
            for topic_filter in self._experiment_filters(name):
                await connection.subscribe(topic_filter)

    def _experiment_filters(self, name: str) -> list[str]:
        """The subscriptions that bring an experiment's input (built by `connectors.topics`):
        every device's, since an unbound one is refused and counted."""
        return [self.topics.device_filter(kind, name) for kind in _KIND_SCHEMAS]

    def _route(self, message: IncomingMessage, connection: MqttConnection) -> None:
        try:
            parsed = self.topics.parse(message.topic)
        except TopicError as error:
            self._reject(None, "unknown", message, "foreign_topic", str(error))
            connection.ack(message)
            return
        inbox = self._inboxes.get(parsed.experiment)
        if inbox is None or parsed.kind not in _KIND_SCHEMAS or parsed.device is None:
            detail = f"no experiment {parsed.experiment!r} takes {parsed.kind} messages"
            self._reject(parsed.experiment, parsed.kind, message, "unknown_experiment", detail)
            connection.ack(message)
            return
        # Checked here, at once: what is rejected is acknowledged now, so a flood of invalid
        # input never holds the broker's in-flight window (nor its queue) for the agent; only
        # valid input waits in the inbox, unacknowledged until it is stored.
        decoded = self._decode(parsed.experiment, parsed.kind, message, parsed.device)
        if decoded is None or not self._within_rate(parsed, decoded, message):
            connection.ack(message)
            return
        size = len(message.payload)
        if self._inbox_bytes[parsed.experiment] + size > INBOX_BYTES_LIMIT or not self._offer(
            inbox, _Incoming(parsed.kind, message, connection, time.time(), decoded=decoded)
        ):
            # not acknowledged: with a persistent session the broker delivers it again later
            detail = (
                f"inbox of {parsed.experiment} holds {inbox.qsize()} unprocessed messages "
                f"({self._inbox_bytes[parsed.experiment]} bytes)"
            )
            self._reject(parsed.experiment, parsed.kind, message, "flood", detail)
            return
        self._inbox_bytes[parsed.experiment] += size
        if isinstance(decoded, Ack):
            # received now: its round cannot expire while it waits in the inbox (`agent.acks`)
            exp = self.experiments[parsed.experiment]
            exp.acks_in.arrived(decoded.round, exp.ticks)

    def _within_rate(
        self, parsed: ParsedTopic, decoded: Reading | Ack | Oracle, message: IncomingMessage
    ) -> bool:
        """Whether the sender (its topic and the device it names) is within its rate; if not,
        the message is rejected as `rate_limited` (acknowledged: it will not come back)."""
        if self._sender_budget.take((message.topic, decoded.device_id)):
            return True
        config = self.config.input
        detail = (
            f"device {decoded.device_id!r} on {message.topic} sends more than "
            f"{config.sender_rate_per_s:g} messages/s (bursts of {config.sender_burst})"
        )
        self._reject(parsed.experiment, parsed.kind, message, "rate_limited", detail)
        return False

    def wake(self, experiment: str) -> bool:
        """Wake the experiment's driver so it looks again at what it may do (e.g. `_may_propose`
        changed: a fleet's experiment resumed). False if the experiment is not served here or
        its inbox is full (then the driver is busy anyway and will look again by itself)."""
        inbox = self._inboxes.get(experiment)
        return inbox is not None and self._offer(inbox, _Incoming("wake", None, at=time.time()))

    @staticmethod
    def _offer(inbox: asyncio.Queue[_Incoming], item: _Incoming) -> bool:
        try:
            inbox.put_nowait(item)
        except asyncio.QueueFull:
            return False
        return True

    # ------------------------------------------------------------------ experiment drivers
    async def _driver(self, exp: Experiment) -> None:
        """`_drive`, with the experiment bound to every event logged on its behalf: by the
        runtime, the store, and the policy's worker thread (`asyncio.to_thread` copies the
        context)."""
        with structlog.contextvars.bound_contextvars(experiment=exp.name):
            try:
                await self._drive(exp)
            finally:
                if exp.name in self.refits:
                    await self.refits[exp.name].close()

    async def _drive(self, exp: Experiment) -> None:
        """Propose, publish, join feedback, handle timeouts — until the experiment finishes."""
        inbox = self._inboxes[exp.name]
        if any(live.awaits_session for live in exp.open_rounds):
            # Recovered rounds without an ack: their acks may be queued by the broker for this
            # agent's session. Their expiry windows start once a session is up — attached
            # after its subscriptions were acknowledged, so what it queued can arrive — and
            # not at recovery: a broker slow to answer must not expire them first.
            await self.link.wait_attached()
            await self._on_model(exp, recovery.start_windows, exp)
        for live in exp.open_rounds:  # recovered rounds that never left before a crash
            if live.published_at is None:
                await self._publish_action(exp, live.action)
                await self._on_model(exp, exp.mark_published, live.number, exp.ticks())
        while True:
            # What touches the store runs in a worker thread (a PostgreSQL round trip, an
            # fsync), one call at a time per experiment: this driver awaits each before the
            # next, so the experiment's writes keep their order and nothing else touches it.
            # The timers, the budget and the proposal are one call: with many experiments
            # the worker threads are busy and every hop to them waits its turn, so a decision
            # takes one hop before its publication, not two.
            may = self._may_propose(exp)
            due, live = await self._on_model(exp, _due_and_proposal, exp, may)
            for action in due:
                await self._publish_action(exp, action)
            if live is not None:
                await self._publish_action(exp, live.action, reserved=True)
                # the decision ends here, when the action is handed over, not when the
                # worker thread that marks it gets its turn (`mark_published` then settles
                # the proposal: its regret estimate, off the decision's latency)
                published = exp.ticks()
                await self._on_model(exp, exp.mark_published, live.number, published)
                await self._publish_recommendation(exp)
                continue
            if exp.finished and not exp.in_flight:
                # every round is in: the policy's last word, retained (`agent.recommend`)
                await self._on_model(exp, recommend.refresh, exp, True)
                await self._publish_recommendation(exp)
                self.metrics.set_finished(exp.name, True)
                if exp.missing_readings() and await self._linger(exp, inbox):
                    # late readings taught the model: the last word may have changed
                    await self._on_model(exp, recommend.refresh, exp, True)
                    await self._publish_recommendation(exp)
                return
            timeout = exp.next_deadline(exp.ticks()) if exp.in_flight else None
            if exp.spec.schedule.min_interval_s and not exp.in_flight and not exp.finished:
                timeout = exp.next_deadline(exp.ticks())
            batch = await self._next_batch(inbox, timeout)
            await self._handle(exp, batch)

    def _beside(self, call: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """`call(*args)` in a worker thread (the experiment's store writes: a PostgreSQL round
        trip, an fsync), as a future to `await asyncio.shield(...)`: a caller cancelled meanwhile
        leaves it to finish — a write is not cut in half — and `_settle` waits for it before the
        store closes."""
        work = asyncio.ensure_future(asyncio.to_thread(call, *args))
        self._working.add(work)
        work.add_done_callback(_settled)
        work.add_done_callback(self._working.discard)
        return work

    async def _on_model(self, exp: Experiment, call: Callable[..., _T], *args: Any) -> _T:
        """`_beside(call, *args)` holding the experiment's model (`Experiment.learning`): the
        driver's worker calls change the model (rows, pending points, appends), and a refit
        copies its rows on the loop (`agent.refits`), which must not see one half-done."""
        async with exp.learning:
            return await asyncio.shield(self._beside(call, *args))

    async def _settle(self) -> None:
        """Wait for the store work `_beside` started (the service is stopping)."""
        if self._working:
            await asyncio.wait(set(self._working))

    def _may_propose(self, exp: Experiment) -> bool:
        """Whether the service lets the experiment start rounds now (a fleet's pause says no;
        wake its driver with a "wake" item when that changes)."""
        return True

    async def _linger(self, exp: Experiment, inbox: asyncio.Queue[_Incoming]) -> bool:
        """Store late feedback of a finished experiment before the service exits; whether
        anything came.

        Rounds closed by timeout may still get readings ("late readings still teach the model"),
        some already queued by the broker for this persistent session: wait for a session, then
        keep handling input until it is quiet for LINGER_S (at most LINGER_CAP_S).
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SESSION_WAIT_S):
                await self._subscribed.wait()
        log.info("experiment.lingering", missing=exp.missing_readings())
        deadline = time.monotonic() + LINGER_CAP_S
        handled = False
        while time.monotonic() < deadline:
            batch = await self._next_batch(inbox, min(LINGER_S, deadline - time.monotonic()))
            if not batch:
                break
            await self._handle(exp, batch)
            handled = True
        return handled

    async def _publish_action(
        self, exp: Experiment, action: Action, *, reserved: bool = False
    ) -> None:
        """Publish the action to its actuator (signed if keyed). `reserved`: a round just
        proposed, whose reservation checked the experiment's state in the same worker call."""
        actuator = exp.spec.actuator_id
        payload = encode(action)
        key = self.device_keys.key(actuator)
        if key is not None:  # a keyed actuator takes only actions signed with its key
            payload = sign(payload, actuator, key)
        await self.link.publish(self.topics.action(exp.name, actuator), payload)

    async def _publish_recommendation(self, exp: Experiment) -> None:
        """The recommendation `agent.recommend` left to publish, if any: retained, so whoever
        subscribes later (a dashboard, the operator after the run) gets the latest."""
        message = recommend.take(exp)
        if message is not None:
            topic = self.topics.recommendation(exp.name)
            await self.link.publish(topic, encode(message), retain=True)

    @staticmethod
    async def _next_batch(
        inbox: asyncio.Queue[_Incoming], timeout: float | None
    ) -> list[_Incoming]:
        """Wait for at least one message (or the timeout), then coalesce what follows.

        Group commit: the MQTT client hands over one packet per event-loop turn, so without a
        short window every reading would cost its own durable commit and GP update. Input is
        gathered for up to COALESCE_S, then for as long as each next message follows within
        BACKLOG_GAP_S (a backlog), at most BATCH_LIMIT messages, and handled as one batch.
        """
        if timeout == 0:
            await asyncio.sleep(0)  # something is due now; still let the MQTT task run
            return [inbox.get_nowait() for _ in range(min(inbox.qsize(), BATCH_LIMIT))]
        try:
            # asyncio.timeout, not wait_for, which on 3.11 can keep a cancel (agent.tasks)
            async with asyncio.timeout(timeout):
                first = await inbox.get()
        except TimeoutError:
            return []
        batch = [first]
        deadline = time.monotonic() + COALESCE_S
        while len(batch) < BATCH_LIMIT:
            while not inbox.empty() and len(batch) < BATCH_LIMIT:
                batch.append(inbox.get_nowait())
            if len(batch) >= BATCH_LIMIT:
                break
            remaining = max(deadline - time.monotonic(), BACKLOG_GAP_S)
            try:
                async with asyncio.timeout(remaining):
                    batch.append(await inbox.get())
            except TimeoutError:
                break
        return batch

    async def _handle(self, exp: Experiment, batch: list[_Incoming]) -> None:
        """Store and learn a batch (in a worker thread: `_apply`), then, on the loop, count and
        reject what it refused, publish again what a reconnect may have lost, and acknowledge
        the batch to the broker — only now, when all of it is stored."""
        refits = self.refits.get(exp.name)
        if refits is not None:
            # a refit finished beside the loop: swap it in before this batch is learned (a
            # "refitted" item only wakes an idle driver; a full inbox may have refused it)
            refits.install_ready()
        for item in batch:
            if item.message is not None:
                self._inbox_bytes[exp.name] -= len(item.message.payload)
        if any(item.decoded is not None or item.kind == "reconnected" for item in batch):
            async with exp.learning:  # the model is the worker's until it is done (`_on_model`)
                work = self._beside(_apply, exp, batch)
                try:
                    applied = await asyncio.shield(work)
                except asyncio.CancelledError:
                    # The driver was cancelled (a fleet let go of the experiment) while the
                    # worker stores the batch: it finishes anyway, and what it stored is
                    # acknowledged then, so the broker's in-flight window does not keep a slot
                    # for each message.
                    work.add_done_callback(lambda done: _ack_if_stored(done, batch))
                    raise
        else:
            applied = _Applied([], [], [])  # only wake-ups: nothing to store
        for kind, item, verdict in applied.verdicts:
            assert item.message is not None  # decoded input always has its message
            self._account(exp, kind, item.message, verdict)
        if applied.readings and self.on_learned is not None:
            routed = [(reading, item.at) for reading, item in applied.readings]
            self.on_learned(exp.name, routed, time.time())
        for action in applied.again:
            await self._publish_action(exp, action)
        if refits is not None:
            refits.maybe_start()  # a refit the schedule made due runs beside the loop
        # Everything in the batch is stored (or deliberately rejected) now: acknowledge it.
        for item in batch:
            if item.connection is not None and item.message is not None:
                item.connection.ack(item.message)
        self._spare_ahead(exp)

    def _spare_ahead(self, exp: Experiment) -> None:
        """Make the node GPs' next, larger buffers in a worker thread once they are filling
        (`IncrementalGP.spare_wanted`), so that the growth a later batch needs finds them
        ready: allocating and filling them is most of a growth's cost (hundreds of ms at
        1,000-2,000 rows), which would otherwise fall inside that batch's latency."""
        gp = exp.model.gp
        if exp.name in self._sparing or not gp.spare_wanted():
            return
        work = asyncio.ensure_future(asyncio.to_thread(gp.prepare_spare))
        self._sparing[exp.name] = work
        work.add_done_callback(lambda done: self._spared(exp.name, done))

    def _spared(self, name: str, work: asyncio.Future[None]) -> None:
        self._sparing.pop(name, None)
        if not work.cancelled() and work.exception() is not None:
            # not fatal: the growth then allocates its own buffers, as without a spare
            log.warning("model.spare_failed", experiment=name, error=repr(work.exception()))

    def _decode(
        self, experiment: str, kind: str, message: IncomingMessage, sender: str
    ) -> Reading | Ack | Oracle | None:
        """The message, decoded and checked against its topic and its sender (the device level
        of the topic, which the broker's ACL vouches for); None (rejected) otherwise."""
        try:
            payload = unwrap(message.payload, sender, self.device_keys)
        except SignatureError as error:
            self.metrics.untrusted(experiment, kind, error.reason)  # type: ignore[arg-type]
            self._reject(experiment, kind, message, error.reason, error.detail)
            return None
        try:
            decoded = decode(payload, _KIND_SCHEMAS[kind])
        except DecodeError as error:
            self._reject(experiment, kind, message, error.reason, error.detail)
            return None
        if decoded.experiment != experiment:
            self._reject(
                experiment,
                kind,
                message,
                "experiment_mismatch",
                f"payload names {decoded.experiment!r} on {experiment}'s topic",
            )
            return None
        refused = identity.refusal(self.experiments[experiment].spec, sender, decoded)
        if refused is not None:
            reason, detail = refused
            self.metrics.untrusted(experiment, kind, reason)
            self._reject(experiment, kind, message, reason, detail)
            return None
        return decoded

    def _account(
        self, exp: Experiment, kind: str, message: IncomingMessage, verdict: Verdict
    ) -> None:
        self.handled[(exp.name, kind, verdict.outcome)] += 1
        if verdict.outcome == "rejected":
            self._reject(exp.name, kind, message, verdict.reason, verdict.reason)
        else:
            self.metrics.message(exp.name, kind, verdict.outcome)

    # ------------------------------------------------------------------ rejected input
    def _reject(
        self,
        experiment: str | None,
        kind: str,
        message: IncomingMessage,
        reason: str,
        detail: str,
    ) -> None:
        log.warning(
            "message.rejected",
            experiment=experiment,
            kind=kind,
            topic=message.topic,
            reason=reason,
            detail=detail,
        )
        if experiment in self.experiments:
            self.metrics.message(experiment, kind, "rejected", reason)
            if not self._letter_budget.take(experiment):
                return  # a flood: counted and logged, not written (each letter is an fsync)
            letter = DeadLetter.for_rejected(message.topic, message.payload, reason, detail)
            exp = self.experiments[experiment]
            with contextlib.suppress(asyncio.QueueFull):  # full: the store is behind; log only
                self._letters_to_store.put_nowait(
                    _Letter(exp, message.topic, reason, detail, message.payload, letter.at)
                )
            with contextlib.suppress(asyncio.QueueFull):
                self._dead_letters.put_nowait((self.topics.deadletter(experiment), encode(letter)))

    async def _store_dead_letters(self) -> None:
        """Store dead letters in a worker thread, a batch per commit: each commit is an fsync,
        which must not stall the event loop while a flood is being rejected."""
        while True:
            batch = [await self._letters_to_store.get(), *_drain(self._letters_to_store)]
            await asyncio.to_thread(self._write_letters, batch)

    @staticmethod
    def _write_letters(batch: list[_Letter]) -> None:
        by_experiment: dict[str, list[_Letter]] = {}
        for letter in batch:
            by_experiment.setdefault(letter.exp.name, []).append(letter)
        for name, letters in by_experiment.items():
            store = letters[0].exp.store
            with store.transaction():
                for letter in letters:
                    store.add_dead_letter(
                        name, letter.topic, letter.reason, letter.detail, letter.payload, letter.at
                    )

    async def _publish_dead_letters(self) -> None:
        while True:
            topic, payload = await self._dead_letters.get()
            await self.link.publish(topic, payload)


def freeze_long_lived() -> None:
    """Keep what the process holds once started out of the garbage collector's full passes.

    A full (generation 2) collection stops every thread of the interpreter — the event loop
    included — for as long as it takes to scan every container object: with torch, BoTorch,
    the experiments and their recovered rounds, about 250,000 of them, 160–195 ms of CPU on the
    2-core development machine; such a pass comes whenever enough objects survived since the
    last, so ingest saw it as a stall of every reading in flight. `gc.freeze` moves what lives
    now (after a collection: no garbage) to a permanent generation that collections skip; the
    objects are still freed when their last reference goes, only cycles among them wait for
    `gc.unfreeze` (the service's stop). Measured by `cbo-agent bench latency` (GC pauses
    and loop stalls per window).
    """
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class _Applied:
    """What `_apply` did with a batch: a verdict per ack, oracle value and reading (in batch
    order), the readings learned, and the actions to publish again after a reconnect."""

    verdicts: list[tuple[str, _Incoming, Verdict]]
    readings: list[tuple[Reading, _Incoming]]
    again: list[Action]


def _apply(exp: Experiment, batch: list[_Incoming]) -> _Applied:
    """Store and learn a batch of an experiment's input (worker thread; the experiment's driver
    waits for it, so nothing else touches the experiment meanwhile). The readings of the batch
    are learned together, in one block per round.

    A "reconnected" item: what was published on an earlier connection (or before a restart) and
    never acknowledged may have been lost with it: it is published again, same id (unless it
    has expired: a device would refuse it, and `due` ends the round) — recorded here, sent by
    the caller. "refitted" and "wake" items only woke the driver.
    """
    verdicts: list[tuple[str, _Incoming, Verdict]] = []
    readings: list[tuple[Reading, _Incoming]] = []
    again: list[Action] = []
    for item in batch:
        if item.kind == "reconnected":
            for live in exp.open_rounds:
                earlier = live.published_at is not None and live.published_at < item.at
                if earlier and live.acked_at is None and not live.action.expired(time.time()):
                    again.append(exp.republish(live.number))
            continue
        decoded = item.decoded
        if isinstance(decoded, Reading):
            readings.append((decoded, item))
        elif isinstance(decoded, Ack):
            verdicts.append(("ack", item, exp.on_ack(decoded)))
            exp.acks_in.handled(decoded.round)
        elif isinstance(decoded, Oracle):
            verdicts.append(("oracle", item, exp.on_oracle(decoded)))
    if readings:
        learned = exp.on_readings([reading for reading, _ in readings])
        for (_, item), verdict in zip(readings, learned, strict=True):
            verdicts.append(("reading", item, verdict))
    return _Applied(verdicts, readings, again)


def _settled(work: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of work whose caller was cancelled: its error was the caller's."""
    if not work.cancelled():
        work.exception()


def _ack_if_stored(work: asyncio.Future[_Applied], batch: list[_Incoming]) -> None:
    if work.cancelled() or work.exception() is not None:
        return  # not stored: a persistent session delivers it again, or the next owner asks
    for item in batch:
        if item.connection is not None and item.message is not None:
            item.connection.ack(item.message)


def _due_and_proposal(exp: Experiment, may_propose: bool) -> tuple[list[Action], LiveRound | None]:
    """The actions due again now, and the next round if one may start (worker thread: timeouts
    end rounds and the budget is read in the store; the proposal reserves there): None when
    none may start or the experiment finished. The proposal is deferred (`Experiment.propose`):
    its regret estimate waits for `mark_published`."""
    due = exp.due(exp.ticks())
    if not (may_propose and exp.can_propose(exp.ticks())):
        return due, None
    return due, exp.propose(deferred=True)


def _drain(queue: asyncio.Queue[_Letter]) -> list[_Letter]:
    """Everything waiting in `queue` now, without waiting."""
    return [queue.get_nowait() for _ in range(queue.qsize())]
