"""A fleet replica (`cbo-agent serve`): runs the experiments it holds leases on, out of a store
it shares with other replicas.

Every `heartbeat_s` a renewal task renews the leases the replica holds and a claim task takes
unowned or expired experiments up to `capacity` (both beside the event loop: their store calls
run in worker threads) (`connectors.store.leases`). An experiment taken is rebuilt from the store
(`agent.recovery`: same rounds, budget and model) on a `Store.fenced` view carrying the lease
epoch, so every write it makes is refused once another replica holds a newer epoch; its topics
are subscribed (only those of owned experiments: plain MQTT 3.1.1), and it is driven exactly as
`AgentService` drives one, its actions stamped with the epoch (`cbo.action` version 3).

When it lets go
    - the renewal says *stopped* (`cbo-agent stop`): dropped at once, lease released; and
      before each publication the desired state is read (for a new round, by its reservation),
      so a stopped experiment's actions stop within one publication of the stop returning,
      not one heartbeat;
    - *paused*: kept, no new round; rounds in flight go on; *running* again: it carries on;
    - the renewal is refused (another replica took it: `FencedError`), or the lease's local
      deadline passed without a renewal (counted on this process's monotonic clock from when
      the renewal was *sent*, so it comes before the store's expiry): dropped, no more
      publications, and any write already under way is fenced by the store;
    - it finishes (round limit or budget): its owner stops it in the store (its history stays,
      `status` shows it) and releases the lease;
    - the process is asked to stop (SIGTERM): every lease is released so other replicas take
      the experiments over at once instead of after the TTL.

A replica taking an experiment over re-publishes, with its new epoch, every round still open
and every round whose feedback is incomplete and was still due when the previous owner may have
stopped storing (`unanswered`): devices drop anything older and send the readings they
already published again (docs/protocol.md, "Fencing"), so the readings sent while nobody owned
it, or that the previous owner received and never stored, are not lost.

What touches the store runs in worker threads, each experiment's calls one at a time (its
driver awaits each), so the event loop only routes, counts and publishes. Hyperparameter
refits run as in `AgentService` (`agent.refits`): in the replica's one fit process, a job per
experiment at a time, installed by the experiment's driver between batches; a job under way
finishes in the fit process when the replica lets go of the experiment (its
result is dropped; the other experiments' fits go on). Inline, each refit ran inside the batch
that made it due, holding the interpreter lock the other experiments' drivers and the event
loop need (at 100 experiments most of a replica's CPU, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import os
import re
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from agent.config import AgentConfig
from agent.control_topic import answer
from agent.experiment import Experiment, reserve_share
from agent.refits import RECENT_RECORDS, BackgroundRefits
from agent.rounds import EventSink, LiveRound, RoundStatus
from agent.runtime import INBOX_LIMIT, AgentService, _Incoming
from agent.tasks import stop_tasks
from agent.timers import ack_window
from connectors.metrics import MetricsServer, Readiness
from connectors.mqtt import (
    IncomingMessage,
    MqttConnection,
    MqttConnectionError,
    Presence,
    run_with_reconnect,
)
from connectors.schemas import Action, encode
from connectors.store import FencedError, Lease, NotRunning, Store, StoreError
from connectors.topics import TopicError
from core.errors import SpecError
from core.spec import parse_spec
from policies.registry import policy_classes

log = structlog.get_logger(__name__)
_T = TypeVar("_T")

QUARANTINE_S = 60.0  # an experiment that failed to load or crashed is not taken again sooner


@dataclass(frozen=True)
class FleetSettings:
    """How a replica shares the fleet's experiments.

    Attributes:
        capacity: the most experiments this replica owns at once.
        lease_ttl_s: a lease not renewed for this long may be taken by another replica; the
            failover time is at most this plus one heartbeat.
        heartbeat_s: how often leases are renewed and free experiments taken (default a third
            of the TTL, so two renewals may fail before the lease is lost).
    """

    capacity: int = 100
    lease_ttl_s: float = 15.0
    heartbeat_s: float | None = None

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {self.capacity}")
        if not self.lease_ttl_s > 0:
            raise ValueError(
                f"lease TTL must be a positive number of seconds, got {self.lease_ttl_s}"
            )
        if self.heartbeat_s is not None and not 0 < self.heartbeat_s < self.lease_ttl_s:
            raise ValueError(
                f"heartbeat ({self.heartbeat_s} s) must be positive and below the lease TTL "
                f"({self.lease_ttl_s} s)"
            )

    @property
    def period_s(self) -> float:
        return self.heartbeat_s if self.heartbeat_s is not None else self.lease_ttl_s / 3


def default_replica_id() -> str:
    """`{hostname}-{pid}`, cut to an identifier: unique per process on a machine, and stable
    across container restarts of one pod (its hostname, pid 1)."""
    raw = f"{socket.gethostname()}-{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", raw)[-64:]


class _LeaseExpired(Exception):
    """The lease's local deadline passed: this replica must not act for the experiment."""


