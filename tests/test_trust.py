"""Device identity without a broker: the spec's bindings, who may say what, what a rejected
action costs when it was applied after all, oracle values that break their definition, and
per-device HMAC signatures.

tests/test_trust_broker.py runs the same rules against a real Mosquitto with the shipped ACL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from agent import identity
from agent.config import ConfigError, load_config
from agent.experiment import Experiment, RoundStatus
from connectors.metrics import UNTRUSTED_REASONS, AgentMetrics
from connectors.schemas import Ack, Oracle, Reading, encode
from connectors.signing import DeviceKeys, KeyFileError, SignatureError, sign, unwrap
from connectors.store import Store
from core.errors import SpecError
from core.spec import DeviceSpec, ExperimentSpec, parse_spec
from tests.test_agent_join import Clock

ROOT = Path(__file__).resolve().parents[1]
KEY = "0123456789abcdef0123456789abcdef"  # 32 bytes of text: a test key, not a secret


def spec_with(
    devices: list[dict] | None, name: str = "trust", optimum: str = "fixed"
) -> ExperimentSpec:
    """A chain A -> B -> C (reward C) with one action on B, and `devices` as given;
    `optimum`: the spec's `reward.optimum` (`per_round` for a system that drifts)."""
    data = {
        "name": name,
        "intervention": "soft",
        "nodes": [
            {"name": "A", "bounds": [0, 1], "noise_std": 0.1},
            {"name": "B", "parents": ["A"], "bounds": [-2, 2], "noise_std": 0.1},
            {"name": "C", "parents": ["B"], "bounds": [-4, 4], "noise_std": 0.1},
        ],
        "actions": [{"name": "u", "targets": ["B"], "bounds": [-1, 1], "cost": 1.0}],
        "reward": {"node": "C", "optimum": optimum},
        "constraints": {"budget_total": 10.0},
        "model": {"refit_every": None, "misfit_z": None},
        "policy": {"name": "random"},
        "schedule": {"pipeline": 4},
    }
    if devices is not None:
        data["devices"] = devices
    return parse_spec(data)


SPLIT = [
    {"id": "valve", "actuator": True, "nodes": ["B"]},
    {"id": "sensor-a", "nodes": ["A"]},
    {"id": "sensor-c", "nodes": ["C"], "oracle": True},
]


# ------------------------------------------------------------------------------------ the spec
def test_without_devices_the_simulator_is_the_one_device() -> None:
    spec = spec_with(None)
    (device,) = spec.served_by
    assert device == DeviceSpec(id="sim-trust", actuator=True, nodes=["A", "B", "C"], oracle=True)
    assert spec.actuator_id == "sim-trust"
    assert spec.device("sim-trust") == device and spec.device("other") is None


def test_declared_devices_bind_roles_and_nodes() -> None:
    spec = spec_with(SPLIT)
    assert spec.actuator_id == "valve"
    assert spec.device("sensor-a").nodes == ["A"]
    assert [d.id for d in spec.served_by] == ["valve", "sensor-a", "sensor-c"]


@pytest.mark.parametrize(
    ("devices", "problem"),
    [
        ([], "devices: empty"),
        ([{"id": "a", "nodes": ["A", "B", "C"]}], "exactly one actuator, got 0"),
        (
            [{"id": "a", "actuator": True, "nodes": ["A", "B"]}, {"id": "b", "actuator": True}],
            "exactly one actuator, got 2",
        ),
        (
            [{"id": "a", "actuator": True, "nodes": ["A", "B", "C"]}, {"id": "a"}],
            "duplicate device id 'a'",
        ),
        ([{"id": "a", "actuator": True, "nodes": ["A", "B", "Q"]}], "unknown node 'Q'"),
        ([{"id": "a", "actuator": True, "nodes": ["A", "B"]}], "no device reports ['C']"),
        ([{"id": "a", "actuator": True, "nodes": ["A", "A", "B", "C"]}], "a node appears twice"),
        (
            [{"id": "a/b", "actuator": True, "nodes": ["A", "B", "C"]}],
            "devices[0].id: 'a/b' is not allowed",
        ),
    ],
)
def test_bad_device_bindings_are_spec_errors(devices: list[dict], problem: str) -> None:
    with pytest.raises(SpecError) as raised:
        spec_with(devices)
    assert problem in str(raised.value)


