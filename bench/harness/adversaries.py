"""Devices that misbehave beside the real one, for `cbo-agent bench chaos`.

Both log in with a device login of their own (the broker runs the shipped ACL) and run in a
thread of the harness, on paho's network loop, reconnecting by themselves after broker restarts.

`Forger` — an attacker with a valid device login who knows what is going on (it reads the
agent's store, as someone who can read every topic would know every action id). Every tick it
forges, for the newest round, an ack saying "rejected", a reading of the reward node and an
oracle message with a plausible expected reward, three ways: on its own topics claiming to be
the real device, on its own topics as itself, and on the real device's topics (which the broker's
ACL drops). It remembers what it forged, so the store can be searched for it afterwards
(`ForgeryRecord.accepted_in`).

`Flooder` — publishes invalid payloads (not JSON) on its own reading topic at a fixed rate,
bounded in count and time, beside the real device.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as paho

from connectors.schemas import Ack, MessageModel, Oracle, Reading, encode
from connectors.store import Store
from connectors.topics import Topics
from core.spec import ExperimentSpec

__all__ = ["Flooder", "Forger", "ForgeryRecord"]

FORGED_REASON = "forged"  # the reason of every forged "rejected" ack
_PUBACK_WAIT_S = 2.0
_TOPICS = Topics()


def _client(port: int, user: str, password: str) -> paho.Client:
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2, client_id=f"chaos-{user}", protocol=paho.MQTTv5
    )
    client.username_pw_set(user, password)
    client.reconnect_delay_set(0.1, 2.0)
    client.max_inflight_messages_set(100)
    client.connect_async("127.0.0.1", port)
    client.loop_start()
    return client


@dataclass
class ForgeryRecord:
    """What the forger sent: counts, and what to look for in the store."""

    sent: int = 0
    readings: set[tuple[str, str, int]] = field(default_factory=set)  # device, node, seq
    oracle_values: set[float] = field(default_factory=set)  # forged expected rewards
    rounds: set[int] = field(default_factory=set)  # rounds it forged a "rejected" ack for

    def accepted_in(self, store: Store, experiment: str, forger: str) -> dict[str, int]:
        """What of it the agent took: readings stored, oracle values stored, rounds ended by a
        forged rejection (their reason names the forged one)."""
        readings = sum(
            1
            for r in store.readings(experiment)
            if (r.device_id, r.node, r.seq) in self.readings or r.device_id == forger
        )
        oracles = sum(
            1 for o in store.oracles(experiment) if o.expected_reward in self.oracle_values
        )
        rejected = sum(
            1
            for row in store.rounds(experiment)
            if row.status == "rejected" and FORGED_REASON in (row.reason or "")
        )
        return {"readings": readings, "oracles": oracles, "rejections": rejected}


class Forger:
    """Forges acks, readings and oracle messages for the newest round, every `interval_s`."""

    def __init__(
        self,
        port: int,
        login: tuple[str, str],
        spec: ExperimentSpec,
        real_device: str,
        store_path: Path,
        interval_s: float = 0.5,
    ) -> None:
        self.user, password = login
        self.spec = spec
        self.real_device = real_device
        self.store_path = store_path
        self.interval_s = interval_s
        self.record = ForgeryRecord()
        self._client = _client(port, self.user, password)
        self._stop = threading.Event()
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="forger", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)
        self._client.loop_stop()
        self._client.disconnect()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._client.is_connected():
                continue
            newest = _newest_round(self.store_path, self.spec.name)
            if newest is not None:
                self._forge(*newest)

    def _forge(self, number: int, action_id: str, optimum: float | None) -> None:
        spec, real = self.spec, self.real_device
        for topic_device, claimed in ((self.user, real), (self.user, self.user), (real, real)):
            for kind, message in self._messages(number, action_id, optimum, claimed):
                topic = _TOPICS.device_topic(spec.name, topic_device, kind)  # type: ignore[arg-type]
                info = self._client.publish(topic, encode(message), qos=1)
                try:
                    info.wait_for_publish(_PUBACK_WAIT_S)
                except (RuntimeError, ValueError):
                    continue  # the link dropped: not sent
                if info.is_published():
                    self.record.sent += 1

    def _messages(
        self, number: int, action_id: str, optimum: float | None, claimed: str
    ) -> list[tuple[str, MessageModel]]:
        spec = self.spec
        reward = spec.node(spec.reward.node)
        low, high = reward.valid_range or reward.bounds
        self._seq += 1
        value = low + (high - low) * 0.123456789  # plausible, and not what a sensor reads
        now = time.time()
        self.record.readings.add((claimed, reward.name, self._seq))
        self.record.rounds.add(number)
        messages: list[tuple[str, MessageModel]] = [
            (
                "ack",
                Ack(
                    experiment=spec.name,
                    round=number,
                    action_id=action_id,
                    device_id=claimed,
                    status="rejected",
                    reason=FORGED_REASON,
                    applied={},
                    at=now,
                ),
            ),
            (
                "reading",
                Reading(
                    experiment=spec.name,
                    round=number,
                    node=reward.name,
                    value=value,
                    seq=self._seq,
                    device_id=claimed,
                    at=now,
                ),
            ),
        ]
        if optimum is not None:  # below the optimum: breaks no definition, only identity
            expected = optimum - (high - low) * 0.987654321
            self.record.oracle_values.add(expected)
            oracle = Oracle(
                experiment=spec.name,
                round=number,
                action_id=action_id,
                expected_reward=expected,
                optimum=optimum,
                device_id=claimed,
                at=now,
            )
            messages.append(("oracle", oracle))
        return messages


def _newest_round(store_path: Path, experiment: str) -> tuple[int, str, float | None] | None:
    """(round, action id, the optimum the oracle told) of the newest round, read-only."""
    if not store_path.exists():
        return None
    try:
        with sqlite3.connect(f"file:{store_path}?mode=ro", uri=True, timeout=1.0) as db:
            row = db.execute(
                "SELECT round, action_id FROM rounds WHERE experiment = ? "
                "ORDER BY round DESC LIMIT 1",
                (experiment,),
            ).fetchone()
            optimum = db.execute(
                "SELECT optimum FROM oracle WHERE experiment = ? LIMIT 1", (experiment,)
            ).fetchone()
    except sqlite3.Error:
        return None  # not created yet, or busy: next tick
    if row is None:
        return None
    return int(row[0]), str(row[1]), None if optimum is None else float(optimum[0])


class Flooder:
    """Publishes `count` invalid payloads on its own reading topic at `rate` per second at most,
    for at most `time_limit_s`."""

    def __init__(
        self,
        port: int,
        login: tuple[str, str],
        experiment: str,
        count: int,
        rate: float = 200.0,
        time_limit_s: float = 600.0,
    ) -> None:
        self.user, password = login
        self.topic = _TOPICS.device_topic(experiment, self.user, "reading")
        self.count, self.rate, self.time_limit_s = count, rate, time_limit_s
        self.sent = 0
        self._client = _client(port, self.user, password)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flooder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=_PUBACK_WAIT_S * 10)
        self._client.loop_stop()
        self._client.disconnect()

    def _run(self) -> None:
        deadline = time.monotonic() + self.time_limit_s
        tick_s = 0.1
        burst = max(1, int(self.rate * tick_s))
        while self.sent < self.count and time.monotonic() < deadline:
            if self._stop.wait(tick_s):
                return
            if not self._client.is_connected():
                continue
            infos = []
            for i in range(min(burst, self.count - self.sent)):
                payload = json.dumps({"flood": self.sent + i})[:-1].encode()  # not JSON
                infos.append(self._client.publish(self.topic, payload, qos=1))
            for info in infos:
                try:
                    info.wait_for_publish(_PUBACK_WAIT_S)
                except (RuntimeError, ValueError):
                    continue
                if info.is_published():
                    self.sent += 1
