"""The `cbo-agent` command line. Parsing only: each command's work lives in its own module.

Commands of other rooms (the benchmarks) are not named here: each is an entry point of the
group `cbo_agent.commands` in the installed metadata (pyproject.toml), a `register(commands)`
that adds its subparsers. Each parser sets `handler`, and may set `default_log_level`: the log
level when --log-level is not given.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib.metadata
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from agent.logs import configure_logging
from sim.errors import EnvironmentUnavailable, StatesNotRecorded

Handler = Callable[[argparse.Namespace], int]
COMMANDS_GROUP = "cbo_agent.commands"


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (commands of other rooms use it too)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _demo(args: argparse.Namespace) -> int:
    from agent.demo import DemoOptions
    from agent.demo import main as run_demo

    if args.log_level is None:  # the live table is the demo's output; logs only for trouble
        configure_logging("warning", args.log_format or "auto")
    from agent.config import read_password_file

    password = os.environ.get("CBO_BROKER_PASSWORD") or None
    if args.password_file is not None:
        try:
            password = read_password_file(args.password_file)
        except ValueError as error:
            return _refuse("demo", [f"--password-file: {error}"])
    warn_of_a_password_in(args.broker)
    options = DemoOptions(
        env=args.env,
        policy=args.policy,
        rounds=args.rounds,
        broker=args.broker,
        broker_password=password,
        live=not args.no_live,
        out=Path(args.out),
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        seed=args.seed,
    )
    return run_demo(options)


# `run`'s flags -> the settings they override (agent/config.py). README.md's configuration table
# lists every one of them; tests/test_readme.py keeps the two in step.
RUN_FLAG_SETTINGS: dict[str, tuple[str, ...]] = {
    "broker": ("broker", "url"),
    "password_file": ("broker", "password_file"),
    "metrics_port": ("metrics", "port"),
    "metrics_host": ("metrics", "host"),
    "store": ("store", "path"),
    "agent_id": ("agent_id",),
    "log_level": ("log", "level"),
    "log_format": ("log", "format"),
    "keep_serving": ("keep_serving",),
    "connect_timeout": ("broker", "connect_timeout_s"),
    "device_keys_file": ("device_keys_file",),
}
# `run`'s flags that change the specs rather than the service (README's "Trying policies").
RUN_SPEC_FLAGS = ("policy", "rounds", "seed", "set")


def missing_spec_file(path: str) -> str | None:
    """Why `path` is no spec file to read (one line), or None if it is a file.

    Checked before the heavy imports, so a container started without its specs mounted says
    so at once instead of after loading torch.
    """
    where = Path(path)
    if where.is_file():
        return None
    if where.is_dir():
        return f"{path}: a directory, not a spec file; name the YAML files in it"
    hint = ""
    if where.is_absolute() and where.parts[1:2] == ("specs",):  # the image's spec directory
        hint = (
            "; in a container, mount your specs at /specs "
            '(docker run -v "$PWD/specs:/specs:ro" IMAGE /specs/NAME.yaml)'
        )
    return f"{path}: no such spec file{hint}"


def _run(args: argparse.Namespace) -> int:
    """Check everything a user can get wrong, then serve; a mistake is one line, exit 2."""
    for path in args.specs:
        problem = missing_spec_file(path)
        if problem is not None:
            return _refuse("run", [problem])

    from agent.config import ConfigError, load_config
    from agent.preflight import load_run_specs, service_problems
    from agent.serve import run_service

    warn_of_a_password_in(args.broker)
    overrides = {key: getattr(args, flag, None) for flag, key in RUN_FLAG_SETTINGS.items()}
    try:
        config = load_config(args.config, overrides)
        config.load_device_keys()  # read again by the service; a bad file is the user's
    except ConfigError as error:
        return _refuse("run", [f"configuration: {error}"])
    specs, problems = load_run_specs(args.specs, spec_overrides(args))
    if problems:
        return _refuse("run", problems)
    problems = service_problems(config, specs)
    if problems:
        return _refuse("run", problems)
    configure_logging(config.log.level, config.log.format)
    return run_service(specs, config)


PASSWORD_HINT = (
    "a password on the command line is visible to every user of this machine (ps, "
    "/proc/PID/cmdline); use --password-file FILE or CBO_BROKER_PASSWORD"
)


def warn_of_a_password_in(broker: str | None) -> None:
    """Warn (log event `cli.password_on_command_line`) when a `--broker` URL carries one."""
    if broker is None:
        return
    from agent.config import ConfigError, parse_broker_address

    try:
        address = parse_broker_address(broker)
    except ConfigError:
        return  # the configuration says what is wrong with it
    if address.password is not None:
        import structlog

        structlog.get_logger(__name__).warning(
            "cli.password_on_command_line", flag="--broker", hint=PASSWORD_HINT
        )


def spec_overrides(args: argparse.Namespace) -> list[tuple[str, object]]:
    """`--policy`, `--rounds`, `--seed` and every `--set KEY=VALUE`, as dotted spec keys."""
    overrides: list[tuple[str, object]] = []
    if args.policy is not None:
        overrides.append(("policy.name", args.policy))
    if args.rounds is not None:
        overrides.append(("schedule.max_rounds", args.rounds))
    if args.seed is not None:
        overrides.append(("initial_design.seed", args.seed))
    return overrides + list(args.set)


def _refuse(command: str, problems: list[str]) -> int:
    """Print each problem as one line naming the command; exit code 2."""
    for problem in problems:
        print(f"cbo-agent {command}: {problem}", file=sys.stderr)
    return 2


def _spec_setting(text: str) -> tuple[str, object]:
    """`KEY=VALUE` -> (dotted key, YAML-parsed value)."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE (e.g. schedule.max_rounds=20), got {text!r}"
        )
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: value is not YAML ({error})") from None
    return key.strip(), value


