"""The budget against a policy's bugs and a device's disobedience.

- What the agent publishes is checked against the constraints at the cost the agent recomputes
  for exactly that (clamped) intervention: a policy that under-reports a cost or uses too many
  actions is refused, and the explorer proposes instead.
- An action expires (`expires_at`) when the agent gives up on it and releases its budget; should
  a device apply it anyway, the ack or the readings say so, and the cost is charged again —
  past the budget if need be — counted as a device overspend, and the agent stops proposing.

The ledger's side of it runs on both store backends (`store_target`).
"""

from __future__ import annotations

import math

import pytest
from structlog.testing import capture_logs

from agent import recovery
from agent.experiment import Experiment, RoundStatus
from connectors.metrics import AgentMetrics
from connectors.schemas import Ack
from connectors.store import Store
from core.spec import parse_spec
from policies.base import Proposal
from tests.test_agent_join import Clock, ack, reading


class Scripted:
    """A policy object that proposes what it is told, with the cost it is told (maybe wrong)."""

    def __init__(self, name: str, intervention: dict[str, float], cost: float) -> None:
        self.name = name
        self.intervention = intervention
        self.cost = cost
        self.calls = 0

    def propose(self, model, constraints, rng) -> Proposal:
        self.calls += 1
        used = tuple(k for k, v in self.intervention.items() if v != 0.0)
        return Proposal(dict(self.intervention), 0.0, self.cost, used, {})


def knobs_spec(**constraints):
    """Soft: `a` may be off (0); `b`'s bounds exclude 0, so it is used whenever it is sent."""
    return parse_spec(
        {
            "name": "knobs",
            "intervention": "soft",
            "nodes": [
                {"name": "A", "bounds": [0, 1], "noise_std": 0.1},
                {"name": "Y", "parents": ["A"], "bounds": [-4, 4], "noise_std": 0.1},
            ],
            "actions": [
                {"name": "a", "targets": ["A"], "bounds": [-1, 1], "cost": 1.0},
                {"name": "b", "targets": ["Y"], "bounds": [0.5, 1], "cost": 2.0},
            ],
            "reward": {"node": "Y"},
            "constraints": {"max_interventions": 1, "budget_total": 20.0, **constraints},
            "model": {"refit_every": None, "misfit_z": None},
            "policy": {"name": "random"},
            "initial_design": {"rounds": 0},  # the (scripted) policy proposes from round 0
        }
    )


def rejected(metrics: AgentMetrics, reason: str) -> float:
    labels = {"experiment": "knobs", "reason": reason}
    return metrics.registry.get_sample_value("cbo_proposals_rejected_total", labels) or 0.0


# ------------------------------------------------------------------ constraints, defense in depth
def test_a_policy_that_breaks_the_cardinality_after_clamping_is_replaced_by_the_explorer():
    metrics = AgentMetrics()
    with Store(":memory:") as store:
        exp = Experiment(knobs_spec(), store, metrics=metrics)
        # the bug: b "off" as 0.0, outside its bounds; clamped to 0.5 it is used and costs 2
        exp.policy = Scripted("buggy", {"a": 0.7, "b": 0.0}, cost=1.0)
        exp.explorer = Scripted("explorer", {"a": 0.0, "b": 0.75}, cost=2.0)
        with capture_logs() as events:
            live = exp.propose()
        assert live is not None and live.policy == "explorer"
        assert live.intervention == {"a": 0.0, "b": 0.75}
        assert (live.cost, live.target_set) == (2.0, ("b",))
        (refusal,) = [e for e in events if e["event"] == "proposal.rejected"]
        assert (refusal["policy"], refusal["reason"], refusal["fallback"]) == (
            "buggy",
            "max_interventions",
            "explorer",
        )
        assert rejected(metrics, "max_interventions") == 1
        assert store.ledger("knobs").reserved == 2.0
        assert store.get_round("knobs", 0).cost == 2.0


def test_the_cost_reserved_is_the_agents_own_for_what_it_publishes():
    with Store(":memory:") as store:
        exp = Experiment(knobs_spec(), store)
        exp.policy = exp.explorer = Scripted("cheap-talk", {"a": 0.0, "b": 0.75}, cost=0.25)
        with capture_logs() as events:
            live = exp.propose()
        assert live.cost == 2.0 and store.ledger("knobs").reserved == 2.0
        (corrected,) = [e for e in events if e["event"] == "proposal.cost_corrected"]
        assert (corrected["reported"], corrected["cost"]) == (0.25, 2.0)


