"""The regret estimate is off the decision's path: the runtime publishes a proposal first and
only then computes the estimate (and starts the round's model row), on the same model as at
the decision, so the estimate and every later decision are what they were inline."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import agent.decide as decide
from agent.experiment import Experiment
from agent.runtime import AgentService
from connectors.metrics import AgentMetrics
from connectors.mqtt import BrokerConfig
from connectors.store import Store
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment
from tests.test_agent_join import Clock, ack, chain_spec, reading
from tests.test_agent_service import WAIT_S, agent_config, fast_spec


def _spec(pipeline: int):
    spec = chain_spec()
    return spec.model_copy(
        update={"schedule": spec.schedule.model_copy(update={"pipeline": pipeline})}
    )


def _run(exp: Experiment, clock: Clock, rounds: int, *, deferred: bool) -> list[float | None]:
    """`rounds` proposals (two in flight at a time with pipeline 2), each acked and read after
    the next is proposed; the regret estimate after each publication."""
    estimates: list[float | None] = []
    waiting = []
    for _ in range(rounds):
        live = exp.propose(deferred=deferred)
        if deferred:  # nothing of the model's part yet: the estimate, its row, its pending point
            assert not live.settled and live.pending is None
            assert len(exp.model.history) == live.model_round
        exp.mark_published(live.number)
        assert live.settled and len(exp.model.history) == live.model_round + 1
        estimates.append(exp.regret.upper_estimate)
        waiting.append(live)
        if len(waiting) == exp.spec.schedule.pipeline:
            done = waiting.pop(0)
            exp.on_ack(ack(exp, done.number))
            clock.now += 1.0
            value, seq = 0.1 * done.number, 3 * done.number  # a device's seq never repeats
            values = [value * (i + 1) for i in range(3)]
            exp.on_readings(
                [reading(exp, done.number, n, values[i], seq + i) for i, n in enumerate("ABC")]
            )
    return estimates


@pytest.mark.parametrize("pipeline", [1, 2])
def test_a_deferred_proposal_settles_when_published_with_the_inline_estimate(pipeline):
    runs = {}
    for deferred in (False, True):
        clock = Clock()
        with Store(":memory:") as store:
            exp = Experiment(_spec(pipeline), store, clock=clock)
            estimates = _run(exp, clock, 8, deferred=deferred)
            interventions = [exp.rounds[n].intervention for n in sorted(exp.rounds)]
            runs[deferred] = (estimates, interventions, exp.model.gp.num_observations.tolist())
    assert runs[True][0][-1] is not None  # the estimate was computed (two rewards seen)
    assert runs[True] == runs[False]  # same estimates, same later decisions (same rng draws)


def test_settle_is_once_per_round():
    clock = Clock()
    with Store(":memory:") as store:
        exp = Experiment(_spec(1), store, clock=clock)
        _run(exp, clock, 4, deferred=True)
        live = exp.propose(deferred=True)
        exp.mark_published(live.number)
        estimate, rows = exp.regret.upper_estimate, len(exp.model.history)
        exp.republish(live.number)
        exp.mark_published(live.number)  # a re-publication settles nothing again
        assert (exp.regret.upper_estimate, len(exp.model.history)) == (estimate, rows)


@pytest.mark.integration
async def test_the_service_publishes_each_proposal_before_its_regret_estimate(
    mosquitto, tmp_path, monkeypatch
):
    """Order of events in a running service: every round's action leaves for the broker
    before the estimate of that round is computed."""
    order: list[tuple[str, object]] = []
    estimate = decide.regret_bound

    def recorded(model, intervention, rng):
        order.append(("estimate", len(model.history)))  # the round's row is not started yet
        return estimate(model, intervention, rng)

    monkeypatch.setattr(decide, "regret_bound", recorded)

    class Recording(AgentService):
        async def _publish_action(self, exp, action, *, reserved=False):
            await super()._publish_action(exp, action, reserved=reserved)
            order.append(("published", action.round))

    spec = fast_spec("order", rounds=5)
    device = SimulatorDevice(
        make_environment("toygraph"),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="order", delay_s=0.01, seed=1),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    service = Recording(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    try:
        await asyncio.wait_for(service.run(), WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task
    exp = service.experiments["order"]
    firsts = {}
    for i, (kind, number) in enumerate(order):
        if kind == "published":
            firsts.setdefault(number, i)
    estimates = [(i, number) for i, (kind, number) in enumerate(order) if kind == "estimate"]
    assert len(firsts) == 5 and estimates  # the last rounds' estimates (two rewards seen)
    for i, model_round in estimates:
        number = next(n for n, live in exp.rounds.items() if live.model_round == model_round)
        assert firsts[number] < i  # that round's action went out first


def test_the_latency_ends_at_the_hand_over_and_the_timers_start_at_the_mark():
    """`mark_published(at=)`: the decision's latency runs to the publication (`at`); the ack
    timeout counts from the mark, so a replica slow to mark never spends the device's time."""
    clock = Clock()
    metrics = AgentMetrics()
    with Store(":memory:") as store:
        exp = Experiment(_spec(1), store, clock=clock, metrics=metrics)
        first = exp.propose(deferred=True)
        exp.mark_published(first.number)
        exp.on_ack(ack(exp, first.number))
        exp.on_readings([reading(exp, first.number, n, 0.5, i) for i, n in enumerate("ABC")])
        closed = clock.now
        clock.now += 0.25  # the proposal
        second = exp.propose(deferred=True)
        handed = clock.now
        clock.now += 2.0  # the mark's worker thread gets its turn late
        exp.mark_published(second.number, handed)
        seconds = metrics.registry.get_sample_value(
            "cbo_decision_seconds_sum", {"experiment": exp.name}
        )
        assert seconds == pytest.approx(handed - closed)
        assert second.published_at == clock.now
