"""Service configuration: defaults < YAML config file < environment variables < command-line flags.

Everything about *where* the agent runs lives here (broker, metrics port, store, identity);
everything about *what* it optimizes lives in the experiment specs.

Environment variables (all optional):

| variable | setting |
|---|---|
| CBO_AGENT_ID | agent_id |
| CBO_BROKER_URL | broker.url (mqtt://user:pass@host:1883, mqtts://... for TLS, HOST:PORT) |
| CBO_BROKER_USERNAME / CBO_BROKER_PASSWORD | broker credentials |
| CBO_BROKER_CA_FILE | broker.ca_file (CA bundle for TLS) |
| CBO_BROKER_PROTOCOL | broker.protocol (auto, 5, 3.1.1) |
| CBO_BROKER_CONNECT_TIMEOUT_S | broker.connect_timeout_s (give up without a broker after this) |
| CBO_TOPIC_PREFIX | topic_prefix |
| CBO_METRICS_HOST / CBO_METRICS_PORT | metrics.host / metrics.port |
| CBO_STORE_PATH | store.path (a path or sqlite:///path; postgresql://user@host/db for fleets) |
| CBO_LOG_LEVEL / CBO_LOG_FORMAT | log.level / log.format |
| CBO_DEVICE | device (cpu, cuda, cuda:1, ...: where the GPs live) |
| CBO_RESERVE_MB | reserve_mb (factor memory reserved up front, per process) |
| CBO_KEEP_SERVING | keep_serving (true/false: stay up once every experiment has finished) |
| CBO_DEVICE_KEYS_FILE | device_keys_file (per-device HMAC keys, `DEVICE_ID KEY` per line) |
| CBO_DEVICE_KEYS | device_keys (the same entries, `;`-separated, for a secret in the environment) |

README.md's configuration table lists every setting, variable and flag (tests/test_readme.py
checks that it stays complete).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import quote, unquote

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from connectors.mqtt import BrokerConfig
from connectors.signing import DeviceKeys, KeyFileError
from connectors.store.errors import StoreError
from connectors.store.location import SqliteLocation, parse_store_location
from core.plain_errors import plain_problems


class ConfigError(ValueError):
    """The configuration file, an environment variable or a flag is invalid."""


# ---------------------------------------------------------------------- broker addresses
BROKER_FORMS = "mqtt://HOST[:PORT], mqtts://HOST[:PORT] (TLS), tcp://HOST[:PORT] or HOST:PORT"
_SCHEMES = {"mqtt": (False, 1883), "tcp": (False, 1883), "mqtts": (True, 8883)}
_HOST_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")


@dataclass(frozen=True)
class BrokerAddress:
    """Where a broker listens, as one of the forms every command accepts (`BROKER_FORMS`).

    Attributes:
        host: a host name, an IPv4 address or an IPv6 address (without brackets).
        port: 1 to 65535.
        tls: mqtts:// (TLS); the others are plain TCP.
        username, password: from `user:password@` in a URL, percent-decoded.
    """

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None

    @property
    def url(self) -> str:
        """The canonical URL without credentials (for logs and messages)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self.tls else 'mqtt'}://{host}:{self.port}"

    @property
    def url_with_credentials(self) -> str:
        """The canonical URL with `user:password@` (percent-encoded) when there are any."""
        if self.username is None:
            return self.url
        userinfo = quote(self.username, safe="")
        if self.password is not None:
            userinfo += ":" + quote(self.password, safe="")
        scheme, rest = self.url.split("://", 1)
        return f"{scheme}://{userinfo}@{rest}"

    def broker_config(self, **overrides: Any) -> BrokerConfig:
        """A `BrokerConfig` for this address; `overrides` set the other fields (or credentials)."""
        fields: dict[str, Any] = {"host": self.host, "port": self.port, "tls": self.tls}
        if self.username is not None:
            fields["username"] = self.username
        if self.password is not None:
            fields["password"] = self.password
        return BrokerConfig(**(fields | overrides))


