"""Prometheus metrics of cbo-agent and the HTTP endpoints that serve them.

`AgentMetrics` owns a private CollectorRegistry (never the global one, so tests and several
agents in one process do not collide) and has one small method per thing the agent reports.
Every series carries an `experiment` label.

`MetricsServer` serves, from one daemon thread (`connectors.http_server`: an event loop with
read and write timeouts and a bounded number of connections):

- ``/metrics``  text exposition of the private registry
- ``/healthz``  200 "ok" while the process is alive
- ``/readyz``   200 when the readiness check passes, else 503 with the reason
- anything else 404
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from types import TracebackType
from typing import Final, Literal, Self, get_args

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from connectors.http_server import BoundedHttpServer, Limits, Reply
from connectors.topics import DEVICE_TOPIC_KINDS

log = structlog.get_logger(__name__)

MessageOutcome = Literal["accepted", "duplicate", "late", "rejected"]
MESSAGE_OUTCOMES: Final[tuple[MessageOutcome, ...]] = get_args(MessageOutcome)
# Message kinds as labels: the topic kinds, the agent status, and "unknown" for input whose kind
# could not be told (a foreign topic, say). A closed set keeps label cardinality bounded.
MESSAGE_KINDS: Final = frozenset(DEVICE_TOPIC_KINDS) | {"status", "unknown"}
# How the agent learned that a device applied an action after its expiry (a closed set).
DeviceOverspendReason = Literal[
    "applied_after_expiry",
    "ack_after_expiry",
    "readings_after_expiry",
    "applied_after_rejection",
    "readings_after_rejection",
]
DEVICE_OVERSPEND_REASONS: Final[tuple[DeviceOverspendReason, ...]] = get_args(DeviceOverspendReason)

# Why a message was refused as not coming from whom it should (a closed set: docs/protocol.md).
UntrustedReason = Literal[
    "device_mismatch",
    "unknown_device",
    "not_actuator",
    "node_not_bound",
    "not_oracle",
    "unsigned",
    "bad_signature",
]
UNTRUSTED_REASONS: Final[tuple[UntrustedReason, ...]] = get_args(UntrustedReason)

# `cbo_model_drift`: the weight of the newest update in its exponential average (about the last
# 1/weight = 20 updates count).
DRIFT_WEIGHT: Final[float] = 0.05
# Bucket edges, roughly 1-2.5-5 (or 1-3) per decade over the range each duration lives in.
GP_UPDATE_BUCKETS: Final[tuple[float, ...]] = (
    *(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01),
    *(0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
)
DECISION_BUCKETS: Final[tuple[float, ...]] = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
)
ROUND_WAIT_BUCKETS: Final[tuple[float, ...]] = (
    *(0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0),
    *(60.0, 120.0, 300.0, 600.0),
)


class AgentMetrics:
    """The agent's Prometheus series, on a private registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        exp = ("experiment",)
        self._rounds = Counter("cbo_rounds", "Rounds completed.", exp, registry=self.registry)
        self._cumulative_regret = self._gauge(
            "cbo_cumulative_regret",
            "Sum over rounds of optimum − E[y|action], from the oracle (each round's own "
            "optimum where the spec declares reward.optimum: per_round: the dynamic regret).",
        )
        self._simple_regret = self._gauge(
            "cbo_simple_regret",
            "Optimum − E[y|best action so far], from the oracle (per_round: the smallest over "
            "rounds of the round's optimum − E[y|action]).",
        )
        self._regret_upper_estimate = self._gauge(
            "cbo_regret_model_estimate",
            "Model-based estimate of cumulative regret: sum over rounds of UCB(best candidate) "
            "- LCB(chosen), from the experiment's own model (no oracle: real systems).",
        )
        self._recommended_value = self._gauge(
            "cbo_recommended_value",
            "The model's predicted reward of the policy's current recommendation (multi-fidelity "
            "policies: at tau_max); the setting is on the retained recommendation topic.",
        )
        self._reward_last = self._gauge("cbo_reward_last", "Reward observed in the last round.")
        self._reward_best = self._gauge("cbo_reward_best", "Best reward observed so far.")
        self._budget_spent = self._gauge("cbo_budget_spent", "Intervention cost spent.")
        self._budget_remaining = self._gauge("cbo_budget_remaining", "Budget left to spend.")
        self._observations = Gauge(
            "cbo_observations",
            "Observations held by a node's model.",
            ("experiment", "node"),
            registry=self.registry,
        )
        self._model_drift = Gauge(
            "cbo_model_drift",
            "Share of a node's recent updates with a reading its model did not expect (more than "
            "model.misfit_z predictive standard deviations away), an exponential average over "
            "about 20 updates: near 0 once a stationary system is learned, rising when the "
            "system drifts from what the model learned.",
            ("experiment", "node"),
            registry=self.registry,
        )
        self._drift_level: dict[tuple[str, str], float] = {}
        self._model_changes = Counter(
            "cbo_model_changes",
            "Alarms of a node's change detector (model.change): the node's readings stopped "
            "fitting its model, and it forgot those from before the change.",
            ("experiment", "node"),
            registry=self.registry,
        )
        self._gp_update = self._histogram(
            "cbo_gp_update_seconds", "Time of one posterior update.", GP_UPDATE_BUCKETS
        )
        self._decision = self._histogram(
            "cbo_decision_seconds",
            "Decision latency: from the last reading that completed the previous round (or the "
            "timeout that closed it) to the next action published.",
            DECISION_BUCKETS,
        )
        self._policy = self._histogram(
            "cbo_policy_seconds",
            "Compute time of one proposal (the policy, or the explorer it fell back to); "
            "a part of the decision latency.",
            DECISION_BUCKETS,
        )
        self._round_wait = self._histogram(
            "cbo_round_wait_seconds",
            "Action published to round closed (feedback wait).",
            ROUND_WAIT_BUCKETS,
        )
        self._messages = Counter(
            "cbo_messages",
            "Incoming messages by kind and outcome; reason is set for rejected ones only.",
            ("experiment", "kind", "outcome", "reason"),
            registry=self.registry,
        )
        self._proposals_rejected = Counter(
            "cbo_proposals_rejected",
            "Proposals the agent refused because what it would publish breaks a constraint "
            "(a policy bug); reason: the constraint.",
            ("experiment", "reason"),
            registry=self.registry,
        )
        self._policy_failures = Counter(
            "cbo_policy_failures",
            "Proposals a policy failed to make (it raised, or proposed NaN); the explorer "
            "proposed instead. error: the exception's type.",
            ("experiment", "policy", "error"),
            registry=self.registry,
        )
        self._finished = self._gauge(
            "cbo_experiment_finished",
            "1 once the experiment has finished (round limit or budget), else 0.",
        )
        self._device_overspend = Counter(
            "cbo_device_overspend",
            "Actions a device applied after the agent had given up on them (their round "
            "expired) or after it had said it would not (it rejected them): charged to the "
            "ledger anyway, even past the budget; reason: how it was learned.",
            ("experiment", "reason"),
            registry=self.registry,
        )
        self._untrusted = Counter(
            "cbo_untrusted_messages",
            "Messages refused because their sender may not say them: another device's id, a "
            "device the spec does not bind, an ack not from the actuator, a reading of a node "
            "the device is not bound to, an oracle from a non-simulator, a missing or wrong "
            'signature. Also counted in cbo_messages_total{outcome="rejected"}.',
            ("experiment", "kind", "reason"),
            registry=self.registry,
        )

    def round_completed(self, experiment: str) -> None:
        """Count one finished round."""
        self._rounds.labels(experiment).inc()

    def set_regret(self, experiment: str, *, cumulative: float, simple: float) -> None:
        """True regret, computed from a simulator's oracle."""
        self._cumulative_regret.labels(experiment).set(cumulative)
        self._simple_regret.labels(experiment).set(simple)

    def set_regret_upper_estimate(self, experiment: str, value: float) -> None:
        """The model-based regret estimate used where no oracle exists."""
        self._regret_upper_estimate.labels(experiment).set(value)

    def set_recommended_value(self, experiment: str, value: float) -> None:
        """The predicted reward of the recommendation published last."""
        self._recommended_value.labels(experiment).set(value)

    def set_reward(self, experiment: str, *, last: float, best: float) -> None:
        """Reward of the last round and the best so far."""
        self._reward_last.labels(experiment).set(last)
        self._reward_best.labels(experiment).set(best)

    def set_budget(self, experiment: str, *, spent: float, remaining: float) -> None:
        """Budget ledger totals."""
        self._budget_spent.labels(experiment).set(spent)
        self._budget_remaining.labels(experiment).set(remaining)

    def set_observations(self, experiment: str, node: str, count: int) -> None:
        """Number of observations in one node's model; its change-alarm count starts at 0.

        A counter that first appears at 1 is invisible to `increase()`, and a node whose
        detector is off (or has not fired) still shows on the dashboard, with no alarms.
        """
        self._observations.labels(experiment, node).set(count)
        self._model_changes.labels(experiment, node)

    def observe_fit(self, experiment: str, node: str, surprised: bool) -> None:
        """One update of a node's model: whether its reading was a misfit (`cbo_model_drift`)."""
        key = (experiment, node)
        level = self._drift_level.get(key, 0.0)
        level += DRIFT_WEIGHT * (float(surprised) - level)
        self._drift_level[key] = level
        self._model_drift.labels(experiment, node).set(level)

    def observe_change(self, experiment: str, node: str) -> None:
        """One alarm of a node's change detector (`cbo_model_changes_total`)."""
        self._model_changes.labels(experiment, node).inc()

    def observe_gp_update(self, experiment: str, seconds: float) -> None:
        """Duration of one (batched) posterior update."""
        self._gp_update.labels(experiment).observe(seconds)

    def observe_decision(self, experiment: str, seconds: float) -> None:
        """Decision latency: the reading (or timeout) that closed a round to the next action
        published."""
        self._decision.labels(experiment).observe(seconds)

    def observe_policy(self, experiment: str, seconds: float) -> None:
        """Compute time of one proposal (policy only, no I/O)."""
        self._policy.labels(experiment).observe(seconds)

    def proposal_rejected(self, experiment: str, reason: str) -> None:
        """Count a proposal refused by the agent's own constraint check."""
        self._proposals_rejected.labels(experiment, reason).inc()

    def policy_failed(self, experiment: str, policy: str, error: str) -> None:
        """Count a proposal a policy failed to make (the explorer stood in)."""
        self._policy_failures.labels(experiment, policy, error).inc()

    def device_overspend(self, experiment: str, reason: DeviceOverspendReason) -> None:
        """Count an action charged after its round expired (a device applied it anyway)."""
        self._device_overspend.labels(experiment, reason).inc()

    def untrusted(self, experiment: str, kind: str, reason: UntrustedReason) -> None:
        """Count a message refused for its sender (see UNTRUSTED_REASONS)."""
        if kind not in MESSAGE_KINDS:
            raise ValueError(f"unknown message kind {kind!r}; expected one of {MESSAGE_KINDS}")
        if reason not in UNTRUSTED_REASONS:
            raise ValueError(f"unknown reason {reason!r}; expected one of {UNTRUSTED_REASONS}")
        self._untrusted.labels(experiment, kind, reason).inc()

    def register_experiment(self, experiment: str) -> None:
        """Export an experiment's state and its zero counts of what should never happen.

        A counter that first appears at 1 is invisible to `increase()`; starting the device
        overspend counts at 0 lets an alert on their increase see the first one.
        """
        self.set_finished(experiment, False)
        for reason in DEVICE_OVERSPEND_REASONS:
            self._device_overspend.labels(experiment, reason)
        for kind in ("ack", "reading", "oracle"):
            for untrusted in UNTRUSTED_REASONS:
                self._untrusted.labels(experiment, kind, untrusted)

    def set_finished(self, experiment: str, finished: bool) -> None:
        """Whether the experiment has finished (no more rounds will be proposed)."""
        self._finished.labels(experiment).set(1.0 if finished else 0.0)

    def observe_round_wait(self, experiment: str, seconds: float) -> None:
        """How long a round waited for its feedback."""
        self._round_wait.labels(experiment).observe(seconds)

    def message(
        self, experiment: str, kind: str, outcome: MessageOutcome, reason: str = ""
    ) -> None:
        """Count one incoming message; `reason` (a short code) only with outcome "rejected"."""
        if kind not in MESSAGE_KINDS:
            raise ValueError(f"unknown message kind {kind!r}; expected one of {MESSAGE_KINDS}")
        if outcome not in MESSAGE_OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {MESSAGE_OUTCOMES}")
        if (outcome == "rejected") != bool(reason):
            raise ValueError("a reason goes with outcome 'rejected', and only with it")
        self._messages.labels(experiment, kind, outcome, reason).inc()

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(name, documentation, ("experiment",), registry=self.registry)

    def _histogram(self, name: str, documentation: str, buckets: Iterable[float]) -> Histogram:
        return Histogram(
            name, documentation, ("experiment",), buckets=tuple(buckets), registry=self.registry
        )


