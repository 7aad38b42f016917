"""A drifting system through the service on a real Mosquitto: a time-aware model
(`model.time_scale`) and a change detector (`model.change`) that finds a step of the system;
a periodic factor (`model.period`) on the school calendar's SIR task; the dynamic regret of a
system whose optimum changes every round (`reward.optimum: per_round`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from typing import Any

import pytest

from agent.experiment import Experiment
from agent.runtime import AgentService
from connectors.mqtt import BrokerConfig
from connectors.schemas import Oracle
from connectors.store import Store
from core.spec import ChangeSpec, load_spec
from sim.device import DeviceSettings, SimulatorDevice
from sim.dropwave_drift import DropwaveDrift
from sim.sir_school_terms import SchoolTermsSIR
from sim.sir_seasonal import SeasonalSIR
from tests.test_agent_service import EXAMPLES, agent_config
from tests.test_policies_helpers import FAST

STEP_AT = 10  # the round from which the system reads SHIFT more at its reward node
SHIFT = 3.0  # 30 noise standard deviations
ROUNDS = 20


class _Shifted:
    """An environment whose reward node reads `shift` more than `env`'s."""

    def __init__(self, env: Any, shift: float) -> None:
        self.env, self.shift = env, shift

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def step_with_spread(self, applied, generator):
        values, spread = self.env.step_with_spread(applied, generator)
        return {**values, "Y": values["Y"] + self.shift}, spread


class _Stepped:
    """dropwave-drift whose reward node steps up by SHIFT from round STEP_AT on."""

    def __init__(self) -> None:
        self.env = DropwaveDrift()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def at(self, round_: int) -> Any:
        system = self.env.at(round_)
        return system if round_ < STEP_AT else _Shifted(system, SHIFT)


def _spec():
    spec = load_spec(EXAMPLES / "dropwave-drift.yaml")
    model = spec.model.model_copy(
        update={
            "capacity": None,
            "budget": None,
            "time_scale": 50.0,
            "change": ChangeSpec(warmup=4, keep=3),
            # no refit in the test's 20 rounds: a refit beside the loop that lands just after
            # the step (a misfit makes one due) can absorb it into a short time lengthscale
            # before the detector's fourth reading, and whether it lands first is timing
            "refit_every": 50,
            "misfit_z": None,
        }
    )
    return spec.model_validate(
        {
            **spec.model_dump(),
            "name": "drift",
            "model": model.model_dump(),
            "policy": {"name": "mcbo", "settings": {**FAST["mcbo"], "max_seconds": 2.0}},
            "initial_design": {"rounds": 3},
            "schedule": {
                **spec.schedule.model_dump(),
                "max_rounds": ROUNDS,
                "ack_timeout_s": 5.0,
                "round_timeout_s": 5.0,
            },
        }
    )


