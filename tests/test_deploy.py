"""The deployment files (Dockerfile, compose, Prometheus, Grafana, Kubernetes) checked for real.

No Docker engine, cluster or Grafana needed, so: the files parse; the compose file is valid
against the compose specification's JSON schema and the Kubernetes manifests against the
Kubernetes API's (offline: the schemas ship in packages of the test extra); they reference each
other consistently (ports, paths, users, the environment variables agent/config.py reads, the
metric names connectors/metrics.py exports); promtool checks the Prometheus config and rules and
runs their unit tests; the install script the Dockerfile runs is syntax-checked and dry-run. The
end-to-end run against a real Prometheus is in test_deploy_e2e.py; the image itself runs in
test_image.py (`make test-image`).
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml

from agent import config as agent_config
from connectors.metrics import AgentMetrics
from connectors.mqtt import BrokerConfig
from core.spec import load_spec
from sim.registry import environment_names

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOCKERFILE = ROOT / "Dockerfile"
INSTALL = DEPLOY / "install.sh"
COMPOSE = DEPLOY / "docker-compose.yml"
PROMETHEUS_DIR = DEPLOY / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERT_TESTS = PROMETHEUS_DIR / "alerts.test.yml"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "cbo-agent.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "cbo-agent.yml"
MOSQUITTO_DIR = DEPLOY / "mosquitto"
MAKE_PASSWD = MOSQUITTO_DIR / "make-passwd.sh"
K8S = DEPLOY / "k8s"
ENV_EXAMPLE = DEPLOY / ".env.example"
# The manifests must be valid for the oldest Kubernetes release we support and the newest one
# kubernetes-validate has the schemas of.
KUBERNETES_OLDEST = "1.28"
# The Prometheus Operator's kinds (not in the Kubernetes API): schemas of the fields we use.
CRD_SCHEMAS = ROOT / "tests" / "schemas"
DIGEST_PINNED = re.compile(r"[\w.\-/]+(?::[\w.\-]+)?@sha256:[0-9a-f]{64}")

AGENT_JOB = "cbo-agent"
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
# Grafana's own variables a query may use, and what an end-to-end test substitutes for them.
GRAFANA_GLOBALS = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "5m"}
# Metrics not from connectors/metrics.py that the dashboard and rules may use: Prometheus's own.
PROMETHEUS_SERIES = {"up"}

_PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "inf", "nan", "atan2",
}  # fmt: skip


# ---------------------------------------------------------------------------- helpers


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_targets() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of the dashboard."""
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title / refId, PromQL) of every dashboard query."""
    return [(f"{p['title']} / {t['refId']}", t["expr"]) for p, t in dashboard_targets()]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def alert_expressions() -> list[tuple[str, str]]:
    return [(rule.get("alert") or rule["record"], rule["expr"]) for rule in alert_rules()]


def concrete_promql(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced, as Grafana would send it."""
    expr = expr.replace("$experiment", ".*")
    for variable, value in GRAFANA_GLOBALS.items():
        expr = expr.replace(variable, value)
    if "$" in expr:
        raise AssertionError(f"unresolved Grafana variable in {expr!r}")
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (a tokenizer, enough for our queries)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+\S+", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group()
        follows = text[match.end() :].lstrip()
        if word.lower() in _PROMQL_WORDS or follows.startswith("("):
            continue  # a keyword or a function
        names.add(word)
    return names


def exported_series() -> tuple[set[str], set[str]]:
    """(sample names, family names) connectors/metrics.py exports, from a real registry."""
    metrics = AgentMetrics()
    metrics.round_completed("e")
    metrics.set_regret("e", cumulative=1.0, simple=0.5)
    metrics.set_regret_upper_estimate("e", 2.0)
    metrics.set_reward("e", last=1.0, best=1.0)
    metrics.set_recommended_value("e", 0.5)
    metrics.set_budget("e", spent=1.0, remaining=9.0)
    metrics.set_observations("e", "Y", 3)
    metrics.observe_fit("e", "Y", False)
    metrics.observe_change("e", "Y")
    metrics.observe_gp_update("e", 0.001)
    metrics.observe_decision("e", 0.01)
    metrics.observe_policy("e", 0.01)
    metrics.proposal_rejected("e", "budget_per_round")
    metrics.device_overspend("e", "ack_after_expiry")
    metrics.untrusted("e", "ack", "not_actuator")
    metrics.policy_failed("e", "mcbo", "RuntimeError")
    metrics.set_finished("e", False)
    metrics.observe_round_wait("e", 0.1)
    metrics.message("e", "reading", "accepted")
    samples, families = set(), set()
    for family in metrics.registry.collect():
        families.add(family.name)
        samples.update(sample.name for sample in family.samples)
    return samples, families


def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ${VAR:-default} and ${VAR}, from `env` (default: empty, the shipped defaults)."""

    def substitute(match: re.Match[str]) -> str:
        return (env or {}).get(match.group(1)) or match.group(2) or ""

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}", substitute, value)


def interpolate_all(node: Any, env: dict[str, str] | None = None) -> Any:
    """A parsed compose file with every string interpolated, as `docker compose config` sees it."""
    if isinstance(node, dict):
        return {key: interpolate_all(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate_all(value, env) for value in node]
    return interpolate(node, env) if isinstance(node, str) else node


def env_example() -> dict[str, str]:
    lines = ENV_EXAMPLE.read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines if "=" in line and not line.startswith("#")]
    return {key.strip(): value.strip() for key, value in pairs}


def compose_errors(document: dict[str, Any]) -> list[str]:
    """What the compose specification's JSON schema (as check-jsonschema ships it) rejects."""
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendored / "compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return sorted(
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(document)
    )


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def service_environment(name: str) -> dict[str, str]:
    environment = service(name).get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {key: interpolate(str(value)) for key, value in environment.items()}