# ------------------------------------------------------------------------- who may say what
def ack(spec: ExperimentSpec, device: str, status: str = "applied") -> Ack:
    return Ack(
        experiment=spec.name,
        round=0,
        action_id="a" * 32,
        device_id=device,
        status=status,  # type: ignore[arg-type]
        applied={},
        at=0.0,
    )


def reading(spec: ExperimentSpec, device: str, node: str, value: float = 0.5, seq: int = 1):
    return Reading(
        experiment=spec.name, round=0, node=node, value=value, seq=seq, device_id=device, at=0.0
    )


def oracle(spec: ExperimentSpec, device: str, expected: float = 1.0, optimum: float = 2.0):
    return Oracle(
        experiment=spec.name,
        round=0,
        action_id="a" * 32,
        expected_reward=expected,
        optimum=optimum,
        device_id=device,
        at=0.0,
    )


def test_who_may_say_what() -> None:
    spec = spec_with(SPLIT)
    cases = [
        ("valve", ack(spec, "valve"), None),
        ("sensor-a", ack(spec, "sensor-a"), "not_actuator"),
        ("valve", ack(spec, "sensor-a"), "device_mismatch"),
        ("intruder", ack(spec, "intruder"), "unknown_device"),
        ("sensor-a", reading(spec, "sensor-a", "A"), None),
        ("sensor-a", reading(spec, "sensor-a", "C"), "node_not_bound"),
        ("valve", reading(spec, "valve", "B"), None),
        ("valve", reading(spec, "sensor-c", "C"), "device_mismatch"),
        ("sensor-a", reading(spec, "sensor-a", "nope"), None),  # unknown_node, later
        ("sensor-c", oracle(spec, "sensor-c"), None),
        ("valve", oracle(spec, "valve"), "not_oracle"),
        ("intruder", oracle(spec, "intruder"), "unknown_device"),
    ]
    for sender, message, expected in cases:
        refused = identity.refusal(spec, sender, message)
        assert (refused[0] if refused else None) == expected, (sender, message)
        if refused:
            assert refused[0] in UNTRUSTED_REASONS and refused[1]


devices = st.lists(
    st.builds(
        dict,
        id=st.sampled_from(["d0", "d1", "d2", "d3"]),
        nodes=st.lists(st.sampled_from(["A", "B", "C"]), unique=True),
        oracle=st.booleans(),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda d: d["id"],
)


@given(devices, st.integers(0, 3), st.sampled_from(["d0", "d1", "d2", "d3", "dx"]), st.data())
def test_a_message_passes_only_from_a_device_the_spec_lets_say_it(
    declared: list[dict], actuator: int, sender: str, data: st.DataObject
) -> None:
    declared = [d | {"actuator": i == actuator % len(declared)} for i, d in enumerate(declared)]
    declared[0]["nodes"] = ["A", "B", "C"]  # every node reported by someone
    spec = spec_with(declared)
    claimed = data.draw(st.sampled_from([sender, "d0", "d1"]))
    kind = data.draw(st.sampled_from(["ack", "reading", "oracle"]))
    node = data.draw(st.sampled_from(["A", "B", "C"]))
    message = {
        "ack": lambda: ack(spec, claimed),
        "reading": lambda: reading(spec, claimed, node),
        "oracle": lambda: oracle(spec, claimed),
    }[kind]()
    bound = {d["id"]: d for d in declared}.get(sender)
    allowed = (
        claimed == sender
        and bound is not None
        and {
            "ack": bound["actuator"],
            "reading": node in bound["nodes"],
            "oracle": bound["oracle"],
        }[kind]
    )
    assert (identity.refusal(spec, sender, message) is None) == allowed


# --------------------------------------------------------- a rejection never silently un-spends
def experiment(spec: ExperimentSpec) -> tuple[Experiment, Store, AgentMetrics]:
    store = Store(":memory:")
    metrics = AgentMetrics()
    exp = Experiment(spec, store, seed=1, clock=Clock(), metrics=metrics)
    metrics.register_experiment(spec.name)
    return exp, store, metrics


def overspend_counts(metrics: AgentMetrics, experiment: str) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cbo_device_overspend_total"
        and sample.labels["experiment"] == experiment
        and sample.value
    }


def reject_round(exp: Experiment, device: str) -> tuple[Ack, float]:
    live = exp.propose()
    exp.mark_published(live.number)
    cost = live.cost
    refused = Ack(
        experiment=exp.name,
        round=live.number,
        action_id=live.action.action_id,
        device_id=device,
        status="rejected",
        reason="out of range",
        applied={},
        at=1.0,
    )
    assert exp.on_ack(refused).outcome == "accepted"
    assert exp.rounds[live.number].status is RoundStatus.REJECTED
    assert exp.budget_spent() == 0.0  # the reservation was released
    return refused, cost