@pytest.mark.parametrize(
    ("constraints", "reason"),
    [({"budget_per_round": 1.5}, "budget_per_round"), ({"budget_total": 1.5}, "budget_remaining")],
)
def test_a_proposal_over_a_budget_is_refused_whatever_cost_it_reports(constraints, reason):
    metrics = AgentMetrics()
    with Store(":memory:") as store:
        exp = Experiment(knobs_spec(**constraints), store, metrics=metrics)
        exp.policy = Scripted("buggy", {"a": 0.0, "b": 0.75}, cost=1.0)  # costs 2.0
        exp.explorer = Scripted("explorer", {"a": 0.0, "b": 0.5}, cost=2.0)  # over as well
        with capture_logs() as events:
            assert exp.propose() is None
        assert rejected(metrics, reason) == 2  # the policy's and the explorer's
        assert exp.finished_reason.startswith("no admissible proposal: " + reason)
        assert [e["event"] for e in events].count("proposal.rejected") == 2
        assert store.rounds("knobs") == [] and store.ledger("knobs").spent == 0.0


def test_when_the_explorer_violates_too_nothing_is_published_and_the_experiment_stops():
    metrics = AgentMetrics()
    with Store(":memory:") as store:
        exp = Experiment(knobs_spec(), store, metrics=metrics)
        exp.policy = Scripted("buggy", {"a": 0.7, "b": 0.0}, cost=1.0)
        exp.explorer = Scripted("explorer", {"a": -0.2, "b": 0.0}, cost=1.0)
        assert exp.propose() is None
        assert exp.finished and "max_interventions" in exp.finished_reason
        assert not exp.can_propose(0.0)
        assert store.rounds("knobs") == [] and store.ledger("knobs").spent == 0.0
        assert rejected(metrics, "max_interventions") == 2


def test_a_hard_proposal_outside_the_declared_target_sets_is_refused():
    spec = parse_spec(
        {
            "name": "knobs",
            "intervention": "hard",
            "nodes": [
                {"name": "A", "bounds": [0, 1], "noise_std": 0.1},
                {"name": "B", "parents": ["A"], "bounds": [0, 1], "noise_std": 0.1},
                {"name": "Y", "parents": ["B"], "bounds": [-4, 4], "noise_std": 0.1},
            ],
            "actions": [
                {"name": "a", "targets": ["A"], "bounds": [-1, 1]},
                {"name": "b", "targets": ["B"], "bounds": [-1, 1]},
            ],
            "target_sets": [[], ["a"]],
            "reward": {"node": "Y"},
            "model": {"refit_every": None, "misfit_z": None},
            "policy": {"name": "random"},
            "initial_design": {"rounds": 0},  # the (scripted) policy proposes from round 0
        }
    )
    metrics = AgentMetrics()
    with Store(":memory:") as store:
        exp = Experiment(spec, store, metrics=metrics)
        exp.policy = Scripted("buggy", {"b": 0.5}, cost=1.0)
        exp.explorer = Scripted("explorer", {"a": 0.5}, cost=1.0)
        live = exp.propose()
        assert live.intervention == {"a": 0.5} and rejected(metrics, "target_set") == 1


# ------------------------------------------------------------------ expiry and late application
class Fixed(Scripted):
    def __init__(self) -> None:
        super().__init__("fixed", {"u": 0.5}, cost=2.0)


def paid_spec(budget_total: float = 2.0):
    """One action of cost 2; two ack timeouts of 1 s: an action expires 2 s after it is issued."""
    return parse_spec(
        {
            "name": "paid",
            "intervention": "soft",
            "nodes": [
                {"name": "A", "bounds": [0, 1], "noise_std": 0.1},
                {"name": "Y", "parents": ["A"], "bounds": [-4, 4], "noise_std": 0.1},
            ],
            "actions": [{"name": "u", "targets": ["A"], "bounds": [-1, 1], "cost": 2.0}],
            "reward": {"node": "Y"},
            "constraints": {"budget_total": budget_total},
            "model": {"refit_every": None, "misfit_z": None},
            "policy": {"name": "random"},
            "schedule": {"ack_timeout_s": 1.0, "ack_retries": 1, "round_timeout_s": 5.0},
        }
    )