def parse_broker_address(text: str) -> BrokerAddress:
    """Read a broker address in any of `BROKER_FORMS` (the one parser of every command).

    `mqtt://` and `tcp://` default to port 1883, `mqtts://` to 8883; `HOST:PORT` is plain MQTT
    (a bare HOST means port 1883). A URL may carry `user:password@` (percent-encoded).

    Raises:
        ConfigError: one line, `'TEXT': what is wrong`, for the caller to prefix with where the
            address came from (`--broker`, `broker.url`).
    """
    given = text.strip()
    if not given:
        raise ConfigError(f"no broker address given (accepted: {BROKER_FORMS})")
    scheme, sep, rest = given.partition("://")
    if not sep:
        scheme, rest = "", given
    elif scheme.lower() not in _SCHEMES:
        raise ConfigError(
            f"{text!r}: {scheme}:// is not a broker protocol (accepted: {BROKER_FORMS})"
        )
    tls, default_port = _SCHEMES.get(scheme.lower(), (False, 1883))
    rest = rest.removesuffix("/")
    if any(mark in rest for mark in "/?#"):
        raise ConfigError(f"{text!r}: no path, query or fragment expected")
    userinfo, at, hostport = rest.rpartition("@")
    if at and not sep:
        raise ConfigError(f"{text!r}: credentials need a URL (mqtt://USER:PASSWORD@HOST)")
    host, port = _split_host_port(text, hostport, default_port)
    username = password = None
    if at:
        name, colon, secret = userinfo.partition(":")
        username = unquote(name)
        password = unquote(secret) if colon else None
    return BrokerAddress(host, port, tls, username, password)


def _split_host_port(text: str, hostport: str, default_port: int) -> tuple[str, int]:
    if hostport.startswith("["):  # [IPv6]:port
        host, bracket, tail = hostport[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ConfigError(f"{text!r}: an IPv6 address goes in brackets, [::1]:1883")
        port_text = tail[1:] if tail else None
        _check_ip(text, host, version=6)
    else:
        host, colon, port_text = hostport.rpartition(":")
        if not colon:
            host, port_text = hostport, None
        if ":" in host:
            raise ConfigError(f"{text!r}: an IPv6 address goes in brackets, [::1]:1883")
        if not _HOST_NAME.match(host):
            raise ConfigError(f"{text!r}: {host!r} is not a host name or address")
    if port_text is None:
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{text!r}: port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)