def mounts(name: str) -> dict[str, str]:
    """Container path -> source (a repository path for bind mounts, else the volume name)."""
    result = {}
    for entry in service(name).get("volumes", []):
        source, target, *_ = entry.split(":")
        if source.startswith("."):
            source = str((DEPLOY / source).resolve())
        result[target] = source
    return result


def published_ports(name: str) -> dict[int, str]:
    """Container port -> the host side of the mapping."""
    ports = {}
    for entry in service(name).get("ports", []):
        *host, container = interpolate(entry).split(":")
        ports[int(container)] = ":".join(host)
    return ports


def mosquitto_conf() -> dict[str, str]:
    settings = {}
    for line in (MOSQUITTO_DIR / "mosquitto.conf").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            settings[key] = value
    return settings


def acl_users() -> dict[str, list[tuple[str, str]]]:
    """User -> [(access, topic)] from the compose stack's ACL file; "%u" holds the patterns,
    which apply to every user with %u standing for the user name."""
    users: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in (MOSQUITTO_DIR / "acl").read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "user":
            current = words[1]
            users[current] = []
        elif words[0] == "pattern":
            access, topic = (words[1], words[2]) if len(words) == 3 else ("readwrite", words[1])
            users.setdefault("%u", []).append((access, topic))
        elif words[0] == "topic":
            assert current is not None, f"ACL topic line before any user: {line!r}"
            access, topic = (words[1], words[2]) if len(words) == 3 else ("readwrite", words[1])
            users[current].append((access, topic))
    return users


def passwd_users() -> list[str]:
    """The users make-passwd.sh writes by name (devices come from the environment)."""
    return re.findall(r'mosquitto_passwd -b "\$tmp" ([a-z]+) ', MAKE_PASSWD.read_text())


def dockerfile() -> str:
    return DOCKERFILE.read_text()


def dockerfile_env() -> dict[str, str]:
    """The final stage's ENV settings."""
    final_stage = dockerfile().rsplit("\nFROM ", 1)[1]
    env: dict[str, str] = {}
    for block in re.findall(r"^ENV ((?:.*\\\n)*.*)$", final_stage, re.MULTILINE):
        for item in shlex.split(block.replace("\\\n", " ")):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def dockerfile_json_instruction(name: str) -> list[str]:
    match = re.search(rf"^{name} (\[.*\])$", dockerfile(), re.MULTILINE)
    assert match, f"no exec-form {name} in the Dockerfile"
    return json.loads(match.group(1))


def healthcheck_command() -> list[str]:
    text = dockerfile().replace("\\\n", " ")
    match = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])$", text, re.MULTILINE)
    assert match, "no exec-form HEALTHCHECK CMD in the Dockerfile"
    return json.loads(match.group(1))


def k8s_objects() -> dict[tuple[str, str], dict[str, Any]]:
    objects = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in load_yaml_all(path):
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def k8s(kind: str) -> dict[str, Any]:
    found = [obj for (k, _), obj in k8s_objects().items() if k == kind]
    assert len(found) == 1, f"expected one {kind} in deploy/k8s, found {len(found)}"
    return found[0]


def kubernetes_versions() -> list[str]:
    """major.minor of the releases the manifests are checked against."""
    newest = ".".join(kubernetes_validate.latest_version().split(".")[:2])
    return [KUBERNETES_OLDEST, newest]


def validate_k8s(document: dict[str, Any], version: str) -> None:
    """Raise jsonschema.ValidationError where `document` breaks the API schema of its kind in
    that Kubernetes release: strict, so an unknown (misspelt) field fails too."""
    group = document["apiVersion"].split("/")[0]
    if group != "monitoring.coreos.com":
        kubernetes_validate.validate(document, version, strict=True)
        return
    path = CRD_SCHEMAS / f"{document['kind'].lower()}-monitoring-v1.json"
    assert path.is_file(), f"no schema for {document['kind']} in {CRD_SCHEMAS}"
    release = f"v{version}.0-local-strict"  # kubernetes-validate's schemas of that release
    schemas = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / release
    definitions = referencing.Resource.from_contents(
        json.loads((schemas / "_definitions.json").read_text())
    )
    schema = json.loads(path.read_text())
    registry = definitions @ referencing.Registry()
    jsonschema.Draft202012Validator(schema, registry=registry).validate(document)


def config_environment_variables() -> set[str]:
    return set(agent_config._ENVIRONMENT)


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (Debian: .ci/run installs the prometheus package)")
    return path


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, **kwargs)


# ---------------------------------------------------------------------------- Prometheus


