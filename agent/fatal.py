"""How a long-running command (`run`, `sim`, `demo`) ends on a fault it cannot go on from.

One structured event, `agent.fatal`, with a `reason` from a closed set, the cause in words
(`error`, `error_type`) and what the fault was about (the store, the port, the broker), then a
non-zero exit: no traceback on stderr (the traceback goes to the debug level only), so a
supervisor's log shows one line that says why the process stopped.

| reason | when | exit |
|---|---|---|
| `broker_unreachable` | no broker session within `broker.connect_timeout_s` | 1 |
| `store_read_only` | the store refuses writes (read-only file, file system or database) | 1 |
| `store_disk_full` | the store's disk is full | 1 |
| `store_failed` | any other store fault (cannot open, a database error) | 1 |
| `metrics_port_unavailable` | /metrics cannot listen (port in use, address not local) | 2 |
| `tls_options` | a CA, certificate or key file that cannot be read or used | 2 |
| `internal_error` | anything else (a bug: please report it with the debug log) | 1 |
"""

from __future__ import annotations

from typing import Any, Final

import structlog

from agent.runtime import BrokerUnavailable
from connectors.metrics import MetricsUnavailable
from connectors.mqtt import TlsOptionsError
from connectors.store import StoreError

log = structlog.get_logger(__name__)

CONFIGURATION_EXIT: Final = 2  # the operator must change something before a restart can work
FAULT_EXIT: Final = 1
_READ_ONLY: Final = ("readonly", "read-only", "read only")
_DISK_FULL: Final = ("disk is full", "no space left", "disk full", "diskfull")


def reason_of(error: BaseException) -> tuple[str, int, dict[str, Any]]:
    """The `agent.fatal` reason, the exit code and the fields that say what it was about."""
    if isinstance(error, BrokerUnavailable):
        fields = {"broker": error.url, "waited_s": error.waited_s, "detail": str(error)}
        return "broker_unreachable", FAULT_EXIT, fields
    if isinstance(error, StoreError):
        text = str(error).lower()
        if any(word in text for word in _DISK_FULL):
            return "store_disk_full", FAULT_EXIT, {}
        if any(word in text for word in _READ_ONLY):
            return "store_read_only", FAULT_EXIT, {}
        return "store_failed", FAULT_EXIT, {}
    if isinstance(error, MetricsUnavailable):
        return "metrics_port_unavailable", CONFIGURATION_EXIT, {"address": error.address}
    if isinstance(error, TlsOptionsError):
        return "tls_options", CONFIGURATION_EXIT, {}
    return "internal_error", FAULT_EXIT, {}


def report_fatal(command: str, error: BaseException) -> int:
    """Log `agent.fatal` for `error` and return the exit code."""
    reason, code, fields = reason_of(error)
    cause = error.error if isinstance(error, BrokerUnavailable) else str(error)
    log.error(
        "agent.fatal",
        command=command,
        reason=reason,
        error=cause,
        error_type=type(error).__name__,
        exit_code=code,
        **fields,
    )
    log.debug("agent.fatal_traceback", exc_info=error)
    return code
