"""The Prometheus exporter, scraped over real HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from connectors.metrics import (
    DECISION_BUCKETS,
    GP_UPDATE_BUCKETS,
    ROUND_WAIT_BUCKETS,
    AgentMetrics,
    MetricsServer,
    Readiness,
)

TIMEOUT_S = 5.0


def fetch(url: str) -> tuple[int, str, str]:
    """GET `url`: (status, content type, body), also for error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read().decode()


def scrape(server: MetricsServer) -> dict[str, list[Sample]]:
    status, content_type, body = fetch(server.url + "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    return {family.name: family.samples for family in text_string_to_metric_families(body)}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    matches = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(matches) == 1, f"{name}{labels} in {samples}"
    return matches[0]


@pytest.fixture
def metrics() -> AgentMetrics:
    return AgentMetrics()


@pytest.fixture
def readiness() -> Readiness:
    return Readiness("broker_connected", "experiments_loaded")


@pytest.fixture
def server(metrics: AgentMetrics, readiness: Readiness) -> Iterator[MetricsServer]:
    with MetricsServer(metrics.registry, readiness, port=0) as started:
        yield started


@pytest.mark.integration
def test_scrape_shows_every_series_with_its_labels(
    server: MetricsServer, metrics: AgentMetrics
) -> None:
    assert server.port > 0
    for _ in range(3):
        metrics.round_completed("exp1")
    metrics.round_completed("exp2")
    metrics.set_regret("exp1", cumulative=4.5, simple=0.25)
    metrics.set_regret_upper_estimate("exp2", 7.0)
    metrics.set_reward("exp1", last=1.5, best=2.0)
    metrics.set_budget("exp1", spent=30.0, remaining=70.0)
    metrics.set_observations("exp1", "X2", 12)
    metrics.observe_gp_update("exp1", 2e-4)
    metrics.observe_decision("exp1", 0.3)
    metrics.observe_round_wait("exp1", 4.0)
    metrics.message("exp1", "reading", "accepted")
    metrics.message("exp1", "reading", "accepted")
    metrics.message("exp1", "reading", "duplicate")
    metrics.message("exp1", "reading", "late")
    metrics.message("exp1", "reading", "rejected", reason="invalid")
    metrics.proposal_rejected("exp1", "max_interventions")
    metrics.device_overspend("exp1", "applied_after_expiry")
    metrics.device_overspend("exp1", "applied_after_expiry")

    families = scrape(server)
    # a node with observations shows its change alarms from 0 (review: the dashboard's panel
    # had no data until a first alarm), and each alarm counts
    changes = families["cbo_model_changes"]
    assert value(changes, "cbo_model_changes_total", experiment="exp1", node="X2") == 0
    metrics.observe_change("exp1", "X2")
    changes = scrape(server)["cbo_model_changes"]
    assert value(changes, "cbo_model_changes_total", experiment="exp1", node="X2") == 1
    refused = families["cbo_proposals_rejected"]
    labels = {"experiment": "exp1", "reason": "max_interventions"}
    assert value(refused, "cbo_proposals_rejected_total", **labels) == 1
    overspend = families["cbo_device_overspend"]
    labels = {"experiment": "exp1", "reason": "applied_after_expiry"}
    assert value(overspend, "cbo_device_overspend_total", **labels) == 2

    rounds = families["cbo_rounds"]
    assert value(rounds, "cbo_rounds_total", experiment="exp1") == 3
    assert value(rounds, "cbo_rounds_total", experiment="exp2") == 1
    assert (
        value(families["cbo_cumulative_regret"], "cbo_cumulative_regret", experiment="exp1") == 4.5
    )
    assert value(families["cbo_simple_regret"], "cbo_simple_regret", experiment="exp1") == 0.25
    upper = families["cbo_regret_model_estimate"]
    assert value(upper, "cbo_regret_model_estimate", experiment="exp2") == 7.0
    assert value(families["cbo_reward_last"], "cbo_reward_last", experiment="exp1") == 1.5
    assert value(families["cbo_reward_best"], "cbo_reward_best", experiment="exp1") == 2.0
    assert value(families["cbo_budget_spent"], "cbo_budget_spent", experiment="exp1") == 30.0
    assert value(families["cbo_budget_remaining"], "cbo_budget_remaining", experiment="exp1") == 70
    observations = families["cbo_observations"]
    assert value(observations, "cbo_observations", experiment="exp1", node="X2") == 12

    messages = families["cbo_messages"]
    by_outcome = {
        (s.labels["outcome"], s.labels["reason"]): s.value
        for s in messages
        if s.name == "cbo_messages_total"
    }
    assert by_outcome == {
        ("accepted", ""): 2,
        ("duplicate", ""): 1,
        ("late", ""): 1,
        ("rejected", "invalid"): 1,
    }
    assert {s.labels["kind"] for s in messages} == {"reading"}


def test_decision_latency_and_policy_time_say_what_they_measure(metrics: AgentMetrics) -> None:
    helps = {family.name: family.documentation for family in metrics.registry.collect()}
    assert helps["cbo_decision_seconds"].startswith("Decision latency: from the last reading")
    assert "next action published" in helps["cbo_decision_seconds"]
    assert helps["cbo_policy_seconds"].startswith("Compute time of one proposal")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("name", "observe", "buckets", "seconds"),
    [
        ("cbo_gp_update_seconds", AgentMetrics.observe_gp_update, GP_UPDATE_BUCKETS, 2e-4),
        ("cbo_decision_seconds", AgentMetrics.observe_decision, DECISION_BUCKETS, 0.3),
        ("cbo_policy_seconds", AgentMetrics.observe_policy, DECISION_BUCKETS, 0.3),
        ("cbo_round_wait_seconds", AgentMetrics.observe_round_wait, ROUND_WAIT_BUCKETS, 4.0),
    ],
)
def test_histograms_have_their_buckets(
    server: MetricsServer,
    metrics: AgentMetrics,
    name: str,
    observe: object,
    buckets: tuple[float, ...],
    seconds: float,
) -> None:
    observe(metrics, "exp1", seconds)  # type: ignore[operator]
    samples = scrape(server)[name]
    edges = sorted(
        float(s.labels["le"]) for s in samples if s.name == f"{name}_bucket" and s.labels["le"]
    )
    assert edges == [*buckets, float("inf")]
    assert value(samples, f"{name}_count", experiment="exp1") == 1
    assert value(samples, f"{name}_sum", experiment="exp1") == pytest.approx(seconds)
    first_holding = min(edge for edge in buckets if edge >= seconds)
    assert value(samples, f"{name}_bucket", experiment="exp1", le=repr(first_holding)) == 1
    below = max(edge for edge in buckets if edge < seconds)
    assert value(samples, f"{name}_bucket", experiment="exp1", le=repr(below)) == 0