@pytest.mark.integration
async def test_a_time_aware_agent_finds_a_step_of_the_system(mosquitto, tmp_path):
    spec = _spec()
    device = SimulatorDevice(
        _Stepped(),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="drift", delay_s=0.01, seed=3, publish_oracle=False),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), 60)
    service = AgentService(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    try:
        await asyncio.wait_for(service.run(), 300)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task

    exp = service.experiments["drift"]
    assert exp.finished and len(exp.model.history) == ROUNDS
    model = exp.model
    assert model.timed and model.gp.dims.tolist() == [3, 2]  # (a0, a1, round), (X0, round)
    rows, _ = model.gp.member_data(model.member["X0"])
    times = (rows[:, 2] * 50.0).round().tolist()  # every round's (a change forgets the oldest)
    assert times == list(range(ROUNDS - len(times), ROUNDS))
    changes = exp.metrics.registry.get_sample_value(
        "cbo_model_changes_total", {"experiment": "drift", "node": "Y"}
    )
    assert changes is not None and changes >= 1
    # Y forgot what it learned before the step: it holds at most the rounds since, and at
    # least the change detector's `keep`
    held = int(model.gp.num_observations[model.member["Y"]])
    assert 3 <= held <= ROUNDS - STEP_AT


@pytest.mark.integration
async def test_a_periodic_model_runs_the_school_calendar_through_the_service(mosquitto, tmp_path):
    """`model.period` from the spec: every node GP holds (doses, round, cos, sin) of each
    round, and the policy proposes on it within the dose budget. (No oracle here: the regret
    of a drifting system is the next test's.)"""
    rounds, period = 6, 4.0
    spec = load_spec(EXAMPLES / "sir-school-terms.yaml")
    model = spec.model.model_copy(update={"time_scale": 52.0, "period": period})
    spec = spec.model_validate(
        {
            **spec.model_dump(),
            "name": "school",
            "model": model.model_dump(),
            "policy": {"name": "dgpucb", "settings": FAST["dgpucb"]},
            "initial_design": {"rounds": 2},
            "schedule": {
                **spec.schedule.model_dump(),
                "max_rounds": rounds,
                "ack_timeout_s": 5.0,
                "round_timeout_s": 5.0,
            },
        }
    )
    env = SchoolTermsSIR()
    device = SimulatorDevice(
        env,
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="school", delay_s=0.01, seed=3, publish_oracle=False),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), 60)
    service = AgentService(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    try:
        await asyncio.wait_for(service.run(), 300)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task

    exp = service.experiments["school"]
    assert exp.finished and len(exp.model.history) == rounds
    net = exp.model
    assert net.time_width == 3 and net.gp.dims.tolist() == [5 + 3] * 5
    rows, _ = net.gp.member_data(net.member["sick_days_0_19"])
    cos, sin = (2.0 * rows[:, 6] - 1.0).tolist(), (2.0 * rows[:, 7] - 1.0).tolist()
    phases = [2 * math.pi * t / period for t in range(rounds)]
    assert cos == pytest.approx([math.cos(p) for p in phases], abs=1e-9)
    assert sin == pytest.approx([math.sin(p) for p in phases], abs=1e-9)
    for record in net.history:
        assert bool(env.feasible(list(record.intervention.values())))


class _RecordingDevice(SimulatorDevice):
    """The simulator device, keeping every oracle message it publishes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.oracles: list[Oracle] = []

    async def _publish(self, kind: str, message: Any, *args: Any, **kwargs: Any) -> None:
        if kind == "oracle":
            self.oracles.append(message)
        await super()._publish(kind, message, *args, **kwargs)


@pytest.mark.integration
@pytest.mark.parametrize("optimum", ["per_round", "fixed"])
async def test_the_service_reports_the_dynamic_regret_of_a_drifting_system(
    mosquitto, tmp_path, optimum
):
    """sir-seasonal, whose optimum changes with every week: declared to drift (the example's
    `reward.optimum: per_round`), the agent's cumulative regret is Σ_t (f*_t − E[y_t | a_t])
    over the oracle messages the device sent, and its simple regret min_t of the same; declared
    stationary (`fixed`), it still accepts round 0's optimum only and refuses every changed one
    (`oracle_optimum_changed`)."""
    rounds = 5
    spec = load_spec(EXAMPLES / "sir-seasonal.yaml")
    assert spec.reward.optimum == "per_round"
    spec = spec.model_validate(
        {
            **spec.model_dump(),
            "name": "seasonal",
            "reward": {**spec.reward.model_dump(), "optimum": optimum},
            "policy": {"name": "dgpucb", "settings": FAST["dgpucb"]},
            "initial_design": {"rounds": 2},
            "schedule": {
                **spec.schedule.model_dump(),
                "max_rounds": rounds,
                "ack_timeout_s": 5.0,
                "round_timeout_s": 5.0,
            },
        }
    )
    device = _RecordingDevice(
        SeasonalSIR(),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="seasonal", delay_s=0.01, seed=3),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), 60)
    service = AgentService(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    try:
        await asyncio.wait_for(service.run(), 300)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task

    exp = service.experiments["seasonal"]
    assert exp.finished and len(exp.model.history) == rounds
    sent = {o.round: o for o in device.oracles}
    assert sorted(sent) == list(range(rounds))
    optima = [sent[t].optimum for t in range(rounds)]
    assert all(abs(b - a) > 2e-3 for a, b in itertools.pairwise(optima)), optima  # it drifts
    sample = exp.metrics.registry.get_sample_value
    labels = {"experiment": "seasonal"}
    if optimum == "per_round":
        regrets = [sent[t].optimum - sent[t].expected_reward for t in range(rounds)]
        assert exp.regret.optima == {t: sent[t].optimum for t in range(rounds)}
        assert exp.regret.cumulative == pytest.approx(sum(regrets), rel=1e-12)
        assert sample("cbo_cumulative_regret", labels) == pytest.approx(sum(regrets), rel=1e-12)
        assert sample("cbo_simple_regret", labels) == pytest.approx(min(regrets), rel=1e-12)
        # restarted over its store, the agent has every round's optimum again
        with Store(tmp_path / "agent.sqlite") as store:
            again = Experiment(spec, store)
            assert [o.optimum for o in store.oracles("seasonal")] == optima
        assert again.regret.optima == exp.regret.optima
        assert again.regret.cumulative == exp.regret.cumulative
        return
    assert exp.regret.expected == {0: sent[0].expected_reward}
    refused = {
        "experiment": "seasonal",
        "kind": "oracle",
        "outcome": "rejected",
        "reason": "oracle_optimum_changed",
    }
    assert sample("cbo_messages_total", refused) == rounds - 1
    assert sample("cbo_cumulative_regret", labels) == pytest.approx(
        sent[0].optimum - sent[0].expected_reward
    )