def test_an_action_applied_after_its_rejection_is_charged_as_an_overspend() -> None:
    exp, store, metrics = experiment(spec_with(SPLIT))
    refused, cost = reject_round(exp, "valve")
    applied = refused.model_copy(update={"status": "applied", "reason": None, "at": 2.0})
    with capture_logs() as events:
        assert exp.on_ack(applied).outcome == "late"
        assert exp.on_ack(applied).outcome == "duplicate"  # charged once
    assert cost > 0 and exp.budget_spent() == pytest.approx(cost)
    assert store.ledger_entries(exp.name)[0].state == "settled"
    assert overspend_counts(metrics, exp.name) == {"applied_after_rejection": 1.0}
    (event,) = [e for e in events if e["event"] == "budget.device_overspend"]
    assert event["reason"] == "applied_after_rejection" and event["cost"] == cost
    # the action happened: the sensors' readings of its round count now
    (verdict,) = exp.on_readings([reading(exp.spec, "sensor-a", "A", 0.5, 7)])
    assert verdict.outcome == "late"


def test_the_actuators_readings_after_its_rejection_are_charged_once() -> None:
    exp, store, metrics = experiment(spec_with(SPLIT))
    _, cost = reject_round(exp, "valve")
    # another device's reading shows no intervention: the round's action was not applied
    (stale,) = exp.on_readings([reading(exp.spec, "sensor-a", "A", 0.5, 1)])
    assert (stale.outcome, stale.reason) == ("rejected", "stale_round")
    assert exp.budget_spent() == 0.0
    verdicts = exp.on_readings(
        [reading(exp.spec, "valve", "B", 0.25, 1), reading(exp.spec, "valve", "B", 0.3, 2)]
    )
    assert [v.outcome for v in verdicts] == ["late", "duplicate"]
    assert exp.budget_spent() == pytest.approx(cost)
    assert overspend_counts(metrics, exp.name) == {"readings_after_rejection": 1.0}
    assert [(r.node, r.value, r.device_id) for r in store.readings(exp.name)] == [
        ("B", 0.25, "valve")
    ]


# --------------------------------------------------------------------- oracle values
def oracle_for(exp: Experiment, number: int, expected: float, optimum: float) -> Oracle:
    live = exp.rounds[number]
    return Oracle(
        experiment=exp.name,
        round=number,
        action_id=live.action.action_id,
        expected_reward=expected,
        optimum=optimum,
        device_id="sensor-c",
        at=0.0,
    )


def test_oracle_values_that_break_their_definition_are_refused() -> None:
    exp, store, _ = experiment(spec_with(SPLIT))
    for _ in range(4):
        exp.mark_published(exp.propose().number)
    refused = {
        "oracle_above_optimum": oracle_for(exp, 0, 3.0, 2.0),  # E[y|a] above max_a E[y|a]
        "out_of_range": oracle_for(exp, 0, -1e300, 2.0),  # the reward node reads [-4, 4]
    }
    for reason, message in refused.items():
        assert (exp.on_oracle(message).outcome, exp.on_oracle(message).reason) == (
            "rejected",
            reason,
        )
    assert exp.on_oracle(oracle_for(exp, 1, 1.9995, 2.0)).outcome == "accepted"  # within slack
    changed = exp.on_oracle(oracle_for(exp, 2, 1.0, 3.0))  # the optimum is one number
    assert (changed.outcome, changed.reason) == ("rejected", "oracle_optimum_changed")
    assert exp.on_oracle(oracle_for(exp, 3, 1.0, 2.0)).outcome == "accepted"
    assert [o.round for o in store.oracles(exp.name)] == [1, 3]
    assert exp.regret.cumulative == pytest.approx(0.0005 + 1.0)


