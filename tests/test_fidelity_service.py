"""A short BESD run through the service: embedded broker, the GW10 device, the agent."""

from __future__ import annotations

import asyncio

import pytest
from rich.console import Console

from agent.demo import DemoOptions, run_demo
from connectors.store import Store


@pytest.mark.slow
@pytest.mark.integration
def test_besd_runs_gw10_through_the_service_on_the_embedded_broker(tmp_path):
    rounds = 33  # 30 rounds of design (10 θ at each τ), then the knowledge gradient
    options = DemoOptions(
        env="gw10", policy="besd", rounds=rounds, live=False, out=tmp_path, metrics_port=0
    )
    result = asyncio.run(run_demo(options, Console(width=120, record=True)))
    assert result.rounds == rounds
    with Store(tmp_path / "demo.sqlite") as store:
        (name,) = store.experiment_names()
        stored = store.rounds(name)
        assert {r.status for r in stored} == {"closed"}
        readings = store.readings(name)
        assert len(readings) == rounds
        assert all(
            r.replications == int(s.intervention["reps"])
            for r, s in zip(readings, stored, strict=True)
        )
        assert all(r.variance is not None and r.variance >= 0 for r in readings)
        costs = [r.intervention["reps"] * r.intervention["tau"] for r in stored]
        assert [r.cost for r in stored] == costs
        assert {r.intervention["tau"] for r in stored[:30]} == {200.0, 600.0, 1000.0}
        totals = store.ledger(name)
        assert totals.settled == pytest.approx(sum(costs))
