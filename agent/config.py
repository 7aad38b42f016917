"""Service configuration: defaults < YAML config file < environment variables < command-line flags.

Everything about *where* the agent runs lives here (broker, metrics port, store, identity);
everything about *what* it optimizes lives in the experiment specs.

Environment variables (all optional):

| variable | setting |
|---|---|
| CBO_AGENT_ID | agent_id |
| CBO_BROKER_URL | broker.url (mqtt://user:pass@host:1883, mqtts://... for TLS) |
| CBO_BROKER_USERNAME / CBO_BROKER_PASSWORD | broker credentials |
| CBO_BROKER_CA_FILE | broker.ca_file (CA bundle for TLS) |
| CBO_BROKER_PROTOCOL | broker.protocol (auto, 5, 3.1.1) |
| CBO_TOPIC_PREFIX | topic_prefix |
| CBO_METRICS_HOST / CBO_METRICS_PORT | metrics.host / metrics.port |
| CBO_STORE_PATH | store.path |
| CBO_LOG_LEVEL / CBO_LOG_FORMAT | log.level / log.format |
| CBO_DEVICE | device (cpu, cuda, cuda:1, ...: where the GPs live) |
| CBO_KEEP_SERVING | keep_serving (true/false: stay up once every experiment has finished) |

README.md's configuration table lists every setting, variable and flag (tests/test_readme.py
checks that it stays complete).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from connectors.mqtt import BrokerConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BrokerSection(_Section):
    url: str = "mqtt://127.0.0.1:1883"
    username: str | None = None
    password: SecretStr | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    protocol: Literal["auto", "5", "3.1.1"] = "auto"
    keepalive_s: int = Field(default=30, ge=5)
    # A persistent session (clean start off, this expiry) makes the broker queue QoS 1 input
    # while the agent is away; with messages acknowledged only once stored, nothing accepted
    # is lost across a crash.
    persistent_session: bool = True
    session_expiry_s: int = Field(default=3600, ge=0)

    def to_broker_config(self, client_id: str) -> BrokerConfig:
        overrides: dict[str, Any] = {
            "client_id": client_id,
            "protocol": self.protocol,
            "keepalive": self.keepalive_s,
        }
        if self.persistent_session:
            overrides |= {
                "clean_start": False,
                "session_expiry_s": self.session_expiry_s,
                "manual_ack": True,
            }
        for name in ("username", "ca_file", "cert_file", "key_file"):
            if getattr(self, name) is not None:
                overrides[name] = getattr(self, name)
        if self.password is not None:
            overrides["password"] = self.password.get_secret_value()
        return BrokerConfig.from_url(self.url, **overrides)


class MetricsSection(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=9464, ge=0, le=65535)


class StoreSection(_Section):
    path: str = "cbo-agent.sqlite"


class LogSection(_Section):
    level: str = "info"
    format: Literal["auto", "json", "console"] = "auto"


class AgentConfig(_Section):
    """Where and as whom the agent runs."""

    agent_id: str = Field(default="cbo-agent", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    topic_prefix: str = "cbo"
    broker: BrokerSection = BrokerSection()
    metrics: MetricsSection = MetricsSection()
    store: StoreSection = StoreSection()
    log: LogSection = LogSection()
    device: str = "cpu"
    # A service (compose, Kubernetes) restarts a process that exits, so a finished experiment
    # would be replayed from the store, finish and exit again, forever. Keeping the process up
    # (metrics, health and the broker session served, feedback still stored) ends that loop;
    # off by default so that `cbo-agent run` in a script or benchmark returns when done.
    keep_serving: bool = False


_ENVIRONMENT = {
    "CBO_AGENT_ID": ("agent_id",),
    "CBO_BROKER_URL": ("broker", "url"),
    "CBO_BROKER_USERNAME": ("broker", "username"),
    "CBO_BROKER_PASSWORD": ("broker", "password"),
    "CBO_BROKER_CA_FILE": ("broker", "ca_file"),
    "CBO_BROKER_PROTOCOL": ("broker", "protocol"),
    "CBO_TOPIC_PREFIX": ("topic_prefix",),
    "CBO_METRICS_HOST": ("metrics", "host"),
    "CBO_METRICS_PORT": ("metrics", "port"),
    "CBO_STORE_PATH": ("store", "path"),
    "CBO_LOG_LEVEL": ("log", "level"),
    "CBO_LOG_FORMAT": ("log", "format"),
    "CBO_DEVICE": ("device",),
    "CBO_KEEP_SERVING": ("keep_serving",),
}


class ConfigError(ValueError):
    """The configuration file, an environment variable or a flag is invalid."""


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[tuple[str, ...], Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> AgentConfig:
    """Merge the layers into an AgentConfig.

    Args:
        path: optional YAML config file.
        overrides: settings from command-line flags, keyed by path (e.g. ("metrics", "port")).
        environ: the environment (default: os.environ).
    """
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f"{path}: {error}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the configuration must be a mapping")
        tree = loaded
    environ = os.environ if environ is None else environ
    for variable, key in _ENVIRONMENT.items():
        if environ.get(variable):
            _set(tree, key, environ[variable])
    for key, value in (overrides or {}).items():
        if value is not None:
            _set(tree, key, value)
    try:
        return AgentConfig.model_validate(tree)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise ConfigError(problems) from None