@dataclass
class _Held:
    lease: Lease
    deadline: float  # monotonic: no publication from then on without a renewal
    paused: bool = False
    task: asyncio.Task[None] | None = None
    owned_since: float = field(default_factory=time.time)
    load_s: float = 0.0  # acquiring and rebuilding it, before `owned_since`


class FleetService(AgentService):
    """One replica of a fleet. `await run()` until cancelled.

    Args:
        config: broker, store (shared: PostgreSQL for replicas on several machines), metrics,
            and `agent_id`, the replica's owner id (unique in the fleet).
        settings: capacity, lease TTL and heartbeat.
        on_event: receives every `RoundEvent`.
        store: an open store to use instead of opening `config.store.path`.
    """

    def __init__(
        self,
        config: AgentConfig,
        settings: FleetSettings,
        *,
        on_event: EventSink | None = None,
        store: Store | None = None,
    ) -> None:
        super().__init__(config, [], on_event=on_event, store=store)
        self.settings = settings
        self.owner = config.agent_id
        self.readiness = Readiness("broker_connected", "leases")
        self.held: dict[str, _Held] = {}
        # (experiment, epoch, unix time) taken and (experiment, why, unix time) dropped, the
        # latest only: a replica of a long-lived fleet takes and drops for months
        self.taken: collections.deque[tuple[str, int, float]] = collections.deque(
            maxlen=RECENT_RECORDS
        )
        self.dropped: collections.deque[tuple[str, str, float]] = collections.deque(
            maxlen=RECENT_RECORDS
        )
        self._quarantine: dict[str, float] = {}  # experiment -> monotonic time it may be retaken
        self._connection: MqttConnection | None = None
        self._subscriptions = asyncio.Lock()
        self._shared: Store | None = None
        self._control_tasks: set[asyncio.Task[None]] = set()
        self._load_s: dict[str, float] = {}
        self._acquired_at: dict[str, float] = {}  # unix time each lease was granted (a log field)
        # Renewals and claims have a thread each, not the shared pool where the experiments'
        # store work and proposals queue: a busy replica must still renew on time.
        self._renewals = ThreadPoolExecutor(1, thread_name_prefix="renewals")
        self._claims = ThreadPoolExecutor(1, thread_name_prefix="claims")

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Serve the fleet's experiments until cancelled; release every lease on the way out."""
        own_store = self._store is None
        store = self._store or Store(self.config.store.path)
        self._shared = store
        server = MetricsServer(
            self.metrics.registry,
            self.readiness,
            host=self.config.metrics.host,
            port=self.config.metrics.port,
        )
        server.start()
        self.metrics_server = server
        if self.background_refits:
            self._fit_worker.warm()  # its imports take seconds: not at the first refit
        # Every policy module, imported before anything is claimed: the first experiment a
        # replica takes (in a failover, a takeover) would otherwise wait for these imports,
        # seconds on a loaded machine, inside the failover time.
        await asyncio.to_thread(policy_classes)
        log.info(
            "fleet.started",
            agent_id=self.owner,
            store=str(store.path),
            capacity=self.settings.capacity,
            lease_ttl_s=self.settings.lease_ttl_s,
            heartbeat_s=self.settings.period_s,
            metrics=server.url,
        )
        try:
            await self._serve_fleet(store)
        finally:
            for task in [h.task for h in self.held.values() if h.task is not None]:
                task.cancel()
            held = {name: h.lease.epoch for name, h in self.held.items()}
            self.held.clear()
            await self._settle()  # the store writes under way, before the leases go
            with contextlib.suppress(StoreError):
                await asyncio.to_thread(self._release_all, store, held)
            server.close()
            self._fit_worker.close()
            for executor in (self._renewals, self._claims):  # a pass under way ends first
                await asyncio.to_thread(executor.shutdown, True)
            if own_store:
                store.close()
            log.info("fleet.stopped", agent_id=self.owner, released=sorted(held))

    async def _serve_fleet(self, store: Store) -> None:
        broker = self.config.broker.to_broker_config(client_id=self.owner)
        presence = Presence(self.owner, experiments=(), topics=self.topics)
        self.readiness.set("broker_connected", False, f"connecting to {self._broker_url}")
        self.readiness.set("leases", False, "no heartbeat yet")
        tasks = [
            asyncio.create_task(
                run_with_reconnect(
                    broker, self._session, presence=presence, on_failure=self._broker_failed
                ),
                name="mqtt",
            ),
            asyncio.create_task(self._renew_loop(store), name="renew"),
            asyncio.create_task(self._claim_loop(store), name="claim"),
        ]
        if self.config.broker.connect_timeout_s is not None:  # else it returns at once
            tasks.append(asyncio.create_task(self._connect_deadline(), name="connect-deadline"))
        letters = asyncio.create_task(self._publish_dead_letters(), name="dead-letters")
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a fatal broker error or a bug stops the replica
        finally:
            await stop_tasks((*tasks, letters))

    # ------------------------------------------------------------------ leases
    async def _renew_loop(self, store: Store) -> None:
        """Renew what is held and drop what is lost, every `heartbeat_s`, off the event loop.

        A task of its own, so that taking (and rebuilding) experiments never delays a renewal.
        """
        period = self.settings.period_s
        while True:
            started = time.monotonic()
            try:
                await self._heartbeat(store)
            except StoreError as error:  # the store is unreachable: leases run out locally
                self.readiness.set("leases", False, f"store: {error}")
                log.warning("fleet.store_unreachable", error=str(error))
            else:
                self.readiness.set("leases", True, f"owns {len(self.held)} experiments")
            self._expire_locally()
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))

    async def _claim_loop(self, store: Store) -> None:
        """Take free experiments up to the capacity, every `heartbeat_s`."""
        period = self.settings.period_s
        while True:
            started = time.monotonic()
            try:
                await self._claim(store)
            except StoreError as error:  # a replica holding nothing learns of the store here
                self.readiness.set("leases", False, f"store: {error}")
                log.warning("fleet.claim_failed", error=str(error))
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))

    async def _heartbeat(self, store: Store) -> None:
        held = {name: h.lease.epoch for name, h in self.held.items()}
        if not held:
            return
        sent = time.monotonic()
        results = await _in(self._renewals, self._renew_all, store, held)
        for name, result in results.items():
            mine = self.held.get(name)
            if mine is None or mine.lease.epoch != held[name]:
                continue  # dropped meanwhile
            if isinstance(result, FencedError):
                await self._drop(name, "lease_lost", release=False)
            elif isinstance(result, Lease):
                mine.lease = result
                mine.deadline = sent + self.settings.lease_ttl_s
                await self._follow_state(name, result.state)
        broken = [
            r
            for r in results.values()
            if isinstance(r, StoreError) and not isinstance(r, FencedError)
        ]
        if broken:
            raise StoreError(f"lease renewal failed: {broken[0]}")

    def _renew_all(
        self, store: Store, held: dict[str, int]
    ) -> dict[str, Lease | StoreError | None]:
        """Renew each lease (worker thread), all in one transaction: one commit (one fsync on
        SQLite) per heartbeat, however many experiments. A lease lost (`FencedError`) writes
        nothing and the others go on; after any other failure (the store is unreachable) the
        transaction is given up and nothing counts as renewed (None)."""
        results: dict[str, Lease | StoreError | None] = dict.fromkeys(held)
        try:
            with store.transaction():
                for name, epoch in held.items():
                    try:
                        results[name] = store.renew_lease(
                            name, self.owner, epoch, self.settings.lease_ttl_s
                        )
                    except FencedError as error:
                        results[name] = error
        except StoreError as error:
            return {name: error for name in held}
        return results

    async def _claim(self, store: Store) -> None:
        free = self.settings.capacity - len(self.held)
        if free <= 0:
            return
        now = time.monotonic()
        skip = {name for name, until in self._quarantine.items() if until > now}
        taken = await _in(self._claims, self._take, store, free, skip)
        for lease, built, sent in taken:
            if isinstance(built, Experiment):
                await self._adopt(lease, built, sent)
                continue
            log.error("fleet.experiment_unloadable", experiment=lease.experiment, error=built)
            self._load_s.pop(lease.experiment, None)
            self._acquired_at.pop(lease.experiment, None)
            self._quarantine[lease.experiment] = time.monotonic() + QUARANTINE_S
            with contextlib.suppress(StoreError):
                await asyncio.to_thread(
                    store.release_lease, lease.experiment, self.owner, lease.epoch
                )

    def _take(
        self, store: Store, free: int, skip: set[str]
    ) -> list[tuple[Lease, Experiment | str, float]]:
        """Acquire up to `free` experiments and rebuild each from the store (worker thread):
        (lease, experiment or why not, monotonic time the acquisition was sent).

        A pass lasts at most one heartbeat period: rebuilding is replaying, and leases taken
        early in a long pass would run out before the next heartbeat renews them.
        """
        taken: list[tuple[Lease, Experiment | str, float]] = []
        started = time.monotonic()
        for name in store.claimable(limit=free + len(skip)):
            if len(taken) >= free or time.monotonic() - started > self.settings.period_s:
                break
            if name in skip or name in self.held:
                continue
            sent = time.monotonic()
            lease = store.acquire_lease(name, self.owner, self.settings.lease_ttl_s)
            if lease is None:
                continue  # another replica was faster
            self._acquired_at[name] = time.time()
            built = self._build(store, lease)
            self._load_s[name] = time.monotonic() - sent
            if isinstance(built, Experiment) and time.monotonic() - sent > self.settings.period_s:
                # rebuilding took a while: renew before handing it over, as the heartbeat would
                sent = time.monotonic()
                try:
                    lease = store.renew_lease(
                        name, self.owner, lease.epoch, self.settings.lease_ttl_s
                    )
                except StoreError as error:
                    built = f"lease lost while loading: {error}"
            taken.append((lease, built, sent))
        return taken

    def _build(self, store: Store, lease: Lease) -> Experiment | str:
        """The experiment rebuilt on a view fenced by the lease's epoch, or why it cannot be."""
        name = lease.experiment
        try:
            document = store.experiment_spec(name)
            spec = parse_spec(document, f"store spec of {name!r}")
            return Experiment(
                spec,
                store.fenced(name, lease.epoch),
                seed=spec.initial_design.seed,
                metrics=self.metrics,
                on_event=self.on_event,
                device=self.config.device,
                background_refits=self.background_refits,
                # a replica may hold `capacity` experiments: each reserves its share only
                reserve_bytes=reserve_share(self.settings.capacity, self.config.reserve_mb * 2**20),
            )
        except FencedError as error:
            return f"fenced while loading: {error}"
        except (SpecError, StoreError, ValueError) as error:
            return f"{type(error).__name__}: {error}"

    def _release_all(self, store: Store, held: dict[str, int]) -> None:
        """Give every lease back (worker thread): the others need not wait out the TTL."""
        for name, epoch in held.items():
            with contextlib.suppress(StoreError):
                store.release_lease(name, self.owner, epoch)

    def _expire_locally(self) -> None:
        """Stop acting for experiments whose lease ran out on our own clock."""
        now = time.monotonic()
        for name, mine in list(self.held.items()):
            if now >= mine.deadline:
                self._spawn_drop(name, "lease_expired")

    def _spawn_drop(self, name: str, why: str) -> None:
        asyncio.get_running_loop().create_task(self._drop(name, why, release=False))

    async def _follow_state(self, name: str, state: str) -> None:
        """The control plane's desired state, as the renewal brought it."""
        mine = self.held[name]
        if state == "stopped":
            await self._drop(name, "stopped", release=True)
        elif state == "paused" and not mine.paused:
            mine.paused = True
            log.info("fleet.paused", experiment=name)
        elif state == "running" and mine.paused:
            mine.paused = False
            log.info("fleet.resumed", experiment=name)
            self.wake(name)

    # ------------------------------------------------------------------ owning one experiment
    async def _adopt(self, lease: Lease, exp: Experiment, sent: float) -> None:
        """Own the experiment: inbox, subscriptions, driver — unless it was dropped meanwhile
        (its lease ran out while the subscriptions were made)."""
        name = exp.name
        mine = _Held(
            lease,
            sent + self.settings.lease_ttl_s,
            paused=lease.state == "paused",
            load_s=self._load_s.pop(name, 0.0),
        )
        self.held[name] = mine
        self.experiments[name] = exp
        inbox: asyncio.Queue[_Incoming] = asyncio.Queue(maxsize=INBOX_LIMIT)
        self._inboxes[name] = inbox
        if self.background_refits:
            wake = _Incoming("refitted", None)
            self.refits[name] = BackgroundRefits(
                exp,
                lambda inbox=inbox, wake=wake: self._offer(inbox, wake),
                self._fit_worker,
                keep_worker=True,  # letting go of one experiment ends no other's fit
            )
        self.metrics.register_experiment(name)
        self.taken.append((name, lease.epoch, time.time()))
        async with self._subscriptions:
            # the session's connection, held once: a session ending during the awaits below
            # sets `_connection` to None (the next session subscribes what is held)
            connection = self._connection
            if connection is not None:
                with contextlib.suppress(MqttConnectionError):
                    for topic_filter in self._experiment_filters(name):
                        await connection.subscribe(topic_filter)
        log.info(
            "fleet.taken",
            experiment=name,
            epoch=lease.epoch,
            state=lease.state,
            load_s=round(mine.load_s, 3),  # acquiring and rebuilding it
            acquired_at=self._acquired_at.pop(name, None),  # the lease granted, before both
        )
        if self.held.get(name) is not mine:
            return  # dropped while subscribing: `_drop` has cleaned up
        mine.task = asyncio.create_task(self._own(exp, lease.epoch), name=f"own:{name}")

    async def _own(self, exp: Experiment, epoch: int) -> None:
        """Drive the experiment until it finishes or this replica lets go of it."""
        name = exp.name
        with structlog.contextvars.bound_contextvars(experiment=name, epoch=epoch):
            try:
                await self._take_over(exp)
                while True:
                    try:
                        await self._drive(exp)
                        break
                    except NotRunning as refused:  # paused or stopped before the heartbeat saw
                        if refused.state == "stopped":
                            await self._drop(name, "stopped", release=True)
                            return
                        if name in self.held:
                            self.held[name].paused = True
                await self._finished(exp)
            except FencedError as error:
                log.warning("fleet.fenced", error=str(error))
                await self._drop(name, "lease_lost", release=False)
            except _LeaseExpired:
                await self._drop(name, "lease_expired", release=False)
            except StoreError as error:  # e.g. the server closed a connection left idle in a
                # transaction while this process was frozen: whatever was under way rolled back
                log.warning("fleet.store_error", error=str(error))
                self._quarantine[name] = time.monotonic() + self.settings.lease_ttl_s
                await self._drop(name, "store_error", release=True)
            except asyncio.CancelledError:
                raise
            except Exception:  # one experiment's fault must not stop the others
                log.exception("fleet.experiment_failed")
                self._quarantine[name] = time.monotonic() + QUARANTINE_S
                await self._drop(name, "failed", release=True)
            finally:
                refits = self.refits.get(name)
                if refits is not None and refits.exp is exp:  # not a later owner's of it
                    del self.refits[name]
                    await refits.close()

    async def _take_over(self, exp: Experiment) -> None:
        """Re-publish, with this replica's epoch, every round `unanswered` returns: the device
        drops the old owner's copies and acknowledges again what it applied, with the readings
        it had sent (an action it never applied and that has expired it refuses, as always)."""
        mine = self.held[exp.name]
        # The previous owner's last renewal came at most a heartbeat before it died, and its
        # lease ran out a TTL later, before we acquired it (and spent `load_s` rebuilding).
        lapsed = mine.owned_since - mine.load_s - self.settings.lease_ttl_s - self.settings.period_s
        again = await asyncio.shield(self._beside(_ask_again, exp, lapsed))
        for action in again:
            await self._publish_action(exp, action)
        if again:
            log.info("fleet.asked_again", rounds=[a.round for a in again])

    async def _finished(self, exp: Experiment) -> None:
        """A finished experiment is stopped in the store (no replica takes it again)."""
        with contextlib.suppress(StoreError):
            await asyncio.to_thread(exp.store.stop, exp.name)
        log.info("fleet.finished", reason=exp.finished_reason)
        await self._drop(exp.name, "finished", release=True)

    async def _drop(self, name: str, why: str, *, release: bool) -> None:
        """Let go of the experiment: no driver, no subscription, (maybe) no lease."""
        mine = self.held.pop(name, None)
        if mine is None:
            return
        self.experiments.pop(name, None)
        inbox = self._inboxes.pop(name, None)
        self._inbox_bytes.pop(name, None)
        if inbox is not None:
            # What waits here unread is acknowledged, as input for an experiment not owned is
            # (`_route`): left unacknowledged, each message would hold a slot of the broker's
            # in-flight window for this connection until it drops (with churn the window fills
            # and the replica hears nothing more), and the broker redelivers it only after a
            # reconnect, to a replica that no longer owns it. The next owner asks the device
            # again for every round without all its feedback (`_take_over`).
            while not inbox.empty():
                item = inbox.get_nowait()
                if item.connection is not None and item.message is not None:
                    item.connection.ack(item.message)
        if mine.task is not None and mine.task is not asyncio.current_task():
            mine.task.cancel()
        refits = self.refits.pop(name, None)
        if refits is not None:
            await refits.close()  # a fit under way for it finishes; its result is dropped
        self.dropped.append((name, why, time.time()))
        log.info("fleet.dropped", experiment=name, why=why, epoch=mine.lease.epoch)
        async with self._subscriptions:
            connection = self._connection  # held once, as in `_adopt`
            if connection is not None:
                with contextlib.suppress(MqttConnectionError):
                    for topic_filter in self._experiment_filters(name):
                        await connection.unsubscribe(topic_filter)
        if release and self._shared is not None:
            with contextlib.suppress(StoreError):
                await asyncio.to_thread(
                    self._shared.release_lease, name, self.owner, mine.lease.epoch
                )

    # ------------------------------------------------------------------ hooks of AgentService
    def _may_propose(self, exp: Experiment) -> bool:
        mine = self.held.get(exp.name)
        return mine is not None and not mine.paused

    async def _publish_action(
        self, exp: Experiment, action: Action, *, reserved: bool = False
    ) -> None:
        """Publish with the lease epoch — only while the lease is ours by our own clock and
        the experiment is not stopped.

        The state is read before each publication, except for a round just proposed
        (`reserved`): its reservation read it moments ago, in the same worker call, and refuses
        a paused or stopped experiment (`NotRunning`); a second read was one more store round
        trip and thread hand-off on every decision's path, and a stop returning in between
        lets one publication out either way."""
        if not reserved:
            state = await asyncio.shield(self._beside(exp.store.experiment_state, exp.name))
            if state == "stopped":
                raise NotRunning(exp.name, action.round, state)
        mine = self.held.get(exp.name)  # checked after the read: the deadline may pass during it
        if mine is None or time.monotonic() >= mine.deadline:
            raise _LeaseExpired(exp.name)
        await super()._publish_action(exp, action.with_epoch(mine.lease.epoch), reserved=reserved)

    async def _subscribe_all(self, connection: MqttConnection) -> None:
        async with self._subscriptions:
            await connection.subscribe(self.topics.control_request())
            await super()._subscribe_all(connection)
            self._connection = connection

    async def _session(self, connection: MqttConnection) -> None:
        try:
            await super()._session(connection)
        finally:
            if self._connection is connection:
                self._connection = None

    def _route(self, message: IncomingMessage, connection: MqttConnection) -> None:
        """Input of an experiment this replica does not own (any more) is its owner's: the
        owner has its own subscription. Acknowledged and left alone."""
        if message.topic == self.topics.control_request():
            connection.ack(message)
            if self._shared is not None:
                task = asyncio.get_running_loop().create_task(
                    self._control(self._shared, message.payload)
                )
                self._control_tasks.add(task)
                task.add_done_callback(self._control_tasks.discard)
            return
        try:
            experiment = self.topics.parse(message.topic).experiment
        except TopicError:
            experiment = None
        if experiment is not None and experiment not in self.held:
            self.handled[(experiment, "any", "not_owned")] += 1
            connection.ack(message)
            return
        super()._route(message, connection)

    async def _control(self, store: Store, payload: bytes) -> None:
        """Answer one control request (`agent.control_topic`)."""
        reply = await asyncio.to_thread(answer, store, payload, self.owner, self.topics)
        if reply is not None:
            topic, message = reply
            await self.link.publish(topic, encode(message))

    def _reject(
        self,
        experiment: str | None,
        kind: str,
        message: IncomingMessage,
        reason: str,
        detail: str,
    ) -> None:
        try:
            super()._reject(experiment, kind, message, reason, detail)
        except FencedError as error:  # its dead letter is the new owner's to keep
            log.warning("fleet.dead_letter_fenced", experiment=experiment, error=str(error))


