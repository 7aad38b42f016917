"""The one place where logging is configured.

structlog renders JSON lines when stderr is not a terminal (a container, CI, a pipe) and readable,
coloured key=value lines when it is. Modules only call `structlog.get_logger(__name__)` and bind
experiment and round once (`log = log.bind(experiment=..., round=...)`, as `LiveRound.log`); the
runtime binds the experiment around each driver (`bound_contextvars`), merged into every event
here.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]


class _CurrentStderr:
    """Whatever `sys.stderr` is at the time of writing (test runners and daemons swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info", fmt: LogFormat = "auto") -> None:
    """Configure structlog (and the standard library's logging) for the process.

    Args:
        level: minimum level ("debug", "info", "warning", "error").
        fmt: "json", "console", or "auto" (console on a terminal, JSON otherwise).
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    exceptions = [structlog.processors.format_exc_info] if use_json else []
    structlog.configure(
        processors=[*shared, *exceptions, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )
    # Libraries that log through the standard library (aiomqtt, amqtt) end up on stderr too.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr, force=True)