def _sim(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from agent.config import ConfigError, parse_broker_address, read_password_file
    from agent.serve import run_simulator
    from core.plain_errors import plain_problems, unknown_name
    from sim.device import DeviceSettings
    from sim.registry import environment_names

    if args.password is not None:
        return _refuse("sim", [f"--password is not accepted: {PASSWORD_HINT}"])
    if args.env not in environment_names():
        return _refuse("sim", [unknown_name("environment", args.env, environment_names())])
    password = os.environ.get("CBO_BROKER_PASSWORD") or None
    if args.password_file is not None:
        try:
            password = read_password_file(args.password_file)
        except ValueError as error:
            return _refuse("sim", [f"--password-file: {error}"])
    warn_of_a_password_in(args.broker)
    try:
        address = parse_broker_address(args.broker)
    except ConfigError as error:
        return _refuse("sim", [f"--broker {error}"])
    key = os.environ.get("CBO_DEVICE_KEY") or None
    if args.key_file:
        try:
            key = Path(args.key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or type(error).__name__
            return _refuse("sim", [f"--key-file {args.key_file}: {reason}"])
    try:
        settings = DeviceSettings(
            experiment=args.experiment,
            device_id=args.device_id or f"sim-{args.experiment}",
            delay_s=args.delay,
            jitter_s=args.jitter,
            drop_rate=args.drop_rate,
            duplicate_rate=args.duplicate_rate,
            seed=args.seed,
            publish_oracle=not args.no_oracle,
            topic_prefix=args.prefix,
            max_in_flight=args.max_in_flight,
            key=key,
            send_states=args.send_states,
        )
    except ValidationError as error:
        return _refuse("sim", plain_problems(error, DeviceSettings))
    options = {
        name: value
        for name, value in (
            ("username", args.username),
            ("password", password),
            ("ca_file", args.ca_file),
        )
        if value
    }
    try:
        broker = address.broker_config(**options)
    except ValidationError as error:
        return _refuse("sim", [f"--broker {args.broker!r}: {e}" for e in plain_problems(error)])
    return run_simulator(args.env, broker, settings, args.env_seed)


def _export(args: argparse.Namespace) -> int:
    from agent.config import ConfigError, load_config
    from connectors.store import SqliteLocation, Store, StoreError, parse_store_location

    # the same store as `run`: --store > CBO_STORE_PATH > store.path of --config > default
    try:
        path = load_config(args.config, {("store", "path"): args.store}).store.path
    except ConfigError as error:
        print(f"cbo-agent export: configuration: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"cbo-agent export: --out {args.out}: exists and is not a directory", file=sys.stderr)
        return 2
    location = parse_store_location(path)  # valid: the configuration checked it
    if isinstance(location, SqliteLocation) and not Path(location.path).is_file():
        print(  # opening it would create an empty store
            f"cbo-agent export: no store at {path} (set --store, CBO_STORE_PATH or store.path)",
            file=sys.stderr,
        )
        return 2
    try:
        with Store(path) as store:
            if args.experiment not in store.experiment_names():
                known = ", ".join(store.experiment_names()) or "none"
                print(
                    f"cbo-agent export: no experiment {args.experiment!r} in {store.path} "
                    f"(known: {known})",
                    file=sys.stderr,
                )
                return 2
            paths = store.export(args.experiment, Path(args.out), args.format)
    except StoreError as error:
        print(f"cbo-agent export: {error}", file=sys.stderr)
        return 2
    for written in paths:
        print(written)
    return 0


def _spec_docs(args: argparse.Namespace) -> int:
    from agent.spec_docs import main as spec_docs

    return spec_docs(Path(args.out), args.check)


def _validate(args: argparse.Namespace) -> int:
    from agent.validate import validate_files

    return validate_files(args.specs)


def build_parser() -> argparse.ArgumentParser:
    return _command_line().parser


@dataclass(frozen=True)
class _CommandLine:
    parser: argparse.ArgumentParser
    commands: list[str]  # every command the parser knows
    unavailable: dict[str, str]  # command of an entry point that failed -> why, one line


def _command_line() -> _CommandLine:
    parser = _Parser(
        prog="cbo-agent",
        description="Online causal Bayesian optimization for networked systems over MQTT.",
    )
    _add_log_flags(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands)
    _add_sim(commands)
    _add_demo(commands)
    _add_export(commands)
    from agent.control_cli import add_control_commands
    from agent.fleet_cli import add_serve_command

    add_serve_command(commands)
    add_control_commands(commands)
    validate = commands.add_parser(
        "validate", help="check experiment specs; exit 1 naming each offending field"
    )
    validate.add_argument("specs", nargs="+", metavar="SPEC", help="YAML spec files")
    validate.set_defaults(handler=_validate)
    docs = commands.add_parser(
        "spec-docs",
        help="write the spec reference (spec.md) and its JSON Schema from the spec's models",
    )
    docs.add_argument("--out", default="docs", help="the folder to write them in (docs)")
    docs.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the files are out of date"
    )
    docs.set_defaults(handler=_spec_docs)
    unavailable = _add_installed_commands(commands)
    if unavailable:
        parser.epilog = f"not available in this install: {', '.join(unavailable)}"
    return _CommandLine(parser, list(commands.choices), unavailable)


def _add_installed_commands(commands: argparse._SubParsersAction) -> dict[str, str]:
    """Let every entry point of COMMANDS_GROUP add its commands; return, per entry point that
    failed to load or to register, why (one line), to say when its command is asked for.

    A broken one must not take the others down: `cbo-agent run` works without the benchmarks.
    """
    unavailable = {}
    for entry in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        try:
            entry.load()(commands)
        except Exception as error:
            first_line = (str(error).splitlines() or [""])[0]
            unavailable[entry.name] = (
                f"its entry point {entry.name} = {entry.value} (group {COMMANDS_GROUP}) "
                f"fails: {type(error).__name__}: {first_line}; reinstall cbo-agent"
            )
    return unavailable


def _command_problem(argv: Sequence[str], line: _CommandLine) -> str | None:
    """One line if argv asks for a command this install lacks; None leaves it to the parser."""
    word = _command_word(argv)
    if word is None or (word in line.commands and word not in line.unavailable):
        return None
    if word in line.unavailable:
        return f"cbo-agent {word}: not available: {line.unavailable[word]}"
    from core.plain_errors import did_you_mean

    return (
        f"cbo-agent: no command {word!r}{did_you_mean(word, line.commands)} "
        f"(this install has: {', '.join(line.commands)}); "
        f"commands from other packages are entry points of group {COMMANDS_GROUP}: "
        "reinstall cbo-agent if one is missing"
    )


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise argparse.ArgumentError(None, message)


def _command_word(argv: Sequence[str]) -> str | None:
    """The COMMAND of argv: its first word that is neither a global flag nor a flag's value."""
    scan = _RaisingParser(add_help=False)
    _add_log_flags(scan)
    scan.add_argument("command", nargs="?")
    try:
        known, _ = scan.parse_known_args(argv)
    except argparse.ArgumentError:
        return None  # a bad global flag: the full parser says what is wrong
    return known.command


def _add_export(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export",
        help="write an experiment's history as CSV or Parquet",
        description="The store `run` uses: store.path of --config < CBO_STORE_PATH < --store "
        "(each overriding the one before; default cbo-agent.sqlite).",
    )
    export.add_argument("experiment", help="the experiment's name")
    export.add_argument(
        "--store",
        help="the agent's store: a path, sqlite:///path or postgresql://... "
        "(default: CBO_STORE_PATH, --config, cbo-agent.sqlite)",
    )
    export.add_argument("--config", help="the agent's YAML configuration file (its store.path)")
    export.add_argument(
        "--format",
        choices=["csv", "parquet"],
        default="csv",
        help="csv (default) or parquet (needs pyarrow: the 'parquet' extra)",
    )
    export.add_argument("--out", default=".", help="directory for the files")
    export.set_defaults(handler=_export)


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake said in one line (not the usage block) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_log_flags(parser: argparse.ArgumentParser, default: object = None) -> None:
    parser.add_argument(
        "--log-level",
        default=default,
        type=str.lower,
        choices=["debug", "info", "warning", "error"],
        help="debug, info (default), warning, error",
    )
    parser.add_argument(
        "--log-format",
        default=default,
        choices=["auto", "json", "console"],
        help="log rendering (default auto: console on a terminal, JSON otherwise)",
    )


def _add_run(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run",
        help="the agent service: run experiments from specs over MQTT",
        description="Settings: --config FILE < CBO_* environment variables < these flags.",
    )
    run.add_argument("specs", nargs="+", metavar="SPEC", help="experiment spec files (YAML)")
    run.add_argument("--config", help="YAML configuration file (see agent/config.py)")
    run.add_argument(
        "--broker",
        help="the broker: mqtt://[USER:PASS@]HOST[:PORT], mqtts:// (TLS), tcp:// or HOST:PORT",
    )
    run.add_argument(
        "--password-file",
        metavar="FILE",
        help="file whose first line is the broker password (broker.password_file; or "
        "CBO_BROKER_PASSWORD); never put a password on the command line",
    )
    run.add_argument(
        "--connect-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="give up (exit 1, log event agent.fatal) when no broker session starts within "
        "this long, at start or after losing one (default: keep trying)",
    )
    run.add_argument("--metrics-port", type=int, help="port of /metrics, /healthz, /readyz")
    run.add_argument("--metrics-host", help="address the metrics server binds (127.0.0.1)")
    run.add_argument(
        "--store",
        help="the store: a path or sqlite:///path (SQLite; default cbo-agent.sqlite), or "
        "postgresql://user@host:5432/database (PostgreSQL)",
    )
    run.add_argument("--agent-id", help="MQTT client id and status-topic name")
    run.add_argument(
        "--device-keys-file",
        metavar="FILE",
        help="per-device HMAC-SHA256 keys, 'DEVICE_ID KEY' per line: a device with a key must "
        "sign its messages (docs/protocol.md, Signatures)",
    )
    run.add_argument(
        "--keep-serving",
        action=argparse.BooleanOptionalAction,
        help="once every experiment has finished, stay up (metrics, health, broker session) "
        "until stopped instead of exiting 0; for services that restart what exits",
    )
    # also after `run` (SUPPRESS: not given here, the global flag's value stands)
    _add_log_flags(run, default=argparse.SUPPRESS)
    trying = run.add_argument_group(
        "trying policies (these change every spec given, validated like the spec)"
    )
    trying.add_argument(
        "--policy",
        help="the policy (policy.name); another policy than the spec's drops its policy.settings",
    )
    trying.add_argument(
        "--rounds", type=positive_int, help="stop after N rounds (schedule.max_rounds)"
    )
    trying.add_argument(
        "--seed",
        type=int,
        help="the design's and the policy's random numbers (initial_design.seed)",
    )
    trying.add_argument(
        "--set",
        type=_spec_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a spec field by its dotted key, value parsed as YAML "
        "(e.g. policy.settings.beta=2, constraints.budget_total=50); repeatable",
    )
    run.set_defaults(handler=_run)


def _add_sim(commands: argparse._SubParsersAction) -> None:
    sim = commands.add_parser("sim", help="run a simulated environment as an MQTT device")
    sim.add_argument("env", metavar="ENV", help="environment name (see bench regret --list)")
    sim.add_argument("--experiment", required=True, help="the experiment id it serves")
    sim.add_argument(
        "--broker",
        default=os.environ.get("CBO_BROKER_URL", "mqtt://127.0.0.1:1883"),
        help="the broker: mqtt://[USER:PASS@]HOST[:PORT], mqtts:// (TLS), tcp:// or HOST:PORT "
        "(default $CBO_BROKER_URL or mqtt://127.0.0.1:1883)",
    )
    sim.add_argument(
        "--username",
        default=os.environ.get("CBO_BROKER_USERNAME"),
        help="broker user (default $CBO_BROKER_USERNAME)",
    )
    sim.add_argument(
        "--password-file",
        default=os.environ.get("CBO_BROKER_PASSWORD_FILE"),
        metavar="FILE",
        help="file whose first line is the broker password (default $CBO_BROKER_PASSWORD_FILE; "
        "or the password itself in $CBO_BROKER_PASSWORD)",
    )
    # removed: a password on the command line shows in `ps`; refused with a hint
    sim.add_argument("--password", help=argparse.SUPPRESS)
    sim.add_argument(
        "--ca-file",
        default=os.environ.get("CBO_BROKER_CA_FILE"),
        help="CA bundle for mqtts:// (default $CBO_BROKER_CA_FILE)",
    )
    sim.add_argument("--device-id", help="device id (default sim-EXPERIMENT)")
    sim.add_argument("--prefix", default="cbo", help="topic prefix (cbo)")
    sim.add_argument("--delay", type=float, default=0.0, help="seconds before readings")
    sim.add_argument("--jitter", type=float, default=0.0, help="extra uniform delay per reading")
    sim.add_argument("--drop-rate", type=float, default=0.0, help="probability a reading is lost")
    sim.add_argument(
        "--duplicate-rate", type=float, default=0.0, help="probability a reading is sent twice"
    )
    sim.add_argument("--seed", type=int, default=0, help="noise, drops, duplicates, jitter")
    sim.add_argument(
        "--env-seed",
        type=int,
        default=0,
        help="instance of a randomly drawn environment (must match the spec)",
    )
    sim.add_argument("--no-oracle", action="store_true", help="publish no oracle values")
    sim.add_argument(
        "--key-file",
        metavar="FILE",
        help="sign every message with the HMAC-SHA256 key in FILE (or CBO_DEVICE_KEY); the "
        "agent's device_keys must hold it for this device id",
    )
    sim.add_argument("--max-in-flight", type=int, default=64, help="actions handled at once")
    sim.add_argument(
        "--send-states",
        action="store_true",
        help="send the states each episode's controller visited with the return (cbo.reading "
        "version 4), for hagpucb's visited_states; episode environments only (mpe-tag*, "
        "mamujoco-*)",
    )
    sim.set_defaults(handler=_sim)


def _add_demo(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo", help="broker, simulator and agent on this machine, watched live"
    )
    demo.add_argument("--env", default="dropwave", help="environment (dropwave)")
    demo.add_argument(
        "--policy",
        help="mcbo, eifn, gpucb, random, or dgpucb on an environment with a decomposed reward "
        "(weather, sir, decomposed-synthetic); default: the spec's",
    )
    demo.add_argument("--rounds", type=positive_int, default=30, help="rounds to run (30)")
    demo.add_argument(
        "--broker",
        help="use this broker instead of starting the embedded one: HOST:PORT, "
        "mqtt://[USER:PASS@]HOST[:PORT], mqtts:// (TLS) or tcp://",
    )
    demo.add_argument(
        "--password-file",
        metavar="FILE",
        help="file whose first line is the password of --broker's user (or CBO_BROKER_PASSWORD)",
    )
    demo.add_argument("--no-live", action="store_true", help="plain lines, no live table")
    demo.add_argument("--out", default="results/demo", help="where the plot and store go")
    demo.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        help="/metrics port (9464); in use: exit 2, never another port; 0: any free port",
    )
    demo.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address /metrics listens on (127.0.0.1; 0.0.0.0 in a container)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the run's randomness: initial design, simulator noise and delays (0); the "
        "environment stays the instance its spec describes",
    )
    demo.set_defaults(handler=_demo)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    line = _command_line()
    problem = _command_problem(argv, line)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    args = line.parser.parse_args(argv)
    # `kill -USR1 PID` prints every thread's stack to stderr and the process goes on: how to
    # see where a service that does not answer or does not stop is waiting
    # (not where stderr is no file: captured, embedded)
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            faulthandler.register(signal.SIGUSR1, all_threads=True)
    level = args.log_level or getattr(args, "default_log_level", "info")
    configure_logging(level, args.log_format or "auto")
    handler: Handler = args.handler
    try:
        return handler(args)
    except EnvironmentUnavailable as missing:  # an optional extra this install lacks
        return _refuse(args.command, [str(missing)])
    except StatesNotRecorded as mistake:  # `sim --send-states`, an environment without states
        return _refuse(args.command, [str(mistake)])


if __name__ == "__main__":
    sys.exit(main())
