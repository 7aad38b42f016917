"""`cbo-agent submit|list|pause|resume|stop|status`: the control plane on the command line.

Each command opens the store that `run` and `serve` use (--store > CBO_STORE_PATH > store.path of
--config > cbo-agent.sqlite), does one operation of `agent.control` and prints the result: a line
per experiment, or JSON with ``--json``. A mistake (no such store or experiment, an invalid spec,
a stopped experiment resumed) is one line on stderr and exit code 2. A running fleet hears of the
change with its replicas' next lease renewal: nothing is restarted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.cli import missing_spec_file, spec_overrides

__all__ = ["add_control_commands"]


def add_control_commands(commands: argparse._SubParsersAction) -> None:
    """Add submit, list, pause, resume, stop and status to the command line."""
    submit = commands.add_parser(
        "submit",
        help="add experiments to a fleet's store (replicas of `serve` take them up)",
        description="Validate the specs and add each to the store; submitting the same spec "
        "again changes nothing, another spec under an existing name is refused.",
    )
    submit.add_argument("specs", nargs="+", metavar="SPEC", help="experiment spec files (YAML)")
    _store_flags(submit)
    submit.add_argument("--policy", help="the policy (policy.name) of every spec")
    submit.add_argument("--rounds", type=int, help="schedule.max_rounds of every spec")
    submit.add_argument("--seed", type=int, help="initial_design.seed of every spec")
    submit.add_argument(
        "--set",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a spec field by its dotted key (as for run); repeatable",
    )
    submit.set_defaults(handler=_submit)
    listing = commands.add_parser("list", help="every experiment's state and owner")
    _store_flags(listing)
    listing.set_defaults(handler=_list)
    for verb, what in (
        ("pause", "no new round until resumed; rounds in flight finish"),
        ("resume", "run a paused experiment again"),
        ("stop", "stop for good: its owner drops it, nothing is actuated again"),
    ):
        parser = commands.add_parser(verb, help=f"{verb} an experiment: {what}")
        parser.add_argument("experiment", help="the experiment's name")
        _store_flags(parser)
        parser.set_defaults(handler=_state_handler(verb))
    state = commands.add_parser("status", help="an experiment's state, owner and progress")
    state.add_argument("experiment", help="the experiment's name")
    _store_flags(state)
    state.set_defaults(handler=_status)


def _store_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        help="the fleet's store: postgresql://user@host:5432/database, a path or "
        "sqlite:///path (default: CBO_STORE_PATH, --config, cbo-agent.sqlite)",
    )
    parser.add_argument("--config", help="the agent's YAML configuration file (its store.path)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    parser.set_defaults(default_log_level="warning")  # the output is the answer, not logs


def _setting(text: str) -> tuple[str, object]:
    from agent.cli import _spec_setting

    return _spec_setting(text)


def _submit(args: argparse.Namespace) -> int:
    for path in args.specs:
        problem = missing_spec_file(path)
        if problem is not None:
            return _refuse("submit", problem)
    from agent.control import submit
    from agent.preflight import load_run_specs

    specs, problems = load_run_specs(args.specs, spec_overrides(args))
    if problems:
        for problem in problems:
            print(f"cbo-agent submit: {problem}", file=sys.stderr)
        return 2
    return _with_store(
        "submit",
        args,
        lambda store: submit(store, specs),
        lambda row: f"{row['experiment']}: {'submitted' if row['submitted'] else 'already there'}",
        create=True,
    )


def _list(args: argparse.Namespace) -> int:
    from agent.control import list_experiments

    return _with_store("list", args, list_experiments, _line)


def _state_handler(verb: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        from agent.control import set_state

        return _with_store(
            verb,
            args,
            lambda store: set_state(store, verb, args.experiment),  # type: ignore[arg-type]
            lambda row: f"{_line(row)}{'' if row['changed'] else ' (unchanged)'}",
        )

    return handler


def _status(args: argparse.Namespace) -> int:
    from agent.control import status

    def line(row: dict[str, Any]) -> str:
        budget = "" if row["budget_total"] is None else f" of {row['budget_total']:g}"
        return (
            f"{_line(row)} rounds={row['rounds']} open={row['open_rounds']} "
            f"readings={row['readings']} spent={row['spent']:g}{budget}"
        )

    return _with_store("status", args, lambda store: status(store, args.experiment), line)


def _line(row: dict[str, Any]) -> str:
    owner = row["owner"] or "-"
    return f"{row['experiment']} {row['state']} owner={owner} epoch={row['epoch']}"


def _with_store(
    command: str,
    args: argparse.Namespace,
    work: Callable[[Any], Any],
    line: Callable[[dict[str, Any]], str],
    *,
    create: bool = False,
) -> int:
    """Open the store, do `work`, print its rows; a mistake is one line and exit code 2."""
    from agent.config import ConfigError, load_config
    from agent.control import ControlError
    from connectors.store import SqliteLocation, Store, StoreError, parse_store_location

    try:
        path = load_config(args.config, {("store", "path"): args.store}).store.path
    except ConfigError as error:
        return _refuse(command, f"configuration: {error}")
    location = parse_store_location(path)
    if not create and isinstance(location, SqliteLocation) and not Path(location.path).is_file():
        return _refuse(command, f"no store at {path} (set --store, CBO_STORE_PATH or store.path)")
    try:
        with Store(path) as store:
            result = work(store)
    except (ControlError, StoreError) as error:
        return _refuse(command, str(error))
    rows = result if isinstance(result, list) else [result]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for row in rows:
            print(line(row))
    return 0


def _refuse(command: str, problem: str) -> int:
    print(f"cbo-agent {command}: {problem}", file=sys.stderr)
    return 2
