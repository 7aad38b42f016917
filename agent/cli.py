"""The `cbo-agent` command line. Parsing only: each command's work lives in its own module."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.logs import configure_logging

Handler = Callable[[argparse.Namespace], int]


def _bench_gp_update(args: argparse.Namespace) -> int:
    from bench import gp_update

    json_path = args.json
    plot_path = args.plot or (json_path.with_suffix(".png") if json_path else None)
    gp_update.run(args.sizes, args.dim, args.batch, json_path, plot_path, reps=args.reps)
    return 0


def _bench_regret(args: argparse.Namespace) -> int:
    from bench import regret

    if args.list:
        regret.list_choices()
        return 0
    try:
        result = regret.run(
            args.env,
            args.policy,
            args.seeds,
            args.rounds,
            args.out,
            settings=args.setting,
            workers=args.workers,
            force=args.force,
        )
    except regret.BadArguments as error:
        print(f"cbo-agent bench regret: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished runs are saved; rerun the command to go on", file=sys.stderr)
        return 130
    return 1 if result.failed else 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _policy_setting(text: str) -> tuple[str | None, str, object]:
    """`[POLICY:]KEY=VALUE` -> (policy or None, key, YAML-parsed value)."""
    import yaml

    target, sep, raw = text.partition("=")
    policy, _, key = target.rpartition(":")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected [POLICY:]KEY=VALUE, got {text!r}")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: value is not YAML ({error})") from None
    return policy.strip() or None, key.strip(), value


def _demo(args: argparse.Namespace) -> int:
    from agent.demo import DemoOptions
    from agent.demo import main as run_demo

    if args.log_level is None:  # the live table is the demo's output; logs only for trouble
        configure_logging("warning", args.log_format or "auto")
    options = DemoOptions(
        env=args.env,
        policy=args.policy,
        rounds=args.rounds,
        broker=args.broker,
        live=not args.no_live,
        out=Path(args.out),
        metrics_port=args.metrics_port,
        seed=args.seed,
    )
    return run_demo(options)


# `run`'s flags -> the settings they override (agent/config.py). README.md's configuration table
# lists every one of them; tests/test_readme.py keeps the two in step.
RUN_FLAG_SETTINGS: dict[str, tuple[str, ...]] = {
    "broker": ("broker", "url"),
    "metrics_port": ("metrics", "port"),
    "metrics_host": ("metrics", "host"),
    "store": ("store", "path"),
    "agent_id": ("agent_id",),
    "log_level": ("log", "level"),
    "log_format": ("log", "format"),
    "keep_serving": ("keep_serving",),
}


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
    for path in args.specs:
        problem = missing_spec_file(path)
        if problem is not None:
            print(f"cbo-agent run: {problem}", file=sys.stderr)
            return 2

    from agent.config import ConfigError, load_config
    from agent.serve import run_service

    overrides = {key: getattr(args, flag, None) for flag, key in RUN_FLAG_SETTINGS.items()}
    try:
        config = load_config(args.config, overrides)
    except ConfigError as error:
        print(f"cbo-agent run: configuration: {error}", file=sys.stderr)
        return 2
    configure_logging(config.log.level, config.log.format)
    return run_service(args.specs, config)


def _sim(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from agent.serve import run_simulator
    from sim.device import DeviceSettings

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
        )
    except ValidationError as error:
        print(f"cbo-agent sim: {error}", file=sys.stderr)
        return 2
    broker = {
        name: value
        for name, value in (
            ("username", args.username),
            ("password", args.password),
            ("ca_file", args.ca_file),
        )
        if value
    }
    return run_simulator(args.env, args.broker, settings, args.env_seed, **broker)


def _export(args: argparse.Namespace) -> int:
    from agent.config import ConfigError, load_config
    from connectors.store import Store, StoreError

    # the same store as `run`: --store > CBO_STORE_PATH > store.path of --config > default
    try:
        path = load_config(args.config, {("store", "path"): args.store}).store.path
    except ConfigError as error:
        print(f"cbo-agent export: configuration: {error}", file=sys.stderr)
        return 2
    if not Path(path).is_file():  # opening it would create an empty store
        print(
            f"cbo-agent export: no store at {path} (set --store, CBO_STORE_PATH or store.path)",
            file=sys.stderr,
        )
        return 2
    try:
        with Store(path) as store:
            if args.experiment not in store.experiment_names():
                known = ", ".join(store.experiment_names()) or "none"
                print(
                    f"cbo-agent export: no experiment {args.experiment!r} in {path} "
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


def _bench_ingest(args: argparse.Namespace) -> int:
    from bench import ingest

    ingest.run(args.env, args.rounds, args.latency_envs, args.latency_rounds, args.json)
    return 0


def _bench_chaos(args: argparse.Namespace) -> int:
    from bench import chaos

    options = chaos.ChaosOptions(
        kills=args.kills,
        broker_restarts=args.broker_restarts,
        connection_cuts=args.connection_cuts,
        rounds=args.rounds,
        seed=args.seed,
        policy=args.policy,
    )
    result = chaos.run(options, args.json, args.workdir)
    return 0 if result.ok else 1


def _validate(args: argparse.Namespace) -> int:
    from agent.validate import validate_files

    return validate_files(args.specs)


def _add_bench(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="benchmarks (print a table, save JSON and plots)")
    # A benchmark's output is its table and progress bar; the agents and devices it runs log
    # only warnings unless --log-level says otherwise.
    bench.set_defaults(default_log_level="warning")
    which = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    gp = which.add_parser(
        "gp-update",
        help="one posterior update: row append vs BoTorch vs refactorization vs one solve",
    )
    gp.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 2000, 4000])
    gp.add_argument("--dim", type=int, default=6, help="input dimension (default 6)")
    gp.add_argument("--batch", type=int, default=8, help="batch of GPs besides a single one")
    gp.add_argument("--reps", type=int, default=25, help="appends and solves timed per size")
    gp.add_argument("--json", type=Path, help="write the rows as JSON here")
    gp.add_argument("--plot", type=Path, help="PNG plot (default: next to --json)")
    gp.set_defaults(handler=_bench_gp_update)
    ingest = which.add_parser(
        "ingest", help="feedback throughput through Mosquitto (agent vs bare client), latency"
    )
    ingest.add_argument("--env", default="alpine2", help="environment of the readings")
    ingest.add_argument("--rounds", type=_positive_int, default=1000, help="rounds of readings")
    ingest.add_argument(
        "--latency-envs",
        nargs="*",
        metavar="E",
        default=["all"],
        help="environments whose decision latency is measured ('all': every one with a spec "
        "in examples/; none given: skip)",
    )
    ingest.add_argument("--latency-rounds", type=_positive_int, default=20)
    ingest.add_argument("--json", type=Path, help="write the results as JSON here")
    ingest.set_defaults(handler=_bench_ingest)
    _add_bench_regret(which)
    _add_bench_chaos(which)


def _add_bench_chaos(which: argparse._SubParsersAction) -> None:
    chaos = which.add_parser(
        "chaos",
        help="kill -9 the agent, restart the broker and cut the agent's connection mid-run; "
        "check nothing lost or overspent",
    )
    chaos.add_argument("--kills", type=int, default=10, help="SIGKILLs of the agent (10)")
    chaos.add_argument(
        "--broker-restarts", type=int, default=3, help="broker restarts, half of them SIGKILL (3)"
    )
    chaos.add_argument(
        "--connection-cuts",
        type=int,
        default=3,
        help="cuts of the agent's broker connection (a proxy resets it; broker stays up) (3)",
    )
    chaos.add_argument("--rounds", type=_positive_int, default=40, help="max_rounds R (40)")
    chaos.add_argument("--seed", type=int, default=0, help="when and how to disrupt (0)")
    chaos.add_argument("--policy", default="random", help="the agent's policy (random)")
    chaos.add_argument("--json", type=Path, help="write the results as JSON here")
    chaos.add_argument(
        "--workdir", type=Path, help="keep the spec, store, logs and broker data here"
    )
    chaos.set_defaults(handler=_bench_chaos)


def _add_bench_regret(which: argparse._SubParsersAction) -> None:
    regret = which.add_parser(
        "regret",
        help="regret curves of policies on simulated environments over seeds (JSON, table, PNG)",
    )
    regret.add_argument("--list", action="store_true", help="list environments and policies")
    regret.add_argument(
        "--env", nargs="+", metavar="E", help="environments (default: every one with a spec)"
    )
    regret.add_argument("--policy", nargs="+", metavar="P", help="policies (default: all)")
    regret.add_argument("--seeds", type=_positive_int, default=20, help="seeds 0..N-1 (20)")
    regret.add_argument("--rounds", type=_positive_int, default=100, help="policy rounds (100)")
    regret.add_argument(
        "--out", type=Path, default=Path("results/regret"), metavar="DIR", help="(results/regret)"
    )
    regret.add_argument(
        "--setting",
        type=_policy_setting,
        action="append",
        default=[],
        metavar="[POLICY:]KEY=VALUE",
        help="policy setting, value parsed as YAML (e.g. beta=5 or mcbo:beta=5); repeatable",
    )
    regret.add_argument(
        "--workers", type=_positive_int, help="parallel runs (default: the CPU count)"
    )
    regret.add_argument("--force", action="store_true", help="redo runs already saved in DIR")
    regret.set_defaults(handler=_bench_regret)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cbo-agent",
        description="Online causal Bayesian optimization for networked systems over MQTT.",
    )
    _add_log_flags(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands)
    _add_sim(commands)
    _add_demo(commands)
    _add_export(commands)
    validate = commands.add_parser(
        "validate", help="check experiment specs; exit 1 naming each offending field"
    )
    validate.add_argument("specs", nargs="+", metavar="SPEC", help="YAML spec files")
    validate.set_defaults(handler=_validate)
    _add_bench(commands)
    return parser


def _add_export(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export",
        help="write an experiment's history as CSV or Parquet",
        description="The store `run` uses: store.path of --config < CBO_STORE_PATH < --store "
        "(each overriding the one before; default cbo-agent.sqlite).",
    )
    export.add_argument("experiment", help="the experiment's name")
    export.add_argument(
        "--store", help="the agent's store (default: CBO_STORE_PATH, --config, cbo-agent.sqlite)"
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


def _add_log_flags(parser: argparse.ArgumentParser, default: object = None) -> None:
    parser.add_argument(
        "--log-level", default=default, help="debug, info (default), warning, error"
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
    run.add_argument("--broker", help="broker URL, mqtt://[user:pass@]host:1883 or mqtts://")
    run.add_argument("--metrics-port", type=int, help="port of /metrics, /healthz, /readyz")
    run.add_argument("--metrics-host", help="address the metrics server binds (127.0.0.1)")
    run.add_argument("--store", help="SQLite store path")
    run.add_argument("--agent-id", help="MQTT client id and status-topic name")
    run.add_argument(
        "--keep-serving",
        action=argparse.BooleanOptionalAction,
        help="once every experiment has finished, stay up (metrics, health, broker session) "
        "until stopped instead of exiting 0; for services that restart what exits",
    )
    # also after `run` (SUPPRESS: not given here, the global flag's value stands)
    _add_log_flags(run, default=argparse.SUPPRESS)
    run.set_defaults(handler=_run)


def _add_sim(commands: argparse._SubParsersAction) -> None:
    sim = commands.add_parser("sim", help="run a simulated environment as an MQTT device")
    sim.add_argument("env", metavar="ENV", help="environment name (see bench regret --list)")
    sim.add_argument("--experiment", required=True, help="the experiment id it serves")
    sim.add_argument(
        "--broker",
        default=os.environ.get("CBO_BROKER_URL", "mqtt://127.0.0.1:1883"),
        help="broker URL (default $CBO_BROKER_URL or mqtt://127.0.0.1:1883)",
    )
    sim.add_argument(
        "--username",
        default=os.environ.get("CBO_BROKER_USERNAME"),
        help="broker user (default $CBO_BROKER_USERNAME)",
    )
    sim.add_argument(
        "--password",
        default=os.environ.get("CBO_BROKER_PASSWORD"),
        help="broker password (default $CBO_BROKER_PASSWORD)",
    )
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
    sim.add_argument("--max-in-flight", type=int, default=64, help="actions handled at once")
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
    demo.add_argument("--rounds", type=_positive_int, default=30, help="rounds to run (30)")
    demo.add_argument(
        "--broker", metavar="HOST:PORT", help="use this broker instead of starting the embedded one"
    )
    demo.add_argument("--no-live", action="store_true", help="plain lines, no live table")
    demo.add_argument("--out", default="results/demo", help="where the plot and store go")
    demo.add_argument("--metrics-port", type=int, default=9464, help="/metrics port (9464)")
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the run's randomness: initial design, simulator noise and delays (0); the "
        "environment stays the instance its spec describes",
    )
    demo.set_defaults(handler=_demo)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = args.log_level or getattr(args, "default_log_level", "info")
    configure_logging(level, args.log_format or "auto")
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
