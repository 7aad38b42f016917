"""A restarted agent continues the same experiment: same rounds, same budget, same model — from
an SQLite or a PostgreSQL store; and a replica whose lease was taken is fenced off."""

from __future__ import annotations

import pytest
import torch

from agent.experiment import Experiment, RoundStatus
from connectors.store import FencedError, Store
from core.spec import ChangeSpec
from tests.test_agent_join import ack, chain_spec, reading


def spec_with(**model):
    spec = chain_spec()
    return spec.model_copy(
        update={
            "model": spec.model.model_copy(update={"refit_every": 4, "misfit_z": 3.0, **model}),
            "constraints": spec.constraints.model_copy(update={"budget_total": 50.0}),
        }
    )


def drive(exp: Experiment, rounds: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    seq = 1000 * seed
    for _ in range(rounds):
        live = exp.propose()
        exp.mark_published(live.number)
        exp.on_ack(ack(exp, live.number))
        a = float(torch.rand(1, generator=gen))
        b = a + live.intervention["u"] + 0.1 * float(torch.randn(1, generator=gen))
        values = {"A": a, "B": b, "C": 2 * b * b}
        exp.on_readings(
            [reading(exp, live.number, n, v, seq + i) for i, (n, v) in enumerate(values.items())]
        )
        seq += 3


def test_restart_rebuilds_rounds_budget_and_the_exact_posterior(store_target):
    path = store_target
    with Store(path) as store:
        before = Experiment(spec_with(), store, seed=1)
        drive(before, 14, seed=1)
        live = before.propose()  # a round proposed but never published (crash)
        probe = torch.rand(
            3,
            4,
            before.model.input_dim,
            dtype=torch.float64,
            generator=torch.Generator().manual_seed(5),
        )
        expected = before.model.gp.posterior(probe)
        spent = before.budget_spent()
    with Store(path) as store:
        after = Experiment(spec_with(), store, seed=1)
        assert sorted(after.rounds) == sorted(before.rounds)
        assert after.next_round == live.number + 1
        assert after.rounds[live.number].status is RoundStatus.PROPOSED
        assert after.rounds[live.number].action.action_id == live.action.action_id
        assert after.budget_spent() == pytest.approx(spent)
        assert after.model.gp.num_observations.tolist() == before.model.gp.num_observations.tolist()
        got = after.model.gp.posterior(probe)
        torch.testing.assert_close(got.mean, expected.mean, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(got.variance, expected.variance, rtol=1e-9, atol=1e-9)
        drive(after, 2, seed=2)  # and it goes on from there
        assert after.next_round == live.number + 3


def test_a_changed_graph_is_refused(store_target):
    path = store_target
    with Store(path) as store:
        drive(Experiment(spec_with(), store), 2, seed=3)
    with Store(path) as store, pytest.raises(ValueError, match="different \\['model'\\]"):
        Experiment(spec_with(kernel="rbf"), store)


def test_a_spec_stored_before_reward_optimum_continues_as_fixed(store_target):
    """A store written before `reward.optimum` existed meant one optimum: the same spec goes on
    (the field's default, `fixed`), and declaring the system to drift changes the reward."""
    path = store_target
    with Store(path) as store:
        drive(Experiment(spec_with(), store), 2, seed=3)
        older = spec_with().model_dump(mode="json", by_alias=True)
        del older["reward"]["optimum"]
        store.upsert_experiment(older["name"], older)
    with Store(path) as store:
        assert Experiment(spec_with(), store).next_round == 2
    drifting = spec_with()
    drifting = drifting.model_copy(
        update={"reward": drifting.reward.model_copy(update={"optimum": "per_round"})}
    )
    with Store(path) as store, pytest.raises(ValueError, match="different \\['reward'\\]"):
        Experiment(drifting, store)


def test_recovery_replays_what_a_clamping_device_applied(store_target):
    """The device clamps u to [-0.3, 0.3] and says so in its ack; readings follow what it
    applied. Restarted, the agent's model is the uninterrupted one — and both learned the
    applied values, not the proposed ones."""
    path = store_target
    gen = torch.Generator().manual_seed(4)
    spec = spec_with(refit_every=None, misfit_z=None)  # fixed hyperparameters: a quick test
    rows = []
    with Store(path) as store:
        before = Experiment(spec, store, seed=4)
        for number in range(10):
            live = before.propose()
            before.mark_published(number)
            applied = {"u": max(-0.3, min(0.3, live.intervention["u"]))}
            before.on_ack(ack(before, number).model_copy(update={"applied": applied}))
            a = float(torch.rand(1, generator=gen))
            values = {"A": a, "B": a + applied["u"], "C": 2 * (a + applied["u"])}
            before.on_readings(
                [
                    reading(before, number, n, values[n], 10 * number + i)
                    for i, n in enumerate("ABC")
                ]
            )
            rows.append(applied)
        history = before.model.history
        clamped = sum(
            history[r.model_round].intervention != r.intervention for r in before.rounds.values()
        )
        assert clamped >= 3  # the test means something: several proposals were clamped
        assert store.get_round("join", 0).applied in (None, rows[0])
        probe = torch.rand(3, 6, before.model.input_dim, dtype=torch.float64, generator=gen)
        expected = before.model.gp.posterior(probe)
    with Store(path) as store:
        after = Experiment(spec, store, seed=4)
        for number, applied in enumerate(rows):
            assert after.model.history[after.rounds[number].model_round].intervention == applied
        got = after.model.gp.posterior(probe)
        torch.testing.assert_close(got.mean, expected.mean, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(got.variance, expected.variance, rtol=1e-9, atol=1e-9)


def test_an_experiment_on_a_fenced_store_stops_writing_once_its_lease_is_taken(store_target):
    """`Store.fenced` is a drop-in store: the experiment passes its epoch nowhere else."""
    spec = spec_with()
    with Store(store_target) as store:
        store.submit("join", spec.model_dump(mode="json", by_alias=True))
        first = store.acquire_lease("join", "replica-a", 30.0)
        assert first is not None
        old = Experiment(spec, store.fenced("join", first.epoch), seed=1)
        drive(old, 3, seed=1)
        taken = store.acquire_lease("join", "replica-a", 30.0)  # replica-a restarted
        assert taken is not None and taken.epoch == first.epoch + 1
        with pytest.raises(FencedError, match="lease epoch 1 is stale"):
            drive(old, 1, seed=2)  # the old process proposes: its round is refused
        new = Experiment(spec, store.fenced("join", taken.epoch), seed=1)
        assert sorted(new.rounds) == [0, 1, 2] and new.next_round == 3
        assert [r.round for r in store.rounds("join")] == [0, 1, 2]
        drive(new, 1, seed=2)  # the new owner goes on
        assert store.experiment_status("join").rounds == 4


def test_restart_rebuilds_the_bounded_state(store_target):
    """Past its capacity a node keeps a budget chosen with the hyperparameters of the moment: a
    restart starts from the snapshot's kept rows and replays the rest, to the same state."""
    path = store_target
    model = {"capacity": 8, "budget": 6}
    with Store(path) as store:
        before = Experiment(spec_with(**model), store, seed=1)
        drive(before, 16, seed=1)
        assert all(before.model.gp.switched)
        probe = torch.rand(3, 4, before.model.input_dim, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(5))  # fmt: skip
        expected = before.model.gp.posterior(probe)
        kept = [before.model.gp.member_data(j) for j in range(3)]
    with Store(path) as store:
        after = Experiment(spec_with(**model), store, seed=1)
        assert after.model.gp.num_observations.tolist() == [6, 6, 6]
        assert after.model.gp.seen == before.model.gp.seen
        for j, (z, y) in enumerate(kept):
            z_after, y_after = after.model.gp.member_data(j)
            torch.testing.assert_close(z_after, z, rtol=0, atol=0)
            torch.testing.assert_close(y_after, y, rtol=0, atol=0)
        got = after.model.gp.posterior(probe)
        torch.testing.assert_close(got.mean, expected.mean, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(got.variance, expected.variance, rtol=1e-9, atol=1e-9)


def drive_step(exp: Experiment, rounds: int, gen: torch.Generator, seq: int, step_at: int) -> int:
    """`rounds` rounds whose device applies its own u (what the model learns does not depend
    on the policy's draws, which a restart does not continue); B's mechanism shifts by 3.0
    (30 noise std) from round `step_at` on. Returns the next reading seq."""
    for _ in range(rounds):
        live = exp.propose()
        exp.mark_published(live.number)
        u = 2 * float(torch.rand(1, generator=gen)) - 1
        exp.on_ack(ack(exp, live.number).model_copy(update={"applied": {"u": u}}))
        a = float(torch.rand(1, generator=gen))
        b = a + u + 0.1 * float(torch.randn(1, generator=gen))
        b += 3.0 if live.number >= step_at else 0.0
        values = {"A": a, "B": b, "C": 0.5 * b * b}
        exp.on_readings(
            [reading(exp, live.number, n, v, seq + i) for i, (n, v) in enumerate(values.items())]
        )
        seq += 3
    return seq


def change_test(exp: Experiment) -> dict[str, list]:
    state = exp.model.gp.state()
    return {k: state[k].tolist() for k in state if k.startswith("change_")}


def test_restart_mid_change_keeps_the_change_test(store_target):
    """A node's CUSUM (`model.change`) is in the snapshot: an agent restarted two readings after
    a step of B's mechanism (its statistic > 0) has the statistic, rows and counts the agent
    had, and raises the alarm at the same round as an agent that never stopped. (Restarted
    without it, the test starts again after its warmup and misses that round.)"""
    model = {"refit_every": 5, "misfit_z": None, "change": ChangeSpec(warmup=10, keep=4)}
    spec = spec_with(**model)
    b = spec_with(**model).nodes[1].name
    with Store(":memory:") as store:  # never stopped
        steady = Experiment(spec, store, seed=1)
        gen, seq, alarms = torch.Generator().manual_seed(3), 0, []
        for _ in range(34):
            seq = drive_step(steady, 1, gen, seq, step_at=24)
            if steady.next_round == 27:
                expected = change_test(steady)
            alarms.append(change_test(steady)["change_alarms"][steady.model.order.index(b)])
    alarm_round = alarms.index(1)
    assert 27 <= alarm_round <= 28 and alarms[-1] == 1
    # refits run inside the readings' transaction here (the service runs them beside its loop):
    # on a loaded machine one can outlast PostgreSQL's idle-in-transaction limit (timeout_s / 2)
    with Store(store_target, timeout_s=120.0) as store:
        before = Experiment(spec, store, seed=1)
        gen = torch.Generator().manual_seed(3)
        seq = drive_step(before, 27, gen, 0, step_at=24)
        test = change_test(before)
        assert test == expected and test["change_statistic"][1] > 0
        kept = [before.model.gp.member_data(j) for j in range(3)]
        seen = before.model.gp.seen
    with Store(store_target, timeout_s=120.0) as store:
        after = Experiment(spec, store, seed=1)
        got = change_test(after)
        for name, values in expected.items():
            assert got[name] == pytest.approx(values, rel=1e-9, abs=1e-12), name
        assert after.model.gp.seen == seen
        for j, (z, y) in enumerate(kept):
            for got_, want in zip(after.model.gp.member_data(j), (z, y), strict=True):
                torch.testing.assert_close(got_, want, rtol=0, atol=0)
        found = None
        while after.next_round < 34 and found is None:
            seq = drive_step(after, 1, gen, seq, step_at=24)
            if change_test(after)["change_alarms"][1] == 1:
                found = after.next_round - 1
        assert found == alarm_round