def paid(store: Store, clock: Clock, metrics: AgentMetrics | None = None, **spec) -> Experiment:
    exp = Experiment(paid_spec(**spec), store, clock=clock, metrics=metrics)
    exp.policy = exp.explorer = Fixed()
    return exp


def expire(exp: Experiment, clock: Clock) -> int:
    """Propose and publish a round, and let it expire unacknowledged; its number."""
    live = exp.propose()
    exp.mark_published(live.number)
    assert live.action.expires_at == clock.now + 2.0  # ack_timeout_s × (ack_retries + 1)
    clock.now += 1.0
    (again,) = exp.due(clock.now)  # the retry: same id, same expiry
    assert (again.attempt, again.expires_at) == (2, live.action.expires_at)
    clock.now += 1.0
    assert exp.due(clock.now) == []
    assert live.status is RoundStatus.EXPIRED
    return live.number


def applied_ack(exp: Experiment, number: int, at: float) -> Ack:
    return ack(exp, number).model_copy(update={"at": at})


def overspends(metrics: AgentMetrics, reason: str) -> float:
    labels = {"experiment": "paid", "reason": reason}
    return metrics.registry.get_sample_value("cbo_device_overspend_total", labels) or 0.0


def test_the_deadline_is_expires_at_and_the_reservation_is_released_then(store_target):
    clock = Clock()
    with Store(store_target) as store:
        exp = paid(store, clock)
        with capture_logs() as events:
            number = expire(exp, clock)
        assert store.get_round("paid", number).expires_at == exp.rounds[number].action.expires_at
        assert store.ledger("paid").spent == 0.0 and exp.can_propose(clock.now)
        (ended,) = [e for e in events if e["event"] == "round.ended"]
        assert (ended["experiment"], ended["round"], ended["status"], ended["why"]) == (
            "paid",
            number,
            "expired",
            "no ack by expires_at",
        )


def test_an_ack_after_expiry_is_charged_and_ends_the_experiment_when_the_budget_is_gone(
    store_target,
):
    clock, metrics = Clock(), AgentMetrics()
    with Store(store_target) as store:
        exp = paid(store, clock, metrics)
        number = expire(exp, clock)
        expires_at = exp.rounds[number].action.expires_at
        # applied in time by the device, its ack late (lost, retried): the money was spent
        with capture_logs() as events:
            verdict = exp.on_ack(applied_ack(exp, number, at=expires_at - 0.5))
        assert verdict.outcome == "late"
        assert exp.on_ack(applied_ack(exp, number, at=expires_at - 0.5)).outcome == "duplicate"
        assert store.ledger("paid").spent == 2.0 and store.ledger("paid").settled == 2.0
        assert not exp.can_propose(clock.now)
        assert exp.finished_reason.startswith("budget spent")
        (event,) = [e for e in events if e["event"] == "budget.device_overspend"]
        assert (event["round"], event["reason"], event["over_budget"], event["budget_spent"]) == (
            number,
            "ack_after_expiry",
            False,
            2.0,
        )
        assert overspends(metrics, "ack_after_expiry") == 1


def test_an_action_applied_after_expiry_is_charged_past_the_budget_and_recorded(store_target):
    clock, metrics = Clock(), AgentMetrics()
    with Store(store_target) as store:
        exp = paid(store, clock, metrics)
        first = expire(exp, clock)
        second = exp.propose()  # the released budget pays for the next round
        exp.mark_published(second.number)
        expires_at = exp.rounds[first].action.expires_at
        with capture_logs() as events:
            exp.on_ack(applied_ack(exp, first, at=expires_at + 3.0))  # the device disobeyed
        assert store.ledger("paid").spent == 4.0  # the truth: 4 of a budget of 2
        (event,) = [e for e in events if e["event"] == "budget.device_overspend"]
        assert (event["reason"], event["over_budget"]) == ("applied_after_expiry", True)
        assert overspends(metrics, "applied_after_expiry") == 1
        assert metrics.registry.get_sample_value(
            "cbo_budget_remaining", {"experiment": "paid"}
        ) == pytest.approx(0.0)
        exp.on_ack(applied_ack(exp, second.number, at=clock.now))
        exp.on_readings(
            [reading(exp, second.number, node, 0.5, seq) for seq, node in enumerate("AY")]
        )
        assert exp.rounds[second.number].status is RoundStatus.CLOSED
        assert not exp.can_propose(clock.now)
        assert exp.finished_reason.startswith("budget spent")
        entry = store.ledger_entries("paid")[first]
        assert (entry.state, entry.released_at is not None) == ("settled", True)