def test_a_drifting_system_states_the_optimum_of_each_round() -> None:
    """`reward.optimum: per_round`: each oracle's optimum is its round's, so a changed one is
    accepted and the regret of round t is f*_t − E[y_t | a_t] (the dynamic regret); E[y] above
    its own round's optimum, or out of range, is still refused."""
    exp, store, metrics = experiment(spec_with(SPLIT, optimum="per_round"))
    for _ in range(4):
        exp.mark_published(exp.propose().number)
    refused = {
        "oracle_above_optimum": oracle_for(exp, 0, 1.5, 1.0),  # above its own round's
        "out_of_range": oracle_for(exp, 0, 0.0, 1e300),
    }
    for reason, message in refused.items():
        verdict = exp.on_oracle(message)
        assert (verdict.outcome, verdict.reason) == ("rejected", reason)
    stated = {0: (1.5, 2.0), 1: (0.5, 3.0), 2: (-1.0, -0.5), 3: (2.9, 3.0)}  # (E[y], f*_t)
    for number, (expected, optimum) in stated.items():
        assert exp.on_oracle(oracle_for(exp, number, expected, optimum)).outcome == "accepted"
    assert exp.regret.optima == {t: f for t, (_, f) in stated.items()}
    assert exp.regret.cumulative == pytest.approx(0.5 + 2.5 + 0.5 + 0.1)
    assert exp.regret.simple == pytest.approx(0.1)  # the best round's regret
    gauge = metrics.registry.get_sample_value
    assert gauge("cbo_cumulative_regret", {"experiment": "trust"}) == pytest.approx(3.6)
    assert gauge("cbo_simple_regret", {"experiment": "trust"}) == pytest.approx(0.1)
    assert [(o.round, o.optimum) for o in store.oracles(exp.name)] == [
        (t, f) for t, (_, f) in stated.items()
    ]


def test_a_restart_restores_each_rounds_optimum(tmp_path: Path) -> None:
    """The oracle table holds every round's optimum: a restarted agent's dynamic regret is
    the one it had."""
    spec = spec_with(SPLIT, optimum="per_round")
    with Store(tmp_path / "a.sqlite") as store:
        exp = Experiment(spec, store, seed=1, clock=Clock())
        for _ in range(3):
            exp.mark_published(exp.propose().number)
        for number, (expected, optimum) in enumerate([(1.0, 2.0), (2.5, 3.0), (0.0, 1.0)]):
            assert exp.on_oracle(oracle_for(exp, number, expected, optimum)).outcome == ("accepted")
        before = (dict(exp.regret.optima), exp.regret.cumulative, exp.regret.simple)
    with Store(tmp_path / "a.sqlite") as store:
        again = Experiment(spec, store, seed=1, clock=Clock())
    assert (again.regret.optima, again.regret.cumulative, again.regret.simple) == before
    assert before[1] == pytest.approx(1.0 + 0.5 + 1.0)


def test_a_stored_oracle_that_breaks_its_definition_is_not_replayed(tmp_path: Path) -> None:
    """What an agent before these checks accepted (a forged −1e300) does not come back."""
    spec = spec_with(SPLIT)
    with Store(tmp_path / "a.sqlite") as store:
        exp = Experiment(spec, store, seed=1, clock=Clock())
        for _ in range(2):
            exp.mark_published(exp.propose().number)
        store.add_oracle(spec.name, 0, exp.rounds[0].action.action_id, -1e300, 2.0, 1.0)
        store.add_oracle(spec.name, 1, exp.rounds[1].action.action_id, 1.5, 2.0, 1.0)
    with Store(tmp_path / "a.sqlite") as store, capture_logs() as events:
        again = Experiment(spec, store, seed=1, clock=Clock())
    assert again.regret.expected == {1: 1.5}
    assert again.regret.cumulative == pytest.approx(0.5)
    (skipped,) = [e for e in events if e["event"] == "oracle.skipped"]
    assert (skipped["round"], skipped["reason"]) == (0, "out_of_range")


# --------------------------------------------------------------------- signatures
def keys() -> DeviceKeys:
    return DeviceKeys.parse(f"sensor-7 {KEY}\n# a comment\n\nvalve {KEY[::-1]}", "test keys")


def payload() -> bytes:
    spec = spec_with(None)
    return encode(reading(spec, "sensor-7", "A"))


def test_a_signed_payload_opens_to_exactly_what_was_signed() -> None:
    signed = sign(payload(), "sensor-7", KEY.encode())
    assert json.loads(signed)["schema"] == "cbo.signed"
    assert unwrap(signed, "sensor-7", keys()) == payload()
    assert unwrap(payload(), "sensor-8", keys()) == payload()  # no key: plain passes