async def _in(executor: ThreadPoolExecutor, call: Callable[..., _T], *args: Any) -> _T:
    """`asyncio.to_thread` on a given executor (with the caller's context: its log binding)."""
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, functools.partial(context.run, call, *args))


def unanswered(exp: Experiment, since: float) -> list[LiveRound]:
    """The rounds a new owner asks the device about again, in round order: every round open and
    published, and every round whose feedback is incomplete — closed without all its readings,
    or expired without an ack (the device may have applied it and its ack gone to the old
    owner) — whose feedback was still due at `since` (unix time), or later.

    `since` is when the previous owner may have stopped storing what arrived: the earlier of
    when it may have died (the takeover, less the lease TTL and a heartbeat) and when the
    newest reading it stored arrived (a replica behind its input received, and never stored,
    what came after). A round's feedback is due until its action's window ends (`expires_at`)
    and the spec's round timeout after it; what was due only before `since` reached an owner
    that was alive and caught up, which stored it or found it missing while it still owned the
    experiment. So the bound follows the spec's timing, not a count of rounds: a deep pipeline
    or a burst of incomplete rounds is asked about in full, and a round whose sensor died long
    ago is not asked again at every takeover.
    """
    missing = exp.missing_readings()
    schedule = exp.spec.schedule
    rounds = []
    for number in sorted(exp.rounds):
        live = exp.rounds[number]
        if live.is_open:
            if live.published_at is not None:  # else `_drive` publishes it first thing
                rounds.append(live)
            continue
        if number not in missing and live.status is not RoundStatus.EXPIRED:
            continue
        expires = live.action.expires_at
        window = ack_window(schedule) if expires is None else 0.0
        due_until = (expires or live.action.issued_at) + window + schedule.round_timeout_s
        if due_until >= since:
            rounds.append(live)
    return rounds


def _ask_again(exp: Experiment, lapsed: float) -> list[Action]:
    """The actions that re-ask `unanswered(exp, since)` (worker thread: reads the store, and
    records a new attempt of each open round not yet acknowledged and not expired).

    `lapsed` is when the previous owner may have died; `since` is the earlier of that and the
    arrival of the newest reading stored."""
    since = lapsed
    newest = exp.store.last_reading_id(exp.name)
    if newest:
        rows = exp.store.readings(exp.name, after_id=newest - 1, limit=1)
        if rows:
            since = min(since, rows[0].received_at)
    actions = []
    now = exp.clock()
    for live in unanswered(exp, since):
        if not live.is_open or live.status is RoundStatus.ACKED:
            actions.append(live.action)  # applied (or its fate unknown): the same attempt
        elif not live.action.expired(now):
            actions.append(exp.republish(live.number))
        # open, unacknowledged and expired: `due` ends the round, the device would refuse it
    return actions
