"""`cbo-agent serve`: run as one replica of a fleet, taking experiments from the store.

Settings as for `run` (--config < CBO_* < flags), plus the replica's share of the work:
--capacity, --lease-ttl, --heartbeat. The store is the fleet's (PostgreSQL for replicas on several
machines; an SQLite file serves replicas on one machine). Experiments come from
`cbo-agent submit`, not from the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

__all__ = ["add_serve_command"]

SERVE_FLAG_SETTINGS: dict[str, tuple[str, ...]] = {
    "broker": ("broker", "url"),
    "metrics_port": ("metrics", "port"),
    "metrics_host": ("metrics", "host"),
    "store": ("store", "path"),
    "agent_id": ("agent_id",),
    "log_level": ("log", "level"),
    "log_format": ("log", "format"),
    "connect_timeout": ("broker", "connect_timeout_s"),
}


def add_serve_command(commands: argparse._SubParsersAction) -> None:
    from agent.cli import _add_log_flags, _positive_float, positive_int

    serve = commands.add_parser(
        "serve",
        help="one replica of a fleet: run the store's experiments it holds leases on",
        description="Takes submitted experiments (cbo-agent submit) from the store up to "
        "--capacity, through leases renewed every --heartbeat; another replica takes them over "
        "when this one stops renewing for --lease-ttl. Settings: --config FILE < CBO_* "
        "environment variables < these flags.",
    )
    serve.add_argument("--config", help="YAML configuration file (see agent/config.py)")
    serve.add_argument("--broker", help="the broker: mqtt://[USER:PASS@]HOST[:PORT], mqtts://")
    serve.add_argument(
        "--store",
        help="the fleet's store: postgresql://user@host:5432/database (replicas on several "
        "machines) or an SQLite path (replicas on one machine)",
    )
    serve.add_argument(
        "--agent-id", help="this replica's id: lease owner and MQTT client id (default HOST-PID)"
    )
    serve.add_argument(
        "--capacity", type=positive_int, default=100, help="most experiments owned at once (100)"
    )
    serve.add_argument(
        "--lease-ttl",
        type=_positive_float,
        default=15.0,
        metavar="SECONDS",
        help="a lease not renewed this long is taken over by another replica (15)",
    )
    serve.add_argument(
        "--heartbeat",
        type=_positive_float,
        metavar="SECONDS",
        help="how often leases are renewed and free experiments taken (a third of the TTL)",
    )
    serve.add_argument(
        "--connect-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="give up (exit 1) when no broker session starts within this long",
    )
    serve.add_argument("--metrics-port", type=int, help="port of /metrics, /healthz, /readyz")
    serve.add_argument("--metrics-host", help="address the metrics server binds (127.0.0.1)")
    _add_log_flags(serve, default=argparse.SUPPRESS)
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from agent.config import ConfigError, load_config
    from agent.fleet import FleetService, FleetSettings, default_replica_id
    from agent.logs import configure_logging
    from agent.runtime import BrokerUnavailable
    from agent.serve import _until_signalled
    from connectors.store import Store, StoreError

    overrides = {key: getattr(args, flag, None) for flag, key in SERVE_FLAG_SETTINGS.items()}
    try:
        config = load_config(args.config, overrides)
    except ConfigError as error:
        return _refuse(f"configuration: {error}")
    if "agent_id" not in config.model_fields_set:
        config = config.model_copy(update={"agent_id": default_replica_id()})
    try:
        settings = FleetSettings(args.capacity, args.lease_ttl, args.heartbeat)
    except ValueError as error:
        return _refuse(str(error))
    try:
        store = Store(config.store.path)
    except StoreError as error:
        return _refuse(f"cannot open store {config.store.path}: {error}")
    configure_logging(config.log.level, config.log.format)
    import structlog

    try:
        asyncio.run(_until_signalled(FleetService(config, settings, store=store).run()))
    except BrokerUnavailable as error:
        structlog.get_logger("agent.fleet").error(
            "agent.fatal", reason="broker_unreachable", broker=error.url, detail=str(error)
        )
        return 1
    except OSError as error:  # the metrics port
        return _refuse(f"metrics server: {error}")
    finally:
        store.close()
    return 0


def _refuse(problem: str) -> int:
    print(f"cbo-agent serve: {problem}", file=sys.stderr)
    return 2