@pytest.mark.parametrize(
    ("sender", "message", "reason"),
    [
        ("sensor-7", lambda: payload(), "unsigned"),
        (
            "sensor-7",
            lambda: sign(payload(), "sensor-7", b"another key of 32 bytes, wrong!!"),
            "bad_signature",
        ),
        (
            "valve",
            lambda: sign(payload(), "valve", KEY.encode()),
            "bad_signature",
        ),  # valve's key differs
        ("sensor-8", lambda: sign(payload(), "sensor-8", KEY.encode()), "bad_signature"),  # no key
        ("valve", lambda: sign(payload(), "sensor-7", KEY.encode()), "device_mismatch"),
        (
            "sensor-7",
            lambda: sign(payload(), "sensor-7", KEY.encode()).replace(b"0.5", b"9.5"),
            "bad_signature",
        ),
    ],
    ids=["unsigned", "wrong-key", "another-devices-key", "no-key", "other-device", "tampered"],
)
def test_a_payload_the_keys_refuse(sender: str, message, reason: str) -> None:
    with pytest.raises(SignatureError) as refused:
        unwrap(message(), sender, keys())
    assert refused.value.reason == reason
    assert refused.value.reason in UNTRUSTED_REASONS
    assert KEY not in str(refused.value) and KEY[::-1] not in str(refused.value)


@given(st.binary(max_size=300), st.sampled_from(["sensor-7", "valve", "sensor-8"]))
def test_any_bytes_either_pass_or_are_refused_with_a_reason(data: bytes, sender: str) -> None:
    try:
        assert unwrap(data, sender, keys()) == data  # only a verified envelope changes bytes
    except SignatureError as error:
        assert error.reason in UNTRUSTED_REASONS


@given(st.binary(max_size=200))
def test_a_signature_covers_every_byte(data: bytes) -> None:
    body = payload()
    signed = sign(body, "sensor-7", KEY.encode())
    document = json.loads(signed)
    forged = dict(document, body=document["body"] + data.decode("latin-1"))
    if forged["body"] == document["body"]:
        return
    with pytest.raises(SignatureError):
        unwrap(json.dumps(forged).encode(), "sensor-7", keys())


def test_keys_are_never_shown() -> None:
    shown = repr(keys()) + str(keys().devices)
    assert "sensor-7" in shown and KEY not in shown and KEY[::-1] not in shown
    config = load_config(environ={"CBO_DEVICE_KEYS": f"valve {KEY}"})
    assert KEY not in repr(config) and KEY not in str(config.model_dump())


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("sensor-7", "need 'DEVICE_ID KEY'"),
        (f"sensor-7 {KEY} extra", "need 'DEVICE_ID KEY'"),
        ("sensor-7 short", "shorter than 16 bytes"),
        (f"a/b {KEY}", "invalid device id"),
        (f"s {KEY}; s {KEY}", "a second key for 's'"),
    ],
)
def test_bad_key_entries_name_the_entry_not_the_key(text: str, problem: str) -> None:
    with pytest.raises(KeyFileError, match="entry") as raised:
        DeviceKeys.parse(text, "keys.txt")
    assert problem in str(raised.value) and KEY not in str(raised.value)
    assert "short" not in str(raised.value).split("shorter")[0]  # the key text is not echoed


def test_the_agent_reads_keys_from_a_file_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"sensor-7 {KEY}\n")
    config = load_config(
        environ={"CBO_DEVICE_KEYS_FILE": str(path), "CBO_DEVICE_KEYS": f"valve {KEY}"}
    )
    assert config.load_device_keys().devices == ["sensor-7", "valve"]
    both = load_config(
        environ={"CBO_DEVICE_KEYS_FILE": str(path), "CBO_DEVICE_KEYS": f"sensor-7 {KEY}"}
    )
    with pytest.raises(ConfigError, match="keys in two places"):
        both.load_device_keys()
    with pytest.raises(ConfigError, match="No such file"):
        load_config(environ={"CBO_DEVICE_KEYS_FILE": str(tmp_path / "none")}).load_device_keys()


def test_run_with_a_bad_key_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("valve tooshort\n")
    result = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", str(ROOT / "examples" / "dropwave.yaml"),
         "--device-keys-file", str(keys_file), "--store", str(tmp_path / "s.sqlite")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "shorter than 16 bytes" in line and "tooshort" not in line


def test_the_protocol_document_lists_every_trust_reason() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    reasons = [*UNTRUSTED_REASONS, "oracle_above_optimum", "oracle_optimum_changed"]
    assert all(f"| `{reason}` |" in text for reason in reasons)
    for overspend in ("applied_after_rejection", "readings_after_rejection"):
        assert f"`{overspend}`" in text
