"""deploy/k8s/fleet (three `cbo-agent serve` replicas, PostgreSQL, a PodDisruptionBudget) and
deploy/docker-compose.fleet.yml, checked without a cluster or an engine: the Kubernetes API
schemas (strict), and the wiring between the files and what the agent reads."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from agent.cli import build_parser
from agent.config import load_config
from tests.test_deploy import (
    DEPLOY,
    DIGEST_PINNED,
    config_environment_variables,
    kubernetes_versions,
    load_yaml_all,
    run,
    validate_k8s,
)

FLEET = DEPLOY / "k8s" / "fleet"
COMPOSE_FLEET = DEPLOY / "docker-compose.fleet.yml"


def objects() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(FLEET.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for document in load_yaml_all(path):
                found[document["kind"]] = document
    return found


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((FLEET / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {
        p.name for p in FLEET.glob("*.yaml") if p.name != "kustomization.yaml"
    }


@pytest.mark.parametrize("version", kubernetes_versions())
def test_fleet_manifests_are_valid_for_the_kubernetes_api(version: str) -> None:
    for path in sorted(FLEET.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in load_yaml_all(path):
            try:
                validate_k8s(document, version)
            except jsonschema.ValidationError as error:
                where = "/".join(map(str, error.absolute_path))
                message = f"{path.name} {document['kind']}: {where}: {error.message}"
                raise AssertionError(message) from None


def test_three_replicas_of_serve_on_the_postgres_secret_with_a_disruption_budget() -> None:
    found = objects()
    deployment, pdb, secret = found["Deployment"], found["PodDisruptionBudget"], found["Secret"]
    assert deployment["spec"]["replicas"] == 3
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["cbo-agent", "serve"]
    args = build_parser().parse_args(["serve", *container["args"]])  # flags the CLI knows
    assert args.capacity >= 1 and args.lease_ttl > 0
    env = {item["name"]: item for item in container["env"]}
    assert {k for k in env if k.startswith("CBO_")} <= config_environment_variables()
    assert env["CBO_AGENT_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    store_ref = env["CBO_STORE_PATH"]["valueFrom"]["secretKeyRef"]
    assert store_ref["name"] == secret["metadata"]["name"]
    url = secret["stringData"][store_ref["key"]]
    config = load_config(environ={"CBO_STORE_PATH": url})
    assert config.store.path.startswith("postgresql://")
    service = found["Service"]
    assert service["metadata"]["name"] in url and str(service["spec"]["ports"][0]["port"]) in url
    postgres = found["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    assert postgres["envFrom"][0]["secretRef"]["name"] == secret["metadata"]["name"]
    user, password, db = (secret["stringData"][k] for k in ("POSTGRES_USER", "POSTGRES_PASSWORD",
                                                           "POSTGRES_DB"))  # fmt: skip
    assert f"//{user}:{password}@" in url and url.endswith(f"/{db}")
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_compose_fleet_adds_postgres_and_two_replicas() -> None:
    compose = yaml.safe_load(COMPOSE_FLEET.read_text())
    services = compose["services"]
    assert "postgres" in services
    replicas = [s for s in services.values() if s.get("command", [None])[0:1] == ["serve"]]
    assert len(replicas) == 2
    ids = set()
    for replica in replicas:
        environment = replica["environment"]
        assert {k for k in environment if k.startswith("CBO_")} <= config_environment_variables()
        config = load_config(environ={k: str(v) for k, v in environment.items()})
        assert config.store.path.startswith("postgresql://postgres") or "@postgres:" in (
            config.store.path
        )
        ids.add(config.agent_id)
        assert replica["entrypoint"] == ["cbo-agent"]
    assert len(ids) == 2  # each replica its own lease owner and MQTT client id


@pytest.mark.integration
def test_kustomize_builds_the_fleet() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its built-in kustomize renders deploy/k8s/fleet)")
    result = run([kubectl, "kustomize", str(FLEET)])
    assert result.returncode == 0, result.stderr
    for document in yaml.safe_load_all(result.stdout):
        validate_k8s(document, kubernetes_versions()[-1])


def test_paths_exist() -> None:
    assert Path(FLEET / "kustomization.yaml").is_file() and COMPOSE_FLEET.is_file()


def test_the_fleet_postgres_image_is_pinned_by_digest_in_compose_and_kubernetes() -> None:
    """Third-party images are pinned by digest (the base compose file's rule), and compose and
    the StatefulSet run the same PostgreSQL."""
    compose = yaml.safe_load(COMPOSE_FLEET.read_text())
    for name, service in compose["services"].items():
        image = service["image"]
        if not image.startswith("cbo-agent:"):  # ours is built from this repository
            assert DIGEST_PINNED.fullmatch(image), f"{name}: {image} is not pinned by digest"
    statefulset = objects()["StatefulSet"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == compose["services"]["postgres"]["image"]