def _check_ip(text: str, host: str, version: int) -> None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{text!r}: {host!r} is not an IPv{version} address") from None
    if address.version != version:
        raise ConfigError(f"{text!r}: {host!r} is not an IPv{version} address")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BrokerSection(_Section):
    url: str = Field(
        default="mqtt://127.0.0.1:1883",
        description=f"where the broker listens: {BROKER_FORMS}",
    )
    username: str | None = None
    password: SecretStr | None = None
    # A file holding the password (its first line): keeps it off the command line, where `ps`
    # shows it, and out of the environment of every child process.
    password_file: str | None = None
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
    # Messages the broker may send the agent before it acknowledges them (MQTT v5 Receive
    # Maximum; over 3.1.1 the broker's max_inflight_messages): what a flood can make the agent
    # hold at once. Large enough for the group commit (runtime.BATCH_LIMIT) to fill.
    receive_maximum: int = Field(default=1000, ge=1, le=65535)
    # A broker that never answers keeps a service waiting (it reconnects with backoff, which is
    # right for a broker that restarts); at a terminal or in a job, giving up after a while and
    # saying so is more useful. None: wait forever.
    connect_timeout_s: float | None = Field(default=None, gt=0)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        try:
            parse_broker_address(url)
        except ConfigError as error:
            raise ValueError(str(error)) from None
        return url

    @model_validator(mode="after")
    def _read_password_file(self) -> Self:
        if self.password_file is None:
            return self
        if self.password is not None:
            raise ValueError("set broker.password or broker.password_file, not both")
        self.password = SecretStr(read_password_file(self.password_file))
        return self

    @property
    def address(self) -> BrokerAddress:
        return parse_broker_address(self.url)

    def to_broker_config(self, client_id: str) -> BrokerConfig:
        overrides: dict[str, Any] = {
            "client_id": client_id,
            "protocol": self.protocol,
            "keepalive": self.keepalive_s,
            "receive_maximum": self.receive_maximum,
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
        return self.address.broker_config(**overrides)


class MetricsSection(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=9464, ge=0, le=65535)


class StoreSection(_Section):
    # A path or sqlite:///path (SQLite), or postgresql://... (PostgreSQL, for fleets):
    # connectors/store/location.py parses it, here already, so a typo fails at startup.
    path: str = "cbo-agent.sqlite"

    @field_validator("path")
    @classmethod
    def _a_store(cls, value: str) -> str:
        try:
            parse_store_location(value)
        except StoreError as error:
            raise ValueError(str(error)) from None
        return value


class InputSection(_Section):
    """Limits on incoming messages (docs/reliability.md, "Floods")."""

    # Per sender (topic and the device a message names): valid messages beyond this rate are
    # rejected as `rate_limited` and acknowledged, so one device's flood cannot hold the
    # broker's queue for the agent. The burst lets a device's backlog (queued while the agent
    # was away) through at full speed.
    sender_rate_per_s: float = Field(default=100.0, gt=0)
    sender_burst: int = Field(default=10_000, ge=1)


class LogSection(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"

    @field_validator("level", mode="before")
    @classmethod
    def _lowercase(cls, level: Any) -> Any:
        return level.lower() if isinstance(level, str) else level


DEFAULT_AGENT_ID = "cbo-agent"


class AgentConfig(_Section):
    """Where and as whom the agent runs."""

    agent_id: str = Field(default=DEFAULT_AGENT_ID, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    topic_prefix: str = "cbo"
    broker: BrokerSection = BrokerSection()
    metrics: MetricsSection = MetricsSection()
    store: StoreSection = StoreSection()
    log: LogSection = LogSection()
    input: InputSection = InputSection()
    device: str = "cpu"
    # The most the node GPs' factors of this process reserve when their experiments start
    # (`agent.experiment.reserve_share`): rows up to `schedule.max_rounds` then append without
    # a reallocation. A small container lowers it; 0 reserves nothing (every buffer grows as
    # it fills, a spare made beside the learning taking most of each growth).
    reserve_mb: int = Field(default=256, ge=0, le=1_048_576)
    # A service (compose, Kubernetes) restarts a process that exits, so a finished experiment
    # would be replayed from the store, finish and exit again, forever. Keeping the process up
    # (metrics, health and the broker session served, feedback still stored) ends that loop;
    # off by default so that `cbo-agent run` in a script or benchmark returns when done.
    keep_serving: bool = False
    # Per-device HMAC keys (connectors/signing.py, docs/protocol.md): a device with a key must
    # sign its messages. For brokers that cannot restrict each device to its own topics.
    device_keys_file: str | None = None
    device_keys: SecretStr | None = None

    @field_validator("device")
    @classmethod
    def _a_device(cls, value: str) -> str:
        # The check `NetworkModel` makes, at load: `cuda` on a machine without one is a
        # configuration error (one line, exit 2), not a traceback when the first model is built.
        from core.devices import resolve_device  # torch: only when a device is configured
        from core.errors import DeviceError

        try:
            resolve_device(value)
        except DeviceError as error:
            raise ValueError(str(error)) from None
        return value

    def load_device_keys(self) -> DeviceKeys:
        """The device keys of `device_keys_file` and `device_keys` (empty: none configured).

        Raises:
            ConfigError: an unreadable file or a bad entry, in one line that shows no key.
        """
        sources = []
        try:
            if self.device_keys_file is not None:
                try:
                    text = Path(self.device_keys_file).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as error:
                    reason = getattr(error, "strerror", None) or type(error).__name__
                    raise ConfigError(
                        f"device_keys_file {self.device_keys_file}: {reason}"
                    ) from None
                sources.append(DeviceKeys.parse(text, f"device_keys_file {self.device_keys_file}"))
            if self.device_keys is not None:
                secret = self.device_keys.get_secret_value()
                sources.append(DeviceKeys.parse(secret, "device_keys (CBO_DEVICE_KEYS)"))
            return DeviceKeys().merged(sources)
        except KeyFileError as error:
            raise ConfigError(str(error)) from None

    def client_id(self, experiments: Sequence[str]) -> str:
        """The MQTT client id, which names the broker's persistent session.

        A configured `agent_id` is used as it is: the operator has made it unique, and a
        restart under it resumes its session (what the broker queued meanwhile is delivered).
        The default id is shared by every agent nobody named, so two runs one after the other
        with different stores or experiments would share one session, and the second would be
        handed (and acknowledge) what was queued for the first. Without a configured id the
        client id is therefore `cbo-agent-` + a digest of the store (an SQLite file's absolute
        path, a PostgreSQL URL without its password) and the experiments' names: a restart on
        the same store with the same specs (crash recovery) finds its session again, any other
        run gets its own. 22 characters, within MQTT 3.1.1's guaranteed 23.
        """
        if "agent_id" in self.model_fields_set:
            return self.agent_id
        identity = "\0".join([_store_identity(self.store.path), *sorted(experiments)])
        return f"{self.agent_id}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


def read_password_file(path: str) -> str:
    """The password in `path`: its first line, without the line end. ValueError (one line,
    never the password) if it cannot be read or is empty."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        cause = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ValueError(f"password file {path}: {cause}") from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise ValueError(f"password file {path}: empty (the password is its first line)")
    return password


def _store_identity(target: str) -> str:
    """The store `target` names, one way however it is written: an SQLite file's absolute path
    (``agent.sqlite`` and ``sqlite:///abs/agent.sqlite`` alike), a PostgreSQL URL with its
    password masked (rotating it keeps the session)."""
    location = parse_store_location(target)
    if isinstance(location, SqliteLocation) and location.path != ":memory:":
        return str(Path(location.path).resolve())
    return location.display


_ENVIRONMENT = {
    "CBO_AGENT_ID": ("agent_id",),
    "CBO_BROKER_URL": ("broker", "url"),
    "CBO_BROKER_USERNAME": ("broker", "username"),
    "CBO_BROKER_PASSWORD": ("broker", "password"),
    "CBO_BROKER_PASSWORD_FILE": ("broker", "password_file"),
    "CBO_BROKER_CA_FILE": ("broker", "ca_file"),
    "CBO_BROKER_PROTOCOL": ("broker", "protocol"),
    "CBO_BROKER_CONNECT_TIMEOUT_S": ("broker", "connect_timeout_s"),
    "CBO_TOPIC_PREFIX": ("topic_prefix",),
    "CBO_METRICS_HOST": ("metrics", "host"),
    "CBO_METRICS_PORT": ("metrics", "port"),
    "CBO_STORE_PATH": ("store", "path"),
    "CBO_LOG_LEVEL": ("log", "level"),
    "CBO_LOG_FORMAT": ("log", "format"),
    "CBO_DEVICE": ("device",),
    "CBO_RESERVE_MB": ("reserve_mb",),
    "CBO_KEEP_SERVING": ("keep_serving",),
    "CBO_DEVICE_KEYS_FILE": ("device_keys_file",),
    "CBO_DEVICE_KEYS": ("device_keys",),
}


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
        raise ConfigError("; ".join(plain_problems(error, AgentConfig))) from None