def test_readings_of_an_expired_round_are_charged_once_and_teach_the_model(store_target):
    clock, metrics = Clock(), AgentMetrics()
    with Store(store_target) as store:
        exp = paid(store, clock, metrics, budget_total=10.0)
        number = expire(exp, clock)

        verdicts = exp.on_readings(
            [reading(exp, number, "A", 0.5, 1), reading(exp, number, "Y", 1.0, 2)]
        )
        assert [v.outcome for v in verdicts] == ["late", "late"]
        assert store.ledger("paid").spent == 2.0
        assert overspends(metrics, "readings_after_expiry") == 1
        assert exp.model.gp.num_observations.tolist() == [1, 1]
        exp.on_ack(applied_ack(exp, number, at=clock.now))  # the ack, later still: no second
        assert store.ledger("paid").spent == 2.0
        assert overspends(metrics, "ack_after_expiry") == 0
        assert exp.rounds[number].status is RoundStatus.EXPIRED and exp.can_propose(clock.now)


def test_a_device_that_refuses_an_expired_action_releases_its_round(store_target):
    clock = Clock()
    with Store(store_target) as store:
        exp = paid(store, clock)
        live = exp.propose()
        exp.mark_published(live.number)
        refusal = applied_ack(exp, live.number, at=clock.now).model_copy(
            update={"status": "rejected", "reason": "expired", "applied": {}}
        )
        with capture_logs() as events:
            assert exp.on_ack(refusal).outcome == "accepted"
        assert live.status is RoundStatus.REJECTED and store.ledger("paid").spent == 0.0
        (ended,) = [e for e in events if e["event"] == "round.ended"]
        assert (ended["round"], ended["status"], ended["why"]) == (
            live.number,
            "rejected",
            "device rejected: expired",
        )


def test_a_restart_renews_the_expiry_of_unacknowledged_rounds_before_republishing(store_target):
    clock = Clock()
    path = store_target
    with Store(path) as store:
        exp = paid(store, clock, budget_total=10.0)
        published = exp.propose()
        exp.mark_published(published.number)
        proposed = exp.propose()  # reserved, never published (the agent died)
        old = published.action.expires_at
    clock.now += 60.0  # down for a minute: both expiries passed meanwhile
    with Store(path) as store:
        exp = paid(store, clock, budget_total=10.0)
        for number in (published.number, proposed.number):
            live = exp.rounds[number]
            assert live.action.expires_at == clock.now + 2.0 > old
            assert store.get_round("paid", number).expires_at == live.action.expires_at
        assert exp.due(clock.now) == []  # nothing expires at once: the queued acks come first
        assert exp.rounds[published.number].status is RoundStatus.PUBLISHED
        assert store.ledger("paid").reserved == 4.0
        # no broker session yet (a broker slow to answer): past the renewed window, still
        # nothing expires, nor is re-published — the queued ack has no session to come on
        clock.now += 5.0
        assert exp.due(clock.now) == [] and exp.next_deadline(clock.now) == math.inf
        assert exp.rounds[published.number].status is RoundStatus.PUBLISHED
        # the session is up: the windows start now, stored before anything is published
        assert recovery.start_windows(exp) == [published.number, proposed.number]
        for number in (published.number, proposed.number):
            live = exp.rounds[number]
            assert live.action.expires_at == clock.now + 2.0
            assert store.get_round("paid", number).expires_at == live.action.expires_at
        assert recovery.start_windows(exp) == []  # once per life
        clock.now += 2.0
        exp.due(clock.now)
        assert exp.rounds[published.number].status is RoundStatus.EXPIRED
        assert math.isclose(store.ledger("paid").reserved, 2.0)  # the unpublished one remains