def test_bucket_ranges_match_what_they_measure() -> None:
    assert (GP_UPDATE_BUCKETS[0], GP_UPDATE_BUCKETS[-1]) == (1e-5, 10.0)
    assert (DECISION_BUCKETS[0], DECISION_BUCKETS[-1]) == (1e-3, 120.0)
    assert (ROUND_WAIT_BUCKETS[0], ROUND_WAIT_BUCKETS[-1]) == (0.01, 600.0)
    for buckets in (GP_UPDATE_BUCKETS, DECISION_BUCKETS, ROUND_WAIT_BUCKETS):
        assert list(buckets) == sorted(set(buckets))


@pytest.mark.integration
def test_healthz_readyz_and_unknown_paths(server: MetricsServer, readiness: Readiness) -> None:
    assert fetch(server.url + "/healthz")[::2] == (200, "ok\n")

    status, _, body = fetch(server.url + "/readyz")
    assert status == 503 and "broker_connected" in body and "experiments_loaded" in body
    readiness.set("broker_connected", True)
    status, _, body = fetch(server.url + "/readyz")
    assert status == 503 and "broker_connected" not in body and "experiments_loaded" in body
    readiness.set("experiments_loaded", True)
    assert fetch(server.url + "/readyz")[::2] == (200, "ready\n")
    readiness.set("broker_connected", False)  # a lost broker makes the agent unready again
    assert fetch(server.url + "/readyz")[0] == 503

    for path in ("/", "/metric", "/metrics/extra", "/healthz/x", "/favicon.ico"):
        assert fetch(server.url + path)[0] == 404, path
    assert fetch(server.url + "/metrics?name[]=cbo_rounds_total")[0] == 200


@pytest.mark.integration
def test_a_failing_readiness_check_reads_as_not_ready(metrics: AgentMetrics) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("store unreachable")

    with MetricsServer(metrics.registry, broken) as server:
        status, _, body = fetch(server.url + "/readyz")
        assert status == 503 and "store unreachable" in body
        assert fetch(server.url + "/healthz")[0] == 200


@pytest.mark.integration
def test_two_agents_in_one_process_keep_separate_series() -> None:
    first, second = AgentMetrics(), AgentMetrics()
    first.round_completed("exp1")
    with (
        MetricsServer(first.registry, Readiness()) as one,
        MetricsServer(second.registry, Readiness()) as two,
    ):
        assert one.port != two.port
        assert value(scrape(one)["cbo_rounds"], "cbo_rounds_total", experiment="exp1") == 1
        assert "cbo_rounds_total" not in {s.name for s in scrape(two)["cbo_rounds"]}


@pytest.mark.integration
def test_close_releases_the_port(metrics: AgentMetrics) -> None:
    server = MetricsServer(metrics.registry, Readiness())
    server.start()
    url = server.url
    assert fetch(url + "/healthz")[0] == 200
    server.close()
    server.close()  # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/healthz", timeout=TIMEOUT_S)


def test_message_labels_are_checked(metrics: AgentMetrics) -> None:
    with pytest.raises(ValueError):
        metrics.message("exp1", "reading", "rejected")  # rejected needs a reason
    with pytest.raises(ValueError):
        metrics.message("exp1", "reading", "accepted", reason="invalid")
    with pytest.raises(ValueError):
        metrics.message("exp1", "readings", "accepted")  # unknown kind
    with pytest.raises(ValueError):
        metrics.message("exp1", "reading", "maybe")  # type: ignore[arg-type]


def test_model_drift_is_the_recent_share_of_unexpected_readings():
    from connectors.metrics import DRIFT_WEIGHT

    metrics = AgentMetrics()
    labels = {"experiment": "exp1", "node": "X1"}
    for _ in range(200):  # a learned system: nothing unexpected
        metrics.observe_fit("exp1", "X1", False)
    assert metrics.registry.get_sample_value("cbo_model_drift", labels) == 0
    for _ in range(20):  # it changed: every reading is a misfit
        metrics.observe_fit("exp1", "X1", True)
    level = metrics.registry.get_sample_value("cbo_model_drift", labels)
    assert level == pytest.approx(1 - (1 - DRIFT_WEIGHT) ** 20)  # ≈ 0.64 after 20 updates