ReadinessCheck = Callable[[], tuple[bool, str]]


class Readiness:
    """Thread-safe readiness: ready when every named condition holds.

    A condition that does not hold may say why; /readyz shows the reason beside its name.

    >>> readiness = Readiness("broker_connected", "experiments_loaded")
    >>> readiness.set("broker_connected", True)
    >>> readiness()
    (False, 'waiting for: experiments_loaded')
    >>> readiness.set("broker_connected", False, "mqtt://127.0.0.1:1883: connection refused")
    >>> readiness()[1]
    'waiting for: broker_connected (mqtt://127.0.0.1:1883: connection refused), experiments_loaded'
    """

    def __init__(self, *conditions: str) -> None:
        self._lock = threading.Lock()
        self._state = dict.fromkeys(conditions, False)
        self._reasons: dict[str, str] = {}

    def set(self, condition: str, holds: bool, reason: str = "") -> None:
        """Mark one condition as holding or not (and why not); new names add a condition."""
        with self._lock:
            self._state[condition] = holds
            if holds or not reason:
                self._reasons.pop(condition, None)
            else:
                self._reasons[condition] = reason

    def __call__(self) -> tuple[bool, str]:
        with self._lock:
            waiting = [
                f"{name} ({self._reasons[name]})" if name in self._reasons else name
                for name, holds in self._state.items()
                if not holds
            ]
        return (not waiting, "ready" if not waiting else "waiting for: " + ", ".join(waiting))


