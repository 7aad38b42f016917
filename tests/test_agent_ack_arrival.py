"""An ack counts as in time when the agent received it before the action's `expires_at`, not
when the experiment got round to handling it: a busy replica's own work (a slow worker thread,
a queue of other experiments' hops) must not expire a round whose ack waits in its inbox.

Issue 18: a replica with 100 experiments at load 7–16 let 33 rounds expire "no ack by
expires_at" while their acks sat unread in the inbox (docs/benchmarks.md, fleet18c).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

import agent.decide as decide
from agent.experiment import RoundStatus
from agent.runtime import AgentService
from connectors.metrics import AgentMetrics
from connectors.mqtt import BrokerConfig
from connectors.store import Store
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment
from tests.test_agent_budget import overspends, paid
from tests.test_agent_join import Clock, ack
from tests.test_agent_service import WAIT_S, agent_config, fast_spec


def _published(exp, clock):
    live = exp.propose()
    exp.mark_published(live.number)
    assert live.action.expires_at == clock.now + 2.0  # paid_spec: 2 × 1 s
    return live


def test_an_ack_received_before_expiry_holds_the_round_until_it_is_handled():
    clock, metrics = Clock(), AgentMetrics()
    with Store(":memory:") as store:
        exp = paid(store, clock, metrics)
        live = _published(exp, clock)
        clock.now += 1.9
        exp.acks_in.arrived(live.number, exp.ticks)  # the reader routed it, 0.1 s before expiry
        clock.now += 5.0  # the experiment's own work kept it in the inbox past the expiry
        assert exp.due(clock.now) == []  # no retry either: the device has answered
        assert live.status is RoundStatus.PUBLISHED
        assert exp.next_deadline(clock.now) == 0.0  # the driver reads its inbox at once
        assert exp.on_ack(ack(exp, live.number)).outcome == "accepted"
        exp.acks_in.handled(live.number)
        assert live.status is RoundStatus.ACKED and len(exp.acks_in) == 0
        assert store.ledger("paid").spent == 2.0  # settled once, not released and charged again
        assert overspends(metrics, "ack_after_expiry") == 0.0


def test_an_ack_received_at_or_after_expiry_does_not_hold_the_round():
    clock, metrics = Clock(), AgentMetrics()
    with Store(":memory:") as store:
        exp = paid(store, clock, metrics)
        live = _published(exp, clock)
        clock.now += 1.0
        exp.due(clock.now)  # the retry
        clock.now += 1.0
        exp.acks_in.arrived(live.number, exp.ticks)  # received exactly at expires_at: late
        clock.now += 0.5
        assert exp.due(clock.now) == []
        assert live.status is RoundStatus.EXPIRED
        assert store.ledger("paid").spent == 0.0  # released at expiry
        assert exp.on_ack(ack(exp, live.number)).outcome == "late"
        assert overspends(metrics, "ack_after_expiry") == 1.0


def test_a_handled_ack_no_longer_holds_its_round():
    """A "busy" ack received in time is handled (retry later); the round then expires on time."""
    clock = Clock()
    with Store(":memory:") as store:
        exp = paid(store, clock)
        live = _published(exp, clock)
        exp.acks_in.arrived(live.number, exp.ticks)
        busy = ack(exp, live.number).model_copy(update={"status": "rejected", "reason": "busy"})
        assert exp.on_ack(busy).outcome == "accepted"
        exp.acks_in.handled(live.number)
        clock.now += 2.0
        exp.due(clock.now)
        assert live.status is RoundStatus.EXPIRED


@pytest.mark.integration
async def test_a_slow_worker_does_not_expire_a_round_whose_ack_arrived_in_time(
    mosquitto, tmp_path, monkeypatch
):
    """Through a real Mosquitto: the device acks each action within milliseconds, and the
    worker call that marks the publication (`mark_published`, which settles the regret estimate)
    takes 2.5 s for the first two rounds — past their 1 s ack window. The acks were received in
    time: every round closes, none expires, nothing is charged twice."""
    slowed: list[int] = []
    settle = decide.settle

    def slow_settle(exp, live):
        if live.number < 2 and live.number not in slowed:
            slowed.append(live.number)
            time.sleep(2.5)  # a worker thread busy with other experiments' work
        return settle(exp, live)

    monkeypatch.setattr(decide, "settle", slow_settle)
    spec = fast_spec("slow", rounds=4, ack_timeout_s=0.5, ack_retries=1)  # 1 s window
    device = SimulatorDevice(
        make_environment("toygraph"),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="slow", delay_s=0.01, seed=1),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    service = AgentService(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    try:
        await asyncio.wait_for(service.run(), WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task
    exp = service.experiments["slow"]
    assert slowed == [0, 1]
    statuses = {n: live.status for n, live in exp.rounds.items()}
    assert statuses == dict.fromkeys(range(4), RoundStatus.CLOSED)
    assert service.handled[("slow", "ack", "late")] == 0
    assert service.handled[("slow", "ack", "accepted")] == 4
    assert overspends_of(service.metrics, "slow") == 0.0
    assert len(exp.acks_in) == 0


def overspends_of(metrics: AgentMetrics, experiment: str) -> float:
    return sum(
        sample.value
        for family in metrics.registry.collect()
        if family.name == "cbo_device_overspend"
        for sample in family.samples
        if sample.labels.get("experiment") == experiment and sample.name.endswith("_total")
    )
