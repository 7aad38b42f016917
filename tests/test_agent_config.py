"""Service configuration: defaults < file < environment < flags, with errors that say where."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.config import (
    AgentConfig,
    BrokerAddress,
    ConfigError,
    load_config,
    parse_broker_address,
)


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
        ("brokr: {}", "brokr: unknown key (did you mean 'broker'?)"),
        ("log: {level: verbose}", "log.level: 'verbose' is not one of 'debug', 'info'"),
        ("broker: {url: 'http://h:1883'}", "broker.url: 'http://h:1883': http:// is not a broker"),
        ("broker: {url: 'mqtt://h:99999'}", "port '99999' is not a number from 1 to 65535"),
        ("broker: {connect_timeout_s: 0}", "broker.connect_timeout_s: must be greater than 0"),
        ("- a list", "must be a mapping"),
        ("log: {format: xml}", "log.format"),
    ],
)
def test_bad_configuration_names_the_setting(tmp_path, text, message):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
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


def test_connect_timeout_from_environment_and_flag():
    assert load_config(environ={}).broker.connect_timeout_s is None  # a service waits forever
    environ = {"CBO_BROKER_CONNECT_TIMEOUT_S": "5"}
    assert load_config(environ=environ).broker.connect_timeout_s == 5.0
    flag = {("broker", "connect_timeout_s"): 2.5}
    assert load_config(overrides=flag, environ=environ).broker.connect_timeout_s == 2.5


def test_log_level_is_checked_and_case_blind():
    assert load_config(environ={"CBO_LOG_LEVEL": "DEBUG"}).log.level == "debug"


# ------------------------------------------------------------------ broker addresses
_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_HOSTS = st.one_of(
    st.lists(_LABEL, min_size=1, max_size=4).map(".".join),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
)
_SCHEMES = {"mqtt": (False, 1883), "tcp": (False, 1883), "mqtts": (True, 8883), "": (False, 1883)}


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@given(
    host=_HOSTS,
    port=st.one_of(st.none(), st.integers(1, 65535)),
    scheme=st.sampled_from(sorted(_SCHEMES)),
    user=st.one_of(st.none(), st.text(min_size=1, max_size=8)),
    password=st.one_of(st.none(), st.text(max_size=8)),
)
def test_every_accepted_form_reads_the_same_address(host, port, scheme, user, password):
    """mqtt://, mqtts://, tcp:// and HOST:PORT, with or without a port and credentials."""
    text = _bracketed(host) + ("" if port is None else f":{port}")
    credentials = user is not None and scheme != ""
    if credentials:
        secret = "" if password is None else ":" + quote(password, safe="")
        text = f"{quote(user, safe='')}{secret}@{text}"
    if scheme:
        text = f"{scheme}://{text}"
    address = parse_broker_address(text)
    tls, default_port = _SCHEMES[scheme]
    expected_host = str(ipaddress.ip_address(host)) if ":" in host else host
    assert (address.host, address.port, address.tls) == (
        expected_host,
        default_port if port is None else port,
        tls,
    )
    if credentials:
        assert (address.username, address.password) == (user, password)
    again = parse_broker_address(address.url_with_credentials)
    assert again == address  # the canonical URL reads back as the same address
    config = address.broker_config(client_id="c")
    assert (config.host, config.port, config.tls) == (address.host, address.port, address.tls)


@given(st.text(max_size=40))
def test_any_text_is_an_address_or_one_line_naming_the_mistake(text):
    try:
        address = parse_broker_address(text)
    except ConfigError as error:
        assert "\n" not in str(error) and str(error)
    else:
        assert isinstance(address, BrokerAddress) and 1 <= address.port <= 65535


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http://broker:1883", "http:// is not a broker protocol (accepted: mqtt://"),
        ("mqtt://broker:99999", "port '99999' is not a number from 1 to 65535"),
        ("broker:0", "port '0' is not a number from 1 to 65535"),
        ("broker:", "port '' is not a number"),
        ("mqtt://broker:1883/topic", "no path, query or fragment expected"),
        ("::1:1883", "an IPv6 address goes in brackets"),
        ("user@broker:1883", "credentials need a URL"),
        ("", "no broker address given"),
    ],
)
def test_broker_mistakes_are_named(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_broker_address(text)


def test_the_default_client_id_is_one_per_store_and_experiments(tmp_path):
    """Two runs nobody named do not share a persistent session; a restart finds its own."""

    def client_id(store: Path | str, experiments: list[str], **settings: object) -> str:
        config = AgentConfig.model_validate({"store": {"path": str(store)}, **settings})
        return config.client_id(experiments)

    first = client_id(tmp_path / "a.sqlite", ["alpine2"])
    assert first == client_id(tmp_path / "a.sqlite", ["alpine2"])  # restart: same session
    assert first.startswith("cbo-agent-") and len(first) <= 23  # MQTT 3.1.1's guaranteed length
    assert first != client_id(tmp_path / "b.sqlite", ["alpine2"])
    assert first == client_id(f"sqlite://{tmp_path / 'a.sqlite'}", ["alpine2"])  # one file
    fleet = client_id("postgresql://cbo:old@db/fleet", ["alpine2"])
    assert fleet == client_id("postgresql://cbo:new@db/fleet", ["alpine2"])  # password rotated
    assert fleet != client_id("postgresql://cbo@db/other", ["alpine2"])
    assert first != client_id(tmp_path / "a.sqlite", ["dropwave"])
    assert client_id(tmp_path / "a.sqlite", ["x"], agent_id="line-3") == "line-3"  # configured
    assert load_config(environ={"CBO_AGENT_ID": "cbo-agent"}).client_id(["x"]) == "cbo-agent"


def test_the_broker_password_comes_from_a_file(tmp_path):
    from agent.config import ConfigError, load_config

    secret = tmp_path / "pw"
    secret.write_text("s3cret:with spaces\nignored second line\n")
    config = load_config(environ={"CBO_BROKER_PASSWORD_FILE": str(secret)})
    assert config.broker.password is not None
    assert config.broker.password.get_secret_value() == "s3cret:with spaces"
    assert "s3cret" not in repr(config)
    with pytest.raises(ConfigError, match="not both"):
        load_config(environ={"CBO_BROKER_PASSWORD_FILE": str(secret), "CBO_BROKER_PASSWORD": "x"})
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=f"password file {missing}: No such file"):
        load_config(overrides={("broker", "password_file"): str(missing)}, environ={})
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_config(environ={"CBO_BROKER_PASSWORD_FILE": str(tmp_path / "empty")})
