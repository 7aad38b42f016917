"""Service configuration: defaults < file < environment < flags, with errors that say where."""

from __future__ import annotations

import pytest

from agent.config import ConfigError, load_config


def test_defaults_are_a_local_broker_and_loopback_metrics():
    config = load_config(environ={})
    assert config.broker.url == "mqtt://127.0.0.1:1883"
    assert config.metrics.host == "127.0.0.1" and config.metrics.port == 9464


def test_layers_override_in_order(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(
        "agent_id: from-file\nmetrics: {port: 9000}\nbroker: {url: 'mqtt://file-host:1884'}\n"
    )
    environ = {"CBO_METRICS_PORT": "9100", "CBO_BROKER_URL": "mqtts://env-host:8883"}
    config = load_config(path, {("metrics", "port"): 9200}, environ)
    assert config.agent_id == "from-file"  # only the file sets it
    assert config.broker.url == "mqtts://env-host:8883"  # environment beats file
    assert config.metrics.port == 9200  # flags beat everything


def test_secrets_stay_secret_and_reach_the_broker_config():
    environ = {"CBO_BROKER_USERNAME": "agent", "CBO_BROKER_PASSWORD": "s3cret"}
    config = load_config(environ=environ)
    assert "s3cret" not in repr(config)
    broker = config.broker.to_broker_config(client_id="agent-1")
    assert broker.username == "agent" and broker.password.get_secret_value() == "s3cret"
    assert broker.client_id == "agent-1"


def test_tls_url_sets_tls():
    config = load_config(environ={"CBO_BROKER_URL": "mqtts://broker.example:8883"})
    broker = config.broker.to_broker_config(client_id="a")
    assert broker.tls and broker.port == 8883


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("metrics: {port: 70000}", "metrics.port"),
        ("brokr: {}", "brokr: Extra inputs are not permitted"),
        ("- a list", "must be a mapping"),
        ("log: {format: xml}", "log.format"),
    ],
)
def test_bad_configuration_names_the_setting(tmp_path, text, message):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(path, environ={})


@pytest.mark.parametrize(
    ("environ", "flag", "expected"),
    [
        ({}, None, False),  # the default: `run` exits 0 once every experiment has finished
        ({"CBO_KEEP_SERVING": "true"}, None, True),
        ({"CBO_KEEP_SERVING": "1"}, None, True),
        ({"CBO_KEEP_SERVING": "false"}, None, False),
        ({"CBO_KEEP_SERVING": "true"}, False, False),  # --no-keep-serving beats the image's env
        ({}, True, True),
    ],
)
def test_keep_serving_from_environment_and_flag(environ, flag, expected):
    config = load_config(overrides={("keep_serving",): flag}, environ=environ)
    assert config.keep_serving is expected


def test_keep_serving_must_be_a_boolean():
    with pytest.raises(ConfigError, match="keep_serving"):
        load_config(environ={"CBO_KEEP_SERVING": "sometimes"})
