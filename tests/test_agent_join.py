"""The feedback join under reordering, duplicates, drops and late readings (property tests).

Whatever order readings arrive in, however they are batched, duplicated, dropped or delayed
past their round's close: every distinct reading is stored once, each complete node row teaches
the model exactly once, and the model ends up with the same posterior as one that learned the
same rows in order.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.experiment import Experiment, RoundStatus
from connectors.schemas import Ack, Oracle, Reading
from connectors.store import Store
from core.network import NetworkModel
from core.spec import parse_spec


def chain_spec(intervention: str = "soft"):
    data = {
        "name": "join",
        "intervention": intervention,
        "nodes": [
            {"name": "A", "bounds": [0, 1], "noise_std": 0.1},
            {"name": "B", "parents": ["A"], "bounds": [-2, 2], "noise_std": 0.1},
            {"name": "C", "parents": ["B"], "bounds": [-4, 4], "noise_std": 0.1},
        ],
        "actions": [{"name": "u", "targets": ["B"], "bounds": [-1, 1]}],
        "reward": {"node": "C"},
        "model": {"refit_every": None, "misfit_z": None},
        "policy": {"name": "random"},
        "schedule": {"pipeline": 64, "round_timeout_s": 5.0},
    }
    if intervention == "hard":
        data["target_sets"] = [[], ["u"]]
    return parse_spec(data)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def world(rounds: int, seed: int, intervention: str = "soft"):
    """An experiment with `rounds` proposed and published rounds and their true readings."""
    gen = torch.Generator().manual_seed(seed)
    clock = Clock()
    store = Store(":memory:")
    exp = Experiment(chain_spec(intervention), store, seed=seed, clock=clock)
    truth: dict[tuple[int, str], float] = {}
    for _ in range(rounds):
        live = exp.propose()
        exp.mark_published(live.number)
        u = live.intervention.get("u", 0.0)
        a = float(torch.rand(1, generator=gen))
        b = u if intervention == "hard" and "u" in live.intervention else a + u
        truth |= {(live.number, "A"): a, (live.number, "B"): b, (live.number, "C"): 2 * b}
    return exp, store, clock, truth


def reading(exp: Experiment, round_: int, node: str, value: float, seq: int) -> Reading:
    return Reading(
        experiment=exp.name, round=round_, node=node, value=value, seq=seq, device_id="dev", at=0.0
    )


def ack(exp: Experiment, round_: int) -> Ack:
    live = exp.rounds[round_]
    return Ack(
        experiment=exp.name,
        round=round_,
        action_id=live.action.action_id,
        device_id="dev",
        status="applied",
        reason=None,
        applied=live.intervention,
        at=0.0,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_join_is_order_and_duplicate_insensitive(data):
    rounds = data.draw(st.integers(1, 6), label="rounds")
    intervention = data.draw(st.sampled_from(["soft", "hard"]), label="intervention")
    exp, store, clock, truth = world(rounds, data.draw(st.integers(0, 1000)), intervention)
    seqs = {key: i for i, key in enumerate(sorted(truth))}
    dropped = set(data.draw(st.sets(st.sampled_from(sorted(truth)), max_size=len(truth) // 2)))
    delivered = set(truth) - dropped
    copies = {key: data.draw(st.integers(1, 3)) for key in delivered}
    messages = [key for key in sorted(delivered) for _ in range(copies[key])]
    messages = data.draw(st.permutations(messages), label="order")
    acks_at = {r: data.draw(st.integers(0, len(messages))) for r in range(rounds)}
    cut = sorted(data.draw(st.sets(st.integers(1, max(len(messages), 1)), max_size=5)))
    batches = [messages[i:j] for i, j in itertools.pairwise([0, *cut, len(messages)]) if i < j]

    outcomes, sent = [], 0
    for batch in batches:
        for r in [r for r, when in acks_at.items() if when <= sent]:
            exp.on_ack(ack(exp, r))
            acks_at[r] = 10**9
        verdicts = exp.on_readings(
            [reading(exp, r, node, truth[(r, node)], seqs[(r, node)]) for r, node in batch]
        )
        outcomes += [v.outcome for v in verdicts]
        sent += len(batch)
        clock.now += 10.0  # past round_timeout_s: acked rounds close, later readings are late
        exp.due(clock.now)
    for r, when in acks_at.items():
        if when < 10**9:
            exp.on_ack(ack(exp, r))
    clock.now += 100.0
    exp.due(clock.now)  # every round closes: none is in flight (pending) any more
    assert exp.model.gp.num_pending == 0

    distinct = len(delivered)
    assert outcomes.count("accepted") + outcomes.count("late") == distinct
    assert outcomes.count("duplicate") == len(messages) - distinct
    assert "rejected" not in outcomes
    assert len(store.readings(exp.name)) == distinct

    reference = NetworkModel(exp.spec)
    for r in range(rounds):
        values = {node: truth[(r, node)] for node in "ABC" if (r, node) in delivered}
        reference.learn(exp.rounds[r].intervention, values)
    assert exp.model.gp.num_observations.tolist() == reference.gp.num_observations.tolist()
    exp.model.gp.restandardize()  # standardization is frozen at order-dependent times
    reference.gp.restandardize()
    generator = torch.Generator().manual_seed(0)
    probe = torch.rand(3, 5, exp.model.input_dim, dtype=torch.float64, generator=generator)
    ours, theirs = exp.model.gp.posterior(probe), reference.gp.posterior(probe)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=1e-8, atol=1e-8)


def test_round_closes_when_complete_and_on_timeout():
    exp, _, clock, truth = world(2, seed=1)
    exp.on_ack(ack(exp, 0))
    exp.on_ack(ack(exp, 1))
    exp.on_readings([reading(exp, 0, n, truth[(0, n)], i) for i, n in enumerate("ABC")])
    assert exp.rounds[0].status is RoundStatus.CLOSED
    exp.on_readings([reading(exp, 1, "A", truth[(1, "A")], 10)])
    assert exp.rounds[1].status is RoundStatus.ACKED
    clock.now += exp.spec.schedule.round_timeout_s + 1
    exp.due(clock.now)
    assert exp.rounds[1].status is RoundStatus.CLOSED
    (late,) = exp.on_readings([reading(exp, 1, "B", truth[(1, "B")], 11)])
    assert late.outcome == "late"
    assert exp.model.gp.num_observations.tolist() == [2, 2, 1]


def test_a_batch_is_stored_by_one_insert_and_a_repeated_seq_falls_back_reading_by_reading(
    monkeypatch,
):
    """The ingest path's store cost does not grow with the batch: its new readings go in one
    `add_readings`. A device repeating a stored sequence number for another round (a
    duplicate only the store sees) undoes that insert, and the batch is stored reading by
    reading: the repeat is a duplicate, every other reading is stored and taught."""
    exp, store, _, truth = world(5, seed=4)
    for r in range(5):
        exp.on_ack(ack(exp, r))
    calls = {"add_readings": 0, "add_reading": 0}
    for name in calls:
        method = getattr(store, name)

        def spy(*args, _method=method, _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(store, name, spy)
    seqs = {key: i for i, key in enumerate(sorted(truth))}
    verdicts = exp.on_readings(
        [reading(exp, r, n, truth[(r, n)], seqs[(r, n)]) for r in range(3) for n in "ABC"]
    )
    assert [v.outcome for v in verdicts] == ["accepted"] * 9
    assert calls == {"add_readings": 1, "add_reading": 0}
    assert [exp.rounds[r].status for r in range(3)] == [RoundStatus.CLOSED] * 3

    repeat = reading(exp, 3, "A", truth[(3, "A")], seqs[(0, "A")])  # round 0's A's seq
    batch = [repeat] + [
        reading(exp, r, n, truth[(r, n)], seqs[(r, n)]) for r in (3, 4) for n in "BC"
    ]
    batch.append(reading(exp, 3, "A", truth[(3, "A")], 999))  # the same value, a new seq
    verdicts = exp.on_readings(batch)
    assert [v.outcome for v in verdicts] == ["duplicate"] + ["accepted"] * 5
    assert calls == {"add_readings": 2, "add_reading": 6}
    assert len(store.readings(exp.name)) == 9 + 5
    assert exp.rounds[3].status is RoundStatus.CLOSED
    assert exp.model.gp.num_observations.tolist() == [4, 4, 5]  # round 4 has no A: B waits


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (lambda e: reading(e, 7, "A", 0.0, 1), "unknown_round"),
        (lambda e: reading(e, 0, "Z", 0.0, 1), "unknown_node"),
    ],
)
def test_readings_that_do_not_fit_are_rejected_with_a_reason(message, reason):
    exp, *_ = world(1, seed=2)
    (verdict,) = exp.on_readings([message(exp)])
    assert (verdict.outcome, verdict.reason) == ("rejected", reason)


def test_ack_rejected_releases_the_budget_and_busy_retries():
    exp, store, clock, _ = world(2, seed=3)
    busy = ack(exp, 0).model_copy(update={"status": "rejected", "reason": "busy"})
    exp.on_ack(busy)
    assert exp.rounds[0].status is RoundStatus.PUBLISHED
    clock.now += 2.0
    (again,) = exp.due(clock.now)
    assert again.action_id == exp.rounds[0].action.action_id and again.attempt == 2
    refused = ack(exp, 1).model_copy(update={"status": "rejected", "reason": "out of range"})
    exp.on_ack(refused)
    assert exp.rounds[1].status is RoundStatus.REJECTED
    assert store.ledger(exp.name).released == pytest.approx(exp.rounds[1].cost)


def test_oracle_gives_true_regret_once():
    exp, *_ = world(2, seed=4)
    for r, expected in ((0, 1.0), (1, 1.5)):
        live = exp.rounds[r]
        message = Oracle(
            experiment=exp.name,
            round=r,
            action_id=live.action.action_id,
            expected_reward=expected,
            optimum=2.0,
            device_id="dev",
            at=0.0,
        )
        assert exp.on_oracle(message).outcome == "accepted"
        assert exp.on_oracle(message).outcome == "duplicate"
    assert exp.regret.cumulative == pytest.approx(1.5)
    assert exp.regret.simple == pytest.approx(0.5)


def test_pipelined_rounds_enter_the_model_as_pending_points():
    exp, _, _, truth = world(3, seed=5)  # chain_spec pipelines 64 rounds
    assert exp.model.gp.num_pending == 3
    exp.on_ack(ack(exp, 0))
    exp.on_readings([reading(exp, 0, n, truth[(0, n)], i) for i, n in enumerate("ABC")])
    assert exp.model.gp.num_pending == 2  # round 0's pending point gave way to its readings
    assert exp.model.gp.num_observations.tolist() == [1, 1, 1]


def test_pending_points_shrink_the_variance_where_a_round_is_in_flight():
    spec = chain_spec()
    store = Store(":memory:")
    exp = Experiment(spec, store, seed=3)
    for u in (-0.8, 0.0, 0.8):
        exp.model.learn({"u": u}, {"A": 0.5, "B": 0.5 + u, "C": 1 + 2 * u})
    point = torch.tensor([[0.5, 0.4]], dtype=torch.float64)  # B's input: (A, u)
    before = exp.model.node_posterior("B", point)[1]
    handle = exp.model.add_pending({"u": 0.4})
    after = exp.model.node_posterior("B", point)[1]
    assert float(after) < 0.6 * float(before)  # one noisy pending observation there
    exp.model.drop_pending(handle)
    torch.testing.assert_close(exp.model.node_posterior("B", point)[1], before)


def test_experiment_stops_when_the_budget_pays_for_no_action():
    spec = chain_spec()
    spec = spec.model_copy(
        update={
            "constraints": spec.constraints.model_copy(update={"budget_total": 3.0}),
            "schedule": spec.schedule.model_copy(update={"pipeline": 1}),
        }
    )
    exp = Experiment(spec, Store(":memory:"), seed=7)
    proposed = 0
    while exp.can_propose(0.0):
        live = exp.propose()
        exp.mark_published(live.number)
        exp.on_ack(ack(exp, live.number))
        exp.close_round(live, 0.0, "test")
        proposed += 1
    assert exp.budget_spent() <= 3.0
    assert exp.finished_reason.startswith("budget spent")
    assert proposed >= 3  # random draws of u are nonzero: each paid round costs 1
