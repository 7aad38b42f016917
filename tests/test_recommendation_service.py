"""The recommendation through the service on a real Mosquitto (issue 14): a multi-fidelity
experiment publishes, retained, the setting its policy would run if it stopped now, and when the
budget is spent that recommendation — marked final — is what remains on the broker."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import torch

from agent.experiment import Experiment
from agent.runtime import AgentService
from connectors.mqtt import BrokerConfig, MqttConnection
from connectors.schemas import Reading, Recommended, decode
from connectors.store import Store
from connectors.topics import Topics
from core.spec import load_spec
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment
from tests.test_agent_join import ack
from tests.test_agent_service import EXAMPLES, agent_config

WAIT_S = 120.0
NAME = "gw10-short"


def short_gw10():
    """GW10 with two fidelities and small replications: a design of 2 θ at each level (4
    rounds, 4,800), then the knowledge gradient until the budget of 6,000 is spent."""
    spec = load_spec(EXAMPLES / "gw10.yaml")
    fidelity = spec.fidelity.model_copy(update={"levels": [200.0, 1000.0], "replications": [1, 2]})
    return spec.model_copy(
        update={
            "name": NAME,
            "fidelity": fidelity,
            "constraints": spec.constraints.model_copy(update={"budget_total": 6000.0}),
            "policy": spec.policy.model_copy(
                update={"settings": {"design_per_level": 2, "grid_size": 100, "restarts": 1}}
            ),
            "schedule": spec.schedule.model_copy(
                update={"max_rounds": 16, "ack_timeout_s": 20.0, "round_timeout_s": 60.0}
            ),
        }
    )


@pytest.mark.integration
async def test_the_recommendation_is_published_retained_and_final_when_the_budget_is_spent(
    mosquitto, tmp_path
):
    spec = short_gw10()
    broker = BrokerConfig.from_url(mosquitto.url)
    device = SimulatorDevice(
        make_environment("gw10"),
        broker,
        DeviceSettings(experiment=NAME, device_id=spec.actuator_id, publish_oracle=False, seed=3),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    topic = Topics().recommendation(NAME)
    seen: list[Recommended] = []

    async def watch() -> None:
        async with MqttConnection(broker) as mqtt:
            await mqtt.subscribe(topic)
            async for message in mqtt.messages():
                seen.append(decode(message.payload, Recommended))
                if seen[-1].final:
                    return

    service = AgentService(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(service.run(), WAIT_S)
        await asyncio.wait_for(watcher, 10.0)
    finally:
        for task in (device_task, watcher):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    exp = service.experiments[NAME]
    assert "budget" in exp.finished_reason or "affordable" in exp.finished_reason, (
        exp.finished_reason
    )
    with Store(tmp_path / "agent.sqlite") as store:
        trials = len(store.readings(NAME))
    assert trials > 4  # the design and at least one knowledge-gradient trial
    # one recommendation per change while the experiment ran, then the final one
    assert len(seen) >= 2 and [m.final for m in seen] == [False] * (len(seen) - 1) + [True]
    final = seen[-1]
    assert set(final.values) == set(spec.parameter_names)  # θ: neither τ nor q
    assert final.fidelity == 1000.0 and final.trials == trials
    # the agent's policy, asked now, gives what was published last
    again = exp.policy.recommendation(exp.model)
    assert again is not None and again.values == final.values
    assert again.predicted == pytest.approx(final.predicted, rel=1e-9)
    value = service.metrics.registry.get_sample_value("cbo_recommended_value", {"experiment": NAME})
    assert value == pytest.approx(final.predicted)

    # retained: a subscriber who comes after the agent stopped still gets the final one
    async with MqttConnection(broker) as late:
        await late.subscribe(topic)
        async with asyncio.timeout(10.0):
            async for message in late.messages():
                assert message.retain
                assert decode(message.payload, Recommended) == final
                break


@pytest.mark.integration
async def test_late_readings_of_a_finished_experiment_renew_its_final_recommendation(
    mosquitto, tmp_path
):
    """An experiment that finished with a round closed unread lingers for late readings; one
    that arrives is learned, and the final recommendation is asked again and republished."""
    spec = short_gw10()
    spec = spec.model_copy(update={"schedule": spec.schedule.model_copy(update={"max_rounds": 5})})
    device = spec.actuator_id
    store_path = tmp_path / "agent.sqlite"
    gen = torch.Generator().manual_seed(0)

    def score(round_: int, live) -> Reading:
        return Reading(
            experiment=NAME,
            round=round_,
            node="score",
            value=-3.0 + float(torch.rand(1, generator=gen)),
            seq=round_,
            device_id=device,
            at=1.0,
            variance=0.01,
            replications=int(live.intervention["reps"]),
        )

    with Store(store_path) as store:  # four rounds learned, the fifth closed unread
        exp = Experiment(spec, store, seed=0)
        for t in range(5):
            live = exp.propose()
            exp.mark_published(live.number)
            exp.on_ack(ack(exp, live.number).model_copy(update={"device_id": device}))
            if t < 4:
                exp.on_readings([score(t, live)])
            else:
                exp.due(live.acked_at + spec.schedule.round_timeout_s)
        late = score(4, live)
        assert not exp.can_propose(exp.ticks())  # max_rounds reached: finished
        assert exp.finished and exp.missing_readings() == {4: ["score"]}

    broker = BrokerConfig.from_url(mosquitto.url)
    topics = Topics()
    service = AgentService(agent_config(mosquitto.url, store_path), [spec])
    seen: list[Recommended] = []

    async def watch_and_send_late() -> None:
        async with MqttConnection(broker) as mqtt:
            await mqtt.subscribe(topics.recommendation(NAME))
            async for message in mqtt.messages():
                seen.append(decode(message.payload, Recommended))
                if seen[-1].trials == 4:  # the final word before the late reading: send it
                    while not service._subscribed.is_set():  # the agent reads it once subscribed
                        await asyncio.sleep(0.01)
                    await mqtt.publish_message(topics.reading(NAME, device), late, qos=1)
                if seen[-1].trials == 5:
                    return

    watcher = asyncio.create_task(watch_and_send_late())
    try:
        await asyncio.wait_for(service.run(), WAIT_S)
        await asyncio.wait_for(watcher, 10.0)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert [(m.trials, m.final) for m in seen] == [(4, True), (5, True)]
    assert service.experiments[NAME].missing_readings() == {}
