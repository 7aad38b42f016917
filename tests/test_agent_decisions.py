"""What the agent reports about its decisions, and which seed it decides with.

`cbo_decision_seconds` is the decision latency of the design: from the last reading that
completed the previous round (or the timeout that closed it) to the next action published.
`cbo_policy_seconds` is the policy's compute time alone. The policy's random numbers come from
the spec's `initial_design.seed`.
"""

from __future__ import annotations

import pytest

from agent.config import AgentConfig
from agent.experiment import Experiment, RoundStatus
from agent.runtime import AgentService
from connectors.metrics import AgentMetrics
from connectors.store import Store
from tests.test_agent_join import Clock, ack, chain_spec, reading


def one_at_a_time(seed: int = 0):
    spec = chain_spec()
    return spec.model_copy(
        update={
            "schedule": spec.schedule.model_copy(update={"pipeline": 1}),
            "initial_design": spec.initial_design.model_copy(update={"seed": seed}),
        }
    )


def sample(metrics: AgentMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name, {"experiment": "join"}) or 0.0


def test_decision_latency_runs_from_the_closing_reading_or_timeout_to_the_next_action():
    clock, metrics = Clock(), AgentMetrics()
    with Store(":memory:") as store:
        exp = Experiment(one_at_a_time(), store, clock=clock, metrics=metrics)
        first = exp.propose()
        exp.mark_published(first.number)  # nothing closed before it: no latency
        assert sample(metrics, "cbo_decision_seconds_count") == 0
        exp.on_ack(ack(exp, first.number))
        clock.now += 4.0
        exp.on_readings([reading(exp, 0, n, 0.5, i) for i, n in enumerate("ABC")])  # closes it
        assert first.status is RoundStatus.CLOSED
        clock.now += 3.0  # the policy thinks (and the runtime publishes) for 3 s
        second = exp.propose()
        exp.mark_published(second.number)
        assert sample(metrics, "cbo_decision_seconds_sum") == pytest.approx(3.0)
        exp.republish(second.number)  # a re-publication is no new decision
        exp.mark_published(second.number)
        assert sample(metrics, "cbo_decision_seconds_count") == 1

        exp.on_ack(ack(exp, second.number))
        clock.now += exp.spec.schedule.round_timeout_s
        exp.due(clock.now)  # closed by its timeout, without a reading
        assert second.status is RoundStatus.CLOSED
        clock.now += 0.5
        exp.mark_published(exp.propose().number)
        assert sample(metrics, "cbo_decision_seconds_count") == 2
        assert sample(metrics, "cbo_decision_seconds_sum") == pytest.approx(3.5)
        # the policy's own time is apart: three proposals, each well under a second here
        assert sample(metrics, "cbo_policy_seconds_count") == 3
        assert sample(metrics, "cbo_policy_seconds_sum") < 3.0


def test_the_service_seeds_each_experiment_with_its_specs_seed():
    specs = [one_at_a_time(seed=7), one_at_a_time(seed=11).model_copy(update={"name": "other"})]
    service = AgentService(AgentConfig(), specs)
    with Store(":memory:") as store:
        service._load(store)
        assert service.experiments["join"].rng.initial_seed() == 7
        assert service.experiments["other"].rng.initial_seed() == 11
        assert Experiment(specs[0], store).rng.initial_seed() == 7  # the default, too
        assert Experiment(specs[0], store, seed=3).rng.initial_seed() == 3  # unless told


def test_the_same_seed_makes_the_same_initial_design_and_another_seed_another():
    def first_interventions(seed: int) -> list[dict[str, float]]:
        with Store(":memory:") as store:
            exp = Experiment(one_at_a_time(seed), store)
            out = []
            for number in range(3):
                live = exp.propose()
                exp.mark_published(number)
                exp.on_ack(ack(exp, number))
                exp.close_round(live, 0.0, "test")
                out.append(live.intervention)
            return out

    assert first_interventions(5) == first_interventions(5) != first_interventions(6)


def test_model_drift_rises_when_readings_stop_fitting():
    """`cbo_model_drift{node}`: a chain learned on B = A + u, then B jumps by 50 (its noise is
    0.1): every update of B is a misfit, while A, whose readings stay put, is never one."""
    clock, metrics = Clock(), AgentMetrics()
    with Store(":memory:") as store:
        exp = Experiment(one_at_a_time(), store, clock=clock, metrics=metrics)
        seq = 0
        for k in range(16):
            live = exp.propose()
            exp.mark_published(live.number)
            exp.on_ack(ack(exp, live.number))
            a = 0.05 * (k % 7)
            b = a + live.intervention["u"] + (50.0 if k >= 12 else 0.0)
            values = {"A": a, "B": b, "C": 2 * b}
            exp.on_readings(
                [
                    reading(exp, live.number, n, v, seq + i)
                    for i, (n, v) in enumerate(values.items())
                ]
            )
            seq += 3
        drift = {
            node: metrics.registry.get_sample_value(
                "cbo_model_drift", {"experiment": "join", "node": node}
            )
            for node in ("A", "B")
        }
        assert drift["A"] == 0.0
        assert drift["B"] > 0.1  # four misfits of sixteen updates, the last four
