"""What `cbo-agent run` checks before it opens the store, binds a port or calls the broker.

A user's mistake — a spec that does not validate, an unknown policy or setting, a metrics port
another process holds, a store path that cannot be a store, a stored experiment the spec has
changed — is found here and reported as one line per problem (exit code 2), instead of a
traceback after the service has half started. The broker address and the other settings are
checked earlier, by `agent.config.load_config`.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from agent.config import AgentConfig
from agent.recovery import STRUCTURAL_FIELDS
from agent.validate import check_policy
from connectors.store.location import MEMORY, SqliteLocation, parse_store_location
from core.spec import ExperimentSpec, Override, SpecError, load_spec


def load_run_specs(
    paths: Sequence[str], overrides: Sequence[Override] = ()
) -> tuple[list[ExperimentSpec], list[str]]:
    """The specs with `overrides` applied, and every problem as `PATH: field: what`."""
    specs, problems = [], []
    for path in paths:
        try:
            spec = load_spec(path, overrides)
        except SpecError as error:
            problems += [f"{path}: {problem}" for problem in error.problems]
            continue
        problems += [f"{path}: {problem}" for problem in check_policy(spec)]
        specs.append(spec)
    names = [spec.name for spec in specs]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"two specs name the experiment {name!r}; each needs its own name")
    return specs, problems


def service_problems(config: AgentConfig, specs: Sequence[ExperimentSpec]) -> list[str]:
    """What would stop the service once started: the metrics port, the store.

    An SQLite store is looked at without creating it (its directory, its rights; an existing
    file is opened); a PostgreSQL store is opened — a server that cannot be reached, a login
    refused or another program's database is one line here (its tables are created if the
    database is empty, as the service would).
    """
    problems = []
    if (port := metrics_port_problem(config.metrics.host, config.metrics.port)) is not None:
        problems.append(port)
    location = parse_store_location(config.store.path)  # valid: the configuration checked it
    if not isinstance(location, SqliteLocation):
        return problems + stored_experiment_problems(config.store.path, specs)
    if location.path == MEMORY:
        return problems
    path = str(location.path)
    store = store_path_problem(path)
    if store is not None:
        problems.append(store)
    elif Path(path).is_file():
        problems += stored_experiment_problems(config.store.path, specs)
    return problems


def metrics_port_problem(host: str, port: int) -> str | None:
    """Why the metrics server could not listen on (host, port), or None."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # the server sets SO_REUSEADDR too: a port in TIME_WAIT is free for it
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return (
                    f"metrics port {port} on {host} is in use (another cbo-agent?); choose "
                    "another with --metrics-port or CBO_METRICS_PORT (0: any free port)"
                )
            return f"metrics address {host}:{port}: {error.strerror or error}"
    return None


def store_path_problem(path: str) -> str | None:
    """Why the file `path` cannot hold the SQLite store, or None."""
    where = Path(path)
    if where.is_dir():
        return f"store {path} is a directory; name a file in it (e.g. {where / 'agent.sqlite'})"
    folder = where.parent
    if not folder.is_dir():
        return f"store {path}: the directory {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"store {path}: cannot write in {folder}"
    if where.exists() and not os.access(where, os.R_OK | os.W_OK):
        return f"store {path}: not readable and writable by this user"
    return None


def stored_experiment_problems(path: str, specs: Sequence[ExperimentSpec]) -> list[str]:
    """Experiments of the store at `path` whose graph or model the specs have changed."""
    from connectors.store import Store, StoreError

    problems = []
    try:
        with Store(path) as store:  # a path or a URL
            for spec in specs:
                stored = store.experiment_spec(spec.name)
                if stored is None:
                    continue
                current = spec.model_dump(mode="json", by_alias=True)
                changed = [key for key in STRUCTURAL_FIELDS if stored.get(key) != current.get(key)]
                if changed:
                    problems.append(
                        f"experiment {spec.name!r} is in the store {store.path} with other "
                        f"{', '.join(changed)}; give the changed experiment a new name, or use "
                        "another store (--store)"
                    )
    except StoreError as error:  # its message names the store (a URL's password masked)
        problems.append(str(error))
    return problems
