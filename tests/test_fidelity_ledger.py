"""The ledger of multi-fidelity trials, on SQLite and PostgreSQL: a round reserves q·τ, and a
report of q' < q replications settles q'·τ and releases the rest."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.store import IllegalTransition, Store
from core.spec import parse_spec
from policies.base import intervention_cost
from tests.test_fidelity_policies import fidelity_spec

EXP = "trials"


@pytest.fixture
def store(store_target: str) -> Iterator[Store]:
    with Store(store_target) as opened:
        opened.upsert_experiment(EXP, {"name": EXP})
        yield opened


def test_a_round_costs_q_tau_and_a_partial_report_settles_what_it_used(store: Store) -> None:
    spec = parse_spec(fidelity_spec())
    intervention = {"x": 0.5, "tau": 10.0, "reps": 4.0}
    cost = intervention_cost(spec, intervention)
    assert cost == 40.0  # q · τ
    assert store.add_round(EXP, 0, "a0", intervention, ["x", "tau", "reps"], cost, "soft", 1.0)
    assert store.reserve(EXP, 0, cost, 100.0, 1.0)
    assert store.settle(EXP, 0, 2.0)  # the ack
    assert store.add_reading(EXP, 0, "y", 0.3, 0, "dev", 3.0, variance=0.01, replications=3)
    assert store.settle_used(EXP, 0, spec.fidelity.cost(10.0, 3), 3.0)
    totals = store.ledger(EXP)
    assert (totals.reserved, totals.settled, totals.released) == (0.0, 30.0, 10.0)
    assert totals.spent == 30.0
    assert not store.settle_used(EXP, 0, 30.0, 4.0)  # a redelivery changes nothing
    row = store.readings(EXP)[0]
    assert (row.variance, row.replications) == (0.01, 3)
    # what was released is free again: 30 + 70 fits a budget of 100
    assert store.add_round(EXP, 1, "a1", intervention, ["x"], 70.0, "soft", 5.0)
    assert store.reserve(EXP, 1, 70.0, 100.0, 5.0)


def test_a_partial_report_before_the_ack_and_more_than_reserved(store: Store) -> None:
    assert store.add_round(EXP, 0, "a0", {"tau": 5.0, "reps": 2.0}, [], 10.0, "soft", 1.0)
    assert store.reserve(EXP, 0, 10.0, None, 1.0)
    with pytest.raises(IllegalTransition):
        store.settle_used(EXP, 0, 11.0, 2.0)
    assert store.settle_used(EXP, 0, 5.0, 2.0)
    assert not store.settle(EXP, 0, 3.0)  # the late ack finds it settled
    totals = store.ledger(EXP)
    assert (totals.settled, totals.released) == (5.0, 5.0)