class MetricsUnavailable(Exception):
    """The endpoints cannot listen where asked (a port in use, an address not of this host)."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        super().__init__(f"cannot listen on {host}:{port} for /metrics: {error.strerror or error}")
        self.address = f"{host}:{port}"


class MetricsServer:
    """HTTP endpoints for Prometheus and for orchestrators' probes; a context manager.

    Served by `connectors.http_server.BoundedHttpServer`: one thread with its own event loop,
    read and write timeouts and a bounded number of connections, so slow or half-open clients
    cannot exhaust threads or lock the probes out. `port=0` picks a free port; `port` tells
    which one was bound once started. `start` raises MetricsUnavailable when the address cannot
    be bound.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: ReadinessCheck,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
    ) -> None:
        self._server = BoundedHttpServer(
            {
                "/metrics": lambda: Reply(
                    HTTPStatus.OK, generate_latest(registry), CONTENT_TYPE_LATEST
                ),
                "/healthz": lambda: Reply(HTTPStatus.OK, b"ok\n"),
                "/readyz": lambda: _readiness_reply(readiness),
            },
            host=host,
            port=port,
            limits=limits,
            name="metrics-http",
        )
        self._address_port = port
        self._started = False

    @property
    def http(self) -> BoundedHttpServer:
        """The server underneath (its limits and counters)."""
        return self._server

    @property
    def port(self) -> int:
        """The bound port (only once started)."""
        if not self._started:
            raise RuntimeError("metrics server not started")
        return self._server.port

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:9464``."""
        return f"http://{self._server.host}:{self.port}"

    def start(self) -> None:
        """Bind and serve in a daemon thread."""
        if self._started:
            raise RuntimeError("metrics server already started")
        try:
            self._server.start()
        except OSError as error:
            raise MetricsUnavailable(self._server.host, self._address_port, error) from None
        self._started = True
        log.info("metrics.serving", host=self._server.host, port=self.port)

    def close(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        if not self._started:
            return
        self._started = False
        self._server.close()
        log.info("metrics.stopped")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _readiness_reply(readiness: ReadinessCheck) -> Reply:
    try:
        ready, reason = readiness()
    except Exception as error:  # a broken check means "not ready", never a dead server
        ready, reason = False, f"readiness check failed: {error!r}"
    status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
    return Reply(status, (reason + "\n").encode("utf-8"))
