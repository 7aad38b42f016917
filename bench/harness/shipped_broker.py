"""The shipped Mosquitto configuration, as benchmarks run it on loopback.

Benchmarks measure the product as shipped (docs/design.md): the broker behaves as
`deploy/mosquitto/mosquitto.conf` says — its queue and in-flight limits, its persistence and
when it saves (`autosave_on_changes` and `autosave_interval`, Mosquitto's defaults where the
file is silent). Only what ties that file to the compose stack is replaced: the listener (a free
port on 127.0.0.1), logging, the password file and ACL (the benchmark's clients are anonymous),
and the persistence directory (a temporary one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from connectors.mosquitto import MosquittoOptions

__all__ = ["SHIPPED_CONF", "ShippedBroker", "shipped_broker"]

SHIPPED_CONF = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "mosquitto.conf"
# Settings that change how the broker moves messages; everything else in the file is about
# where it listens, who may connect, and what it logs.
_BEHAVIOUR = (
    "max_inflight_messages",
    "max_inflight_bytes",
    "max_queued_messages",
    "max_queued_bytes",
    "message_size_limit",
    "max_packet_size",
    "upgrade_outgoing_qos",
    "queue_qos0_messages",
    "set_tcp_nodelay",
    "autosave_on_changes",
    "autosave_interval",
)
MOSQUITTO_DEFAULT_QUEUE = 1000  # max_queued_messages when the file does not set it
MOSQUITTO_DEFAULT_INFLIGHT = 20
MOSQUITTO_DEFAULT_AUTOSAVE = 1800  # autosave_interval when the file does not set it


@dataclass(frozen=True)
class ShippedBroker:
    """What the shipped file sets, and the harness options that reproduce it."""

    path: Path
    settings: dict[str, str]
    persistence: bool

    @property
    def max_queued_messages(self) -> int:
        """Messages queued per session (0: no limit)."""
        return int(self.settings.get("max_queued_messages", MOSQUITTO_DEFAULT_QUEUE))

    @property
    def max_inflight_messages(self) -> int:
        return int(self.settings.get("max_inflight_messages", MOSQUITTO_DEFAULT_INFLIGHT))

    @property
    def autosave_interval(self) -> int:
        """Seconds between saves, or changes with ``autosave_on_changes true``."""
        return int(self.settings.get("autosave_interval", MOSQUITTO_DEFAULT_AUTOSAVE))

    def options(self, workdir: Path) -> MosquittoOptions:
        lines = tuple(
            f"{key} {value}" for key, value in self.settings.items() if key != "autosave_interval"
        )
        persist = workdir / "mosquitto-data" if self.persistence else None
        # The file's autosave_interval, not the harness's own (1, which tests want): the
        # benchmark's broker saves as often as the shipped one does.
        return MosquittoOptions(
            persistence_dir=persist, autosave_interval=self.autosave_interval, extra_lines=lines
        )

    def describe(self) -> str:
        """One line for tables and JSON: the limits that matter, as set or defaulted."""
        return (
            f"{self.path.name}: max_inflight_messages {self.max_inflight_messages}, "
            f"max_queued_messages {self.max_queued_messages}, "
            f"persistence {'on' if self.persistence else 'off'}"
            + (
                f", autosave_on_changes {self.settings['autosave_on_changes']}"
                if "autosave_on_changes" in self.settings
                else ""
            )
            + (f", autosave_interval {self.autosave_interval}" if self.persistence else "")
        )


def shipped_broker(path: Path = SHIPPED_CONF) -> ShippedBroker:
    """Read the shipped configuration's behaviour settings.

    Raises:
        FileNotFoundError: naming the file (the benchmarks run from a repository checkout).
    """
    if not path.is_file():
        raise FileNotFoundError(f"the shipped Mosquitto configuration {path} does not exist")
    settings: dict[str, str] = {}
    persistence = False
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, value = line.partition(" ")
        if key in _BEHAVIOUR:
            settings[key] = value.strip()
        elif key == "persistence":
            persistence = value.strip().lower() == "true"
    return ShippedBroker(path, settings, persistence)