@pytest.mark.integration
def test_promtool_accepts_the_config() -> None:
    result = run([require("promtool"), "check", "config", str(PROMETHEUS_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_promtool_accepts_the_rules() -> None:
    result = run([require("promtool"), "check", "rules", str(ALERTS)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


@pytest.mark.integration
def test_alert_rules_pass_their_unit_tests() -> None:
    """Synthetic series: each alert fires when it should and stays quiet when it should not."""
    result = run([require("promtool"), "test", "rules", ALERT_TESTS.name], cwd=PROMETHEUS_DIR)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_cover_the_issue_and_are_documented() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert {
        "CboAgentDown",
        "CboNoReadings",
        "CboBudgetNearlySpent",
        "CboRegretGrowingLinearly",
    } <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert "for" in rule, f"{name}: no `for`, a single bad scrape would page"
    tested = {
        case["alertname"]
        for test in load_yaml(ALERT_TESTS)["tests"]
        for case in test.get("alert_rule_test", [])
    }
    assert tested == set(rules), "every alert has a promtool unit test"


def test_rules_select_the_scrape_job_and_exported_metrics() -> None:
    jobs = [job["job_name"] for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]]
    assert AGENT_JOB in jobs
    samples, _ = exported_series()
    for name, expr in alert_expressions():
        assert f'job="{AGENT_JOB}"' in expr, f"{name} must select the agent's job"
        unknown = metric_names(expr) - samples - PROMETHEUS_SERIES
        assert not unknown, f"{name} uses metrics connectors/metrics.py does not export: {unknown}"


def test_prometheus_config_scrapes_the_compose_agent() -> None:
    config = load_yaml(PROMETHEUS_CONFIG)
    job = next(j for j in config["scrape_configs"] if j["job_name"] == AGENT_JOB)
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (target,) = [t for group in job["static_configs"] for t in group["targets"]]
    host, port = target.split(":")
    assert host in compose()["services"], f"scrape target {host} is not a compose service"
    metrics_port = int(service_environment(host)["CBO_METRICS_PORT"])
    assert int(port) == metrics_port
    assert metrics_port in published_ports(host)
    # rule files are mounted beside the config, where relative rule_files resolve
    prometheus_mounts = mounts("prometheus")
    config_target = next(t for t, s in prometheus_mounts.items() if s == str(PROMETHEUS_CONFIG))
    for rule_file in config["rule_files"]:
        in_container = str(Path(config_target).parent / rule_file)
        assert prometheus_mounts.get(in_container) == str(PROMETHEUS_DIR / rule_file)
    command = " ".join(service("prometheus")["command"])
    assert f"--config.file={config_target}" in command


# ---------------------------------------------------------------------------- Grafana


def test_dashboard_panels_have_datasource_and_targets() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and board["panels"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        title = panel.get("title")
        assert title, f"panel {panel['id']} has no title"
        assert panel.get("datasource") == DATASOURCE_REF, title
        targets = panel.get("targets")
        assert targets, f"{title}: no targets"
        assert len({t["refId"] for t in targets}) == len(targets), f"{title}: duplicate refIds"
        for target in targets:
            assert target.get("datasource") == DATASOURCE_REF, title
            assert target.get("expr", "").strip(), f"{title}/{target['refId']}: empty query"
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, title
    cells = [
        (x, y, panel["title"])
        for panel in board["panels"]
        for x in range(panel["gridPos"]["x"], panel["gridPos"]["x"] + panel["gridPos"]["w"])
        for y in range(panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"])
    ]
    assert len({(x, y) for x, y, _ in cells}) == len(cells), "panels overlap"


def test_dashboard_variables_are_defined() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    provisioned = load_yaml(DATASOURCES)["datasources"][0]
    assert variables["datasource"]["current"]["value"] == provisioned["uid"]
    assert variables["experiment"]["datasource"] == DATASOURCE_REF
    samples, _ = exported_series()
    selector = re.fullmatch(
        r"label_values\((.+), experiment\)", variables["experiment"]["definition"]
    )
    assert selector and metric_names(selector.group(1)) <= samples
    used = set()
    for _, expr in dashboard_expressions():
        used |= set(re.findall(r"\$\{?(\w+)", expr))
    grafana_globals = {name.lstrip("$") for name in GRAFANA_GLOBALS}
    assert used - grafana_globals <= set(variables), "every query variable is defined"
    for _, expr in dashboard_expressions():
        concrete_promql(expr)  # raises on anything left unresolved


def test_dashboard_shows_every_exported_series_and_nothing_else() -> None:
    samples, families = exported_series()
    referenced = set()
    for where, expr in dashboard_expressions():
        names = metric_names(expr)
        unknown = names - samples - PROMETHEUS_SERIES
        assert not unknown, f"{where}: metrics connectors/metrics.py does not export: {unknown}"
        referenced |= names
    shown = {name for name in families if any(s.startswith(name) for s in referenced)}
    assert shown == families, f"not on the dashboard: {families - shown}"


def test_dashboard_has_the_panels_of_the_issue() -> None:
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dashboard()["panels"]}

    def panel_with(*needles: str) -> str:
        for title, expr in exprs.items():
            if all(needle in expr for needle in needles):
                return title
        raise AssertionError(f"no panel queries all of {needles}")

    panel_with("cbo_cumulative_regret", "cbo_regret_model_estimate")
    panel_with("cbo_simple_regret")
    panel_with("cbo_reward_last", "cbo_reward_best")
    panel_with("cbo_budget_spent", "cbo_budget_remaining")
    panel_with("max by (experiment, node) (cbo_observations")
    for histogram in ("cbo_gp_update_seconds", "cbo_decision_seconds"):
        panel_with(
            f"histogram_quantile(0.5, sum by (experiment, le) (rate({histogram}_bucket",
            f"histogram_quantile(0.95, sum by (experiment, le) (rate({histogram}_bucket",
        )
    assert "kind, outcome" in exprs[panel_with("cbo_messages_total", "kind, outcome)")]
    panel_with("cbo_messages_total", 'outcome="rejected"', "reason")


def test_grafana_provisioning_matches_compose() -> None:
    provisioned = load_yaml(DATASOURCES)["datasources"]
    (prometheus,) = [d for d in provisioned if d["type"] == "prometheus"]
    assert prometheus["isDefault"] is True
    url = re.fullmatch(r"http://([\w.-]+):(\d+)", prometheus["url"])
    assert url and url.group(1) in compose()["services"]
    assert int(url.group(2)) in published_ports(url.group(1))
    scrape = load_yaml(PROMETHEUS_CONFIG)["global"]["scrape_interval"]
    assert prometheus["jsonData"]["timeInterval"] == scrape  # $__rate_interval depends on it

    grafana_mounts = mounts("grafana")
    assert grafana_mounts["/etc/grafana/provisioning"] == str(GRAFANA / "provisioning")
    (provider,) = load_yaml(DASHBOARD_PROVIDERS)["providers"]
    dashboards_dir = provider["options"]["path"]
    assert grafana_mounts[dashboards_dir] == str(DASHBOARD.parent)
    home = service_environment("grafana")["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent == Path(dashboards_dir)
    assert (DASHBOARD.parent / Path(home).name).is_file()


# ---------------------------------------------------------------------------- compose


def test_compose_has_the_stack() -> None:
    services = compose()["services"]
    assert {"mosquitto", "agent", "sim", "prometheus", "grafana"} <= set(services)
    declared = set(compose().get("volumes") or {})
    for name, spec in services.items():
        for entry in spec.get("volumes", []):
            source = entry.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
        for dependency in spec.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        for host in published_ports(name).values():
            assert host.startswith("127.0.0.1:"), f"{name}: published beyond loopback by default"


def test_compose_file_is_valid_for_the_compose_specification() -> None:
    """`docker compose config`'s check without an engine: the interpolated file against the
    compose specification's schema (with the shipped defaults and with .env.example's values)."""
    for env in ({}, env_example()):
        assert compose_errors(interpolate_all(compose(), env)) == []
    broken = interpolate_all(compose())
    broken["services"]["agent"]["enviroment"] = broken["services"]["agent"].pop("environment")
    broken["services"]["sim"]["restart"] = ["always"]
    (typo, wrong_type) = compose_errors(broken)  # the check sees what it is for
    assert "'enviroment' was unexpected" in typo and wrong_type.startswith("services/sim/restart")


def test_compose_images_are_built_here_or_pinned_by_digest() -> None:
    for name, spec in compose()["services"].items():
        if "build" in spec:  # ours: built from this repository's Dockerfile
            assert (DEPLOY / spec["build"]["context"] / spec["build"]["dockerfile"]).is_file()
        else:
            assert DIGEST_PINNED.fullmatch(spec["image"]), f"{name}: {spec['image']} not pinned"


def test_compose_ports_stay_on_loopback_with_the_example_settings() -> None:
    example = env_example()
    assert example["CBO_BIND"] == "127.0.0.1"
    for name, spec in compose()["services"].items():
        for entry in spec.get("ports", []):
            assert interpolate(entry, example).startswith("127.0.0.1:"), f"{name}: {entry}"


def test_compose_agent_environment_is_what_the_agent_reads() -> None:
    environment = service_environment("agent")
    unknown = {k for k in environment if k.startswith("CBO_")} - config_environment_variables()
    assert not unknown, f"agent/config.py reads no {unknown}"
    config = agent_config.load_config(environ=environment)
    assert config.metrics.host == "0.0.0.0"  # reachable from the Prometheus container
    broker = config.broker.to_broker_config(client_id=config.agent_id)
    assert broker.host in compose()["services"]
    assert broker.port == int(mosquitto_conf()["listener"])
    assert broker.username in acl_users()
    # the store sits on the agent's volume
    agent_mounts = mounts("agent")
    assert Path(config.store.path).parent.as_posix() in agent_mounts
    assert agent_mounts[str(Path(config.store.path).parent)] in compose()["volumes"]
    # the image's defaults agree with compose
    image_env = dockerfile_env()
    for key in ("CBO_METRICS_HOST", "CBO_METRICS_PORT", "CBO_STORE_PATH"):
        assert image_env[key] == environment[key], key


def test_restarted_agents_keep_serving_once_finished() -> None:
    """compose and Kubernetes restart an agent that exits, so a finished experiment would be
    replayed and finish again, forever: everywhere we ship, the agent stays up instead."""
    assert service("agent")["restart"] != "no"
    assert agent_config.load_config(environ=service_environment("agent")).keep_serving
    (container,) = k8s("Deployment")["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert agent_config.load_config(environ=env).keep_serving
    assert agent_config.load_config(environ=dockerfile_env()).keep_serving  # plain `docker run`


def test_the_image_and_the_tests_install_the_parquet_extra() -> None:
    """`cbo-agent export --format parquet` needs pyarrow: wherever we ship, and where we test."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]  # fmt: skip
    assert any(r.startswith("pyarrow") for r in extras["parquet"])
    assert any(r.startswith("pyarrow") for r in extras["test"])
    text = dockerfile()
    chosen = re.search(r"^ARG CBO_EXTRAS=(\S+)$", text, re.MULTILINE)
    assert chosen and "parquet" in chosen.group(1).split(",")
    (install,) = [r for r in re.findall(r"^RUN (?:.*\\\n)*.*$", text, re.MULTILINE)
                  if "deploy/install.sh /opt/venv" in r]  # fmt: skip
    assert 'CBO_EXTRAS="${CBO_EXTRAS}"' in install


def test_compose_agent_and_simulator_serve_the_same_experiment() -> None:
    agent = service("agent")
    specs_dir = next(t for t, s in mounts("agent").items() if s == str(ROOT / "examples"))
    (spec_path,) = agent["command"]
    assert Path(spec_path).parent == Path(specs_dir)
    spec = load_spec(ROOT / "examples" / Path(spec_path).name)

    sim = service("sim")
    assert sim["entrypoint"] == ["cbo-agent", "sim"]
    command = [interpolate(part) for part in sim["command"]]
    assert command[0] in environment_names()
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    assert flags["--experiment"] == spec.name
    broker = BrokerConfig.from_url(flags["--broker"])
    assert broker.host in compose()["services"]
    # the simulator logs in as its device id, the spec's device, which the ACL's patterns grant
    username = sim["environment"]["CBO_BROKER_USERNAME"]  # the login: from the environment
    assert broker.username is None and broker.password is None  # nothing secret in `ps`
    assert username == flags["--device-id"] == spec.actuator_id
    assert username == service("mosquitto-init")["environment"]["MQTT_DEVICE_USER"]
    assert username not in acl_users() and "%u" in acl_users()
    assert sim["healthcheck"] == {"disable": True}


def test_compose_mosquitto_files_and_users_line_up() -> None:
    conf = mosquitto_conf()
    assert conf["allow_anonymous"] == "false"
    assert conf["persistence"] == "true"
    broker_mounts = mounts("mosquitto")
    assert broker_mounts["/mosquitto/config/mosquitto.conf"] == str(
        MOSQUITTO_DIR / "mosquitto.conf"
    )
    assert broker_mounts[conf["acl_file"]] == str(MOSQUITTO_DIR / "acl")
    password_dir = str(Path(conf["password_file"]).parent)
    assert broker_mounts[password_dir] in compose()["volumes"]
    assert broker_mounts[conf["persistence_location"].rstrip("/")] in compose()["volumes"]

    init = service("mosquitto-init")
    assert init["entrypoint"][-1] == conf["password_file"]
    assert mounts("mosquitto-init")[password_dir] == broker_mounts[password_dir]
    assert mounts("mosquitto-init")[init["entrypoint"][1]] == str(MAKE_PASSWD)
    assert service("mosquitto")["depends_on"]["mosquitto-init"] == {
        "condition": "service_completed_successfully"
    }
    assert set(passwd_users()) == set(acl_users()) - {"%u"}
    # the agent and the init container take the agent's password from the same variable
    raw_agent = service("agent")["environment"]["CBO_BROKER_PASSWORD"]
    assert raw_agent == init["environment"]["MQTT_AGENT_PASSWORD"]
    # ... and the simulator its device's, from the environment: no password on a command line
    sim = service("sim")
    assert sim["environment"]["CBO_BROKER_PASSWORD"] == init["environment"]["MQTT_DEVICE_PASSWORD"]
    assert sim["environment"]["CBO_BROKER_USERNAME"] == init["environment"]["MQTT_DEVICE_USER"]
    assert not [p for p in sim["command"] if "@" in p], sim["command"]


def test_acl_grants_what_the_protocol_needs() -> None:
    users = acl_users()
    assert ("read", "cbo/+/+/reading") in users["agent"]
    assert ("write", "cbo/+/+/action") in users["agent"]
    assert ("write", "cbo/+/deadletter") in users["agent"]
    assert ("write", "cbo/+/recommendation") in users["agent"]  # retained, multi-fidelity
    assert ("readwrite", "cbo/agents/+/status") in users["agent"]
    # a device speaks only under its own id (the patterns' %u is the login's user name)
    assert set(users["%u"]) == {
        ("read", "cbo/+/%u/action"),
        *{("write", f"cbo/+/%u/{kind}") for kind in ("ack", "reading", "oracle", "deadletter")},
    }
    assert all(access == "read" for access, _ in users["monitor"])
    assert ("read", "cbo/control/request") in users["agent"]
    assert ("write", "cbo/control/reply/+") in users["agent"]
    assert ("write", "cbo/control/request") in users["operator"]
    assert ("read", "cbo/control/reply/+") in users["operator"]


# ---------------------------------------------------------------------------- Dockerfile


def test_dockerfile_runs_the_service_as_documented() -> None:
    text = dockerfile()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.MULTILINE)
    assert dockerfile_json_instruction("ENTRYPOINT") == ["cbo-agent", "run"]
    assert dockerfile_json_instruction("CMD")[0].startswith("/specs/")
    user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user and user[-1].split(":")[0] not in {"root", "0"}
    env = dockerfile_env()
    assert env["CBO_METRICS_HOST"] == "0.0.0.0"
    assert re.search(rf"^EXPOSE {env['CBO_METRICS_PORT']}$", text, re.MULTILINE)
    assert Path(env["CBO_STORE_PATH"]).parent.as_posix() in text.split("VOLUME", 1)[1]
    assert set(env) & config_environment_variables() == {
        k for k in env if k.startswith("CBO_") and k != "CBO_EXAMPLES_DIR"
    }
    check = healthcheck_command()
    assert check[:2] == ["python", "-c"] and "/healthz" in check[2]
    assert "CBO_METRICS_PORT" in check[2] and "curl" not in check[2]


def test_dockerfile_installs_with_the_install_script() -> None:
    text = dockerfile()
    assert len(re.findall(r"^FROM ", text, re.MULTILINE)) == 1, "one stage: no venv copied"
    runs = re.findall(r"^RUN (?:.*\\\n)*.*$", text, re.MULTILINE)
    installs = [r for r in runs if "deploy/install.sh" in r]
    assert len(installs) == 3
    assert "--torch-only" in installs[0] and "--deps-only" in installs[1]
    assert "--torch-only" not in installs[2] and "--deps-only" not in installs[2]
    # each layer is trimmed in the RUN that installed it; the last compiles what is imported
    assert all("deploy/image/slim-venv.sh" in r and "CBO_COMPILE=0" in r for r in installs)
    assert "--compile-imports" in installs[2]
    assert not any("pip install" in r for r in runs), "pip belongs in deploy/install.sh"
    assert "COPY deploy/install.sh deploy/install.sh" in text
    # the requirements' layer sees pyproject.toml and no code: it stays cached as the code changes
    before_deps = text.split(installs[1], 1)[0]
    copied = re.findall(r"^COPY (\S+)", before_deps, re.MULTILINE)
    assert copied == ["deploy/install.sh", "deploy/image/slim-venv.sh", "pyproject.toml"]
    # torch: the same default pin as the script; a build argument picks the wheel index
    pin = re.search(r'torch_version="\$\{TORCH_VERSION:-([^}]+)\}"', INSTALL.read_text())
    assert pin and f"ARG TORCH_VERSION={pin.group(1)}" in text
    assert re.search(r"^ARG TORCH_INDEX_URL=\S*/cpu$", text, re.MULTILINE)
    # every package setuptools installs is copied into the build stage and not dockerignored
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {p.rstrip("*") for p in find["packages"]["find"]["include"]}
    ignored = (ROOT / ".dockerignore").read_text().split()
    for package in packages:
        assert f"COPY {package} {package}" in text, package
        assert package not in ignored, package
    assert "!deploy/install.sh" in ignored and "!deploy/image/slim-venv.sh" in ignored


def test_ci_runs_the_install_script() -> None:
    """The Makefile (which .ci/run calls) builds .venv with the image's install script."""
    makefile = (ROOT / "Makefile").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "deploy/install.sh" in makefile or "deploy/install.sh" in ci


def test_ci_runs_the_image_smoke_test_after_the_suite() -> None:
    """.ci/run builds and runs the image (make test-image) after make test, which leaves the
    `image` tests out; the make target tells them which images to run."""
    makefile = (ROOT / "Makefile").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line.startswith("make ")]
    assert commands == ["make test", "make test-image"]
    assert '-m "not slow and not image"' in makefile
    test_image = makefile.split("\ntest-image:", 1)[1].split("\n\n", 1)[0]
    assert "image" in test_image.splitlines()[0]  # builds first
    assert "CBO_TEST_IMAGE=$(IMAGE)" in test_image and "-m image" in test_image
    for package in ("podman", "runc", "debootstrap"):
        assert f"need+=({package})" in ci


@pytest.mark.integration
@pytest.mark.parametrize(
    "script",
    [INSTALL, MAKE_PASSWD, *sorted((DEPLOY / "image").glob("*.sh")), ROOT / ".ci" / "run"],
    ids=lambda path: path.name,
)
def test_shell_scripts_parse(script: Path) -> None:
    shell = "bash" if script.read_text().startswith("#!/usr/bin/env bash") else "sh"
    result = run([require(shell), "-n", str(script)])
    assert result.returncode == 0, result.stderr
    assert os.access(script, os.X_OK), f"{script} is not executable"


@pytest.mark.integration
def test_install_script_installs_torch_first_then_the_project(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    base = {"PATH": os.environ["PATH"], "CBO_DRY_RUN": "1"}

    def dry_run(*args: str, **env: str) -> list[str]:
        result = run(["bash", str(INSTALL), *args, str(venv)], env=base | env)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    steps = dry_run(CBO_EXTRAS="test", CBO_EDITABLE="1")
    installs = [s for s in steps if " pip install " in s]
    assert "torch==2.13.0" in installs[1] and "--index-url" not in installs[1]
    assert installs[2].endswith(f"-e {ROOT}[test]")
    assert "torch.__version__" in steps[-1]  # the pin survived the project's requirements

    image = dry_run(TORCH_INDEX_URL="https://wheels.example/cpu", TORCH_VERSION="2.9.1")
    assert "--index-url https://wheels.example/cpu torch==2.9.1" in image[2]
    assert image[3].endswith(f"install --quiet {ROOT}")

    torch_only = dry_run("--torch-only")
    assert not any(str(ROOT) in step for step in torch_only)

    # the image's second layer: the requirements pyproject.toml declares, not the project
    deps = dry_run("--deps-only", CBO_EXTRAS="parquet", CBO_COMPILE="0")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["parquet"]
    *_, requirements = [s for s in deps if " pip install " in s]
    assert requirements.split("--no-compile ", 1)[1].split() == wanted
    assert all("--no-compile" in s for s in deps if " pip install " in s)
    assert not any(str(ROOT) in step for step in deps)


CUDA_INDEX = "https://download.pytorch.org/whl/cu128"


@pytest.mark.integration
def test_the_cuda_image_variant_is_the_same_recipe_with_a_cuda_index(tmp_path: Path) -> None:
    """`make image IMAGE=cbo-agent:cuda TORCH_INDEX_URL=<CUDA index>` reaches the build as a
    build argument the Dockerfile declares and hands to deploy/install.sh, which installs the
    pinned torch from that index. Checked through the scripts' dry runs: nothing is built and
    no CUDA wheel is downloaded."""
    make = run(
        [
            require("make"),
            "-n",
            "--no-print-directory",  # under `make test` (MAKELEVEL 1) make names the directory
            "image",
            "IMAGE=cbo-agent:cuda",
            "MOSQUITTO_IMAGE=",
            f"TORCH_INDEX_URL={CUDA_INDEX}",
        ],
        cwd=ROOT,
    )
    assert make.returncode == 0, make.stderr
    recipe = shlex.split(make.stdout.replace("\\\n", " "))
    assert f"TORCH_INDEX_URL={CUDA_INDEX}" in recipe and "IMAGE=cbo-agent:cuda" in recipe
    assert recipe[-2:] == ["bash", "deploy/image/build.sh"]

    environment = {"PATH": os.environ["PATH"], "CBO_DRY_RUN": "1", "IMAGE": "cbo-agent:cuda"}
    built = {}
    for index in (CUDA_INDEX, None):  # the CUDA variant, then the default (CPU) image
        extra = {"TORCH_INDEX_URL": index} if index else {}
        result = run(
            ["bash", "deploy/image/build.sh"],
            cwd=ROOT,
            env=environment | {"ENGINE": "docker", **extra},
        )
        assert result.returncode == 0, result.stderr
        command = shlex.split(result.stdout.strip().splitlines()[-1])
        assert command[:2] == ["docker", "build"] and command[-3:] == ["-f", "Dockerfile", "."]
        pairs = [command[i + 1] for i, word in enumerate(command) if word == "--build-arg"]
        built[index] = dict(pair.split("=", 1) for pair in pairs)
        assert command[command.index("-t") + 1] == "cbo-agent:cuda"
    assert built[CUDA_INDEX] == {"TORCH_INDEX_URL": CUDA_INDEX}
    assert built[None] == {}  # the Dockerfile's default: PyTorch's CPU index
    declared = set(re.findall(r"^ARG (\w+)", dockerfile(), re.MULTILINE))
    assert set(built[CUDA_INDEX]) <= declared
    torch_layer = next(r for r in dockerfile().split("\nRUN ") if "--torch-only" in r)
    assert 'TORCH_INDEX_URL="${TORCH_INDEX_URL}"' in torch_layer

    steps = run(
        ["bash", str(INSTALL), "--torch-only", str(tmp_path / "venv")],
        env={"PATH": os.environ["PATH"], "CBO_DRY_RUN": "1", "TORCH_INDEX_URL": CUDA_INDEX},
    )
    assert steps.returncode == 0, steps.stderr
    pin = re.search(r'torch_version="\$\{TORCH_VERSION:-([^}]+)\}"', INSTALL.read_text())
    assert pin and f"--index-url {CUDA_INDEX} torch=={pin.group(1)}" in steps.stdout


@pytest.mark.integration
def test_make_passwd_writes_hashed_users(tmp_path: Path) -> None:
    if shutil.which("mosquitto_passwd") is None:
        pytest.skip("mosquitto_passwd is not installed (Debian: mosquitto)")
    passwd = tmp_path / "passwd"
    devices = tmp_path / "devices"
    devices.write_text("# more devices\nsensor-7 s7-secret\n\nvalve.2 v2-secret\n")
    env = {
        "PATH": os.environ["PATH"],
        "MQTT_AGENT_PASSWORD": "a-secret",
        "MQTT_DEVICE_USER": "sim-dropwave",
        "MQTT_DEVICE_PASSWORD": "d-secret",
        "MQTT_MONITOR_PASSWORD": "m-secret",
        "MQTT_DEVICES_FILE": str(devices),
        "MQTT_OPERATOR_PASSWORD": "o-secret",
    }
    result = run(["sh", str(MAKE_PASSWD), str(passwd)], env=env)
    assert result.returncode == 0, result.stderr
    lines = passwd.read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        *passwd_users(),
        "sim-dropwave",
        "sensor-7",
        "valve.2",
    ]
    assert "secret" not in passwd.read_text()
    assert passwd.stat().st_mode & 0o077 == 0
    missing = run(["sh", str(MAKE_PASSWD), str(tmp_path / "x")], env={"PATH": os.environ["PATH"]})
    assert missing.returncode != 0 and "MQTT_AGENT_PASSWORD" in missing.stderr
    # a device may not take another user's name (the ACL's patterns apply to every user), nor
    # one that is no topic level
    for bad in ("monitor", "a/b", "+"):
        refused = run(
            ["sh", str(MAKE_PASSWD), str(tmp_path / "y")], env=env | {"MQTT_DEVICE_USER": bad}
        )
        assert refused.returncode == 2 and bad in refused.stderr, bad
        assert not (tmp_path / "y").exists()


# ---------------------------------------------------------------------------- Kubernetes


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    kinds = {kind for kind, _ in k8s_objects()}
    assert {"Deployment", "ConfigMap", "Secret", "Service", "ServiceMonitor"} <= kinds
    assert {i["name"] for i in kustomization["images"]} == {k8s("Deployment")["spec"]["template"][
        "spec"]["containers"][0]["image"]}  # fmt: skip


def test_k8s_deployment_wires_specs_secret_store_and_probes() -> None:
    deployment = k8s("Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = pod["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    unknown = {k for k in env if k.startswith("CBO_")} - config_environment_variables()
    assert not unknown, f"agent/config.py reads no {unknown}"

    secret = k8s("Secret")
    (source,) = container["envFrom"]
    assert source["secretRef"]["name"] == secret["metadata"]["name"]
    assert set(secret["stringData"]) <= config_environment_variables()
    assert {"CBO_BROKER_USERNAME", "CBO_BROKER_PASSWORD"} <= set(secret["stringData"])
    config = agent_config.load_config(environ=env | secret["stringData"])
    assert config.metrics.host == "0.0.0.0"

    (port,) = container["ports"]
    assert port["containerPort"] == config.metrics.port
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                        ("readinessProbe", "/readyz")):  # fmt: skip
        assert container[probe]["httpGet"] == {"path": path, "port": port["name"]}, probe

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    store = mounted[str(Path(config.store.path).parent)]
    assert store["persistentVolumeClaim"]["claimName"] == k8s("PersistentVolumeClaim")[
        "metadata"]["name"]  # fmt: skip
    specs = k8s("ConfigMap")
    (specs_dir,) = [p for p, v in mounted.items() if "configMap" in v]
    assert mounted[specs_dir]["configMap"]["name"] == specs["metadata"]["name"]
    for arg in container["args"]:
        assert Path(arg).parent == Path(specs_dir) and Path(arg).name in specs["data"], arg

    security = pod["spec"]["securityContext"]
    uid = re.search(r"^ARG UID=(\d+)$", dockerfile(), re.MULTILINE)
    assert security["runAsNonRoot"] is True and str(security["runAsUser"]) == uid.group(1)
    if container["securityContext"].get("readOnlyRootFilesystem"):
        assert "/tmp" in mounted


def test_k8s_specs_are_valid(tmp_path: Path) -> None:
    for name, text in k8s("ConfigMap")["data"].items():
        path = tmp_path / name
        path.write_text(text)
        load_spec(path)  # raises SpecError naming the field


def test_k8s_service_and_monitor_select_the_agent() -> None:
    pod = k8s("Deployment")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    svc = k8s("Service")
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == container["ports"][0]["name"]
    assert port["port"] == container["ports"][0]["containerPort"]
    assert svc["spec"]["publishNotReadyAddresses"] is True

    monitor = k8s("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    # the job label is what the alert rules and the dashboard select on
    assert svc["metadata"]["labels"][monitor["spec"]["jobLabel"]] == AGENT_JOB


def test_k8s_prometheus_rule_is_the_alert_file() -> None:
    assert k8s("PrometheusRule")["spec"]["groups"] == load_yaml(ALERTS)["groups"]


@pytest.mark.parametrize("version", kubernetes_versions())
def test_k8s_manifests_are_valid_for_the_kubernetes_api(version: str) -> None:
    for (kind, name), document in k8s_objects().items():
        try:
            validate_k8s(document, version)
        except jsonschema.ValidationError as error:
            path = "/".join(map(str, error.absolute_path))
            message = f"{kind}/{name} on Kubernetes {version}: {path}: {error.message}"
            raise AssertionError(message) from None


def test_k8s_schema_check_sees_typos_and_wrong_types() -> None:
    """The check fails on what it is for: a misspelt field, a wrong type, a bad duration."""
    version = kubernetes_versions()[-1]

    def container(deployment: dict[str, Any]) -> dict[str, Any]:
        return deployment["spec"]["template"]["spec"]["containers"][0]

    def first_rule(rule: dict[str, Any]) -> dict[str, Any]:
        return rule["spec"]["groups"][0]["rules"][0]

    edits: list[tuple[str, Any]] = [
        ("Deployment", lambda d: container(d).update(imagePullPolcy="Always")),
        ("Deployment", lambda d: d["spec"].update(replicas="1")),
        ("Service", lambda d: d["spec"]["ports"][0].update(port="metrics")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(intervall="15s")),
        ("PrometheusRule", lambda d: first_rule(d).update({"for": "2 minutes"})),
    ]
    for kind, edit in edits:
        document = copy.deepcopy(k8s(kind))
        validate_k8s(document, version)
        edit(document)
        with pytest.raises(jsonschema.ValidationError):
            validate_k8s(document, version)


@pytest.mark.integration
def test_kustomize_builds() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its built-in kustomize renders deploy/k8s)")
    result = run([kubectl, "kustomize", str(K8S)])
    assert result.returncode == 0, result.stderr
    rendered = list(yaml.safe_load_all(result.stdout))
    assert {doc["kind"] for doc in rendered} >= {"Deployment", "ServiceMonitor"}
    assert all(doc["metadata"].get("namespace") == "cbo" for doc in rendered
               if doc["kind"] != "Namespace")  # fmt: skip
    for document in rendered:  # what `kubectl apply -k` would send
        validate_k8s(document, kubernetes_versions()[-1])


# ---------------------------------------------------------------------------- README


def test_readme_deploy_section_matches_the_files() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "## Deploy in five minutes" in readme
    section = readme.split("## Deploy in five minutes", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"CBO_[A-Z_]+", section)) == config_environment_variables()
    for path in set(re.findall(r"`(deploy/[\w./-]+)`", section)) - {"deploy/.env"}:
        assert (ROOT / path).exists(), path  # deploy/.env is the user's copy of .env.example
    assert f"job_name: {AGENT_JOB}" in section
    assert "docker compose -f deploy/docker-compose.yml up" in section
