"""The shipped Mosquitto's durability setting (deploy/mosquitto/mosquitto.conf), run for real.

The file saves on a timer (`autosave_on_changes false`, `autosave_interval` seconds), not after
every change: Mosquitto 2.0 rewrites and fsyncs its whole database at each save, so a save per
change made queueing N messages for an absent session cost O(N²). These tests run a broker with
the file's persistence settings (`bench.harness.shipped_broker`) and check what the file's
comment promises: queueing does not save per message, a stopped broker keeps every queued
message, and a killed one keeps those older than one save interval.
"""

from __future__ import annotations

import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from bench.harness.shipped_broker import shipped_broker
from tests.brokers import MosquittoBroker, find_mosquitto

TOPIC = "cbo/test/shipped"
SAVE_LINE = "Saving in-memory database"

pytestmark = pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed")


def _client(port: int, client_id: str, *, session: bool) -> paho.Client:
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5
    )
    client.max_inflight_messages_set(1000)
    properties = Properties(PacketTypes.CONNECT)
    if session:
        properties.SessionExpiryInterval = 600
    client.connect("127.0.0.1", port, clean_start=not session, properties=properties)
    return client


def _subscribe_and_leave(port: int) -> None:
    """A persistent session with a QoS 1 subscription, then away: the broker queues for it."""
    client = _client(port, "shipped-session", session=True)
    subscribed = []
    client.on_subscribe = lambda *args: subscribed.append(True)
    client.loop_start()
    try:
        client.subscribe(TOPIC, qos=1)
        deadline = time.monotonic() + 10
        while not subscribed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert subscribed, "no SUBACK"
    finally:
        client.disconnect()
        client.loop_stop()


def _publish(port: int, first: int, count: int) -> None:
    """QoS 1 messages `first` … `first + count - 1`, each acknowledged by the broker."""
    client = _client(port, "shipped-publisher", session=False)
    client.loop_start()
    try:
        infos = [client.publish(TOPIC, str(i).encode(), qos=1) for i in range(first, first + count)]
        for info in infos:
            info.wait_for_publish(timeout=30)
            assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def _drain(port: int, quiet_s: float = 1.0) -> list[int]:
    """What the session's queue delivers, until nothing comes for `quiet_s`."""
    received: list[int] = []
    client = _client(port, "shipped-session", session=True)
    client.on_message = lambda _c, _u, message: received.append(int(message.payload))
    client.loop_start()
    try:
        last, count = time.monotonic(), -1
        while time.monotonic() - last < quiet_s:
            if len(received) != count:
                last, count = time.monotonic(), len(received)
            time.sleep(0.05)
    finally:
        client.disconnect()
        client.loop_stop()
    return received


def _saves(broker: MosquittoBroker) -> int:
    return broker.log_path.read_text(errors="replace").count(SAVE_LINE)


def _shipped_broker(tmp_path: Path) -> tuple[MosquittoBroker, int]:
    shipped = shipped_broker()
    broker = MosquittoBroker(tmp_path / "mosquitto", shipped.options(tmp_path))
    return broker, shipped.autosave_interval


def test_the_shipped_file_saves_on_a_timer_within_a_bounded_window():
    shipped = shipped_broker()
    assert shipped.persistence
    assert shipped.settings.get("autosave_on_changes") == "false"
    # seconds: short enough that a crash loses little, long enough that saving a full queue
    # (0.4 s at 60,000 readings) takes a small share of the broker's time
    assert 1 <= shipped.autosave_interval <= 60


def test_queueing_for_an_absent_session_does_not_save_per_message_and_a_stop_keeps_all(tmp_path):
    broker, interval = _shipped_broker(tmp_path)
    broker.start()
    try:
        _subscribe_and_leave(broker.port)
        before, started = _saves(broker), time.monotonic()
        _publish(broker.port, 0, 500)
        elapsed = time.monotonic() - started
        # on a timer: one save per interval at most (with a save per change: 500 or more)
        assert _saves(broker) - before <= 1 + elapsed / interval
        broker.restart(timeout_s=30)  # SIGTERM: the broker saves on its way out
        assert sorted(_drain(broker.port)) == list(range(500))
    finally:
        broker.stop()


def test_a_killed_broker_keeps_what_was_queued_one_save_interval_before(tmp_path):
    broker, interval = _shipped_broker(tmp_path)
    broker.start()
    try:
        _subscribe_and_leave(broker.port)
        _publish(broker.port, 0, 200)
        time.sleep(interval + 1.5)  # a timed save has happened since
        _publish(broker.port, 200, 50)  # inside the window: these may be lost
        broker.restart(timeout_s=30, graceful=False)  # SIGKILL: no save on the way out
        received = set(_drain(broker.port))
        assert set(range(200)) <= received
        assert received <= set(range(250))
    finally:
        broker.stop()
