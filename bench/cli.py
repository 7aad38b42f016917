"""`cbo-agent bench ...`: the benchmarks' subcommands, contributed to the command line.

The agent room's command line never names this room: it calls `register` for every entry point
of the group `cbo_agent.commands` (pyproject.toml: `bench = "bench.cli:register"`). Only the
parsing lives here, and it imports nothing heavy: each handler imports its benchmark when it
runs, so that `cbo-agent run` does not pay for them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.cli import positive_int

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:
    """Add `bench` and its benchmarks to the `cbo-agent` subcommands `commands`."""
    bench = commands.add_parser("bench", help="benchmarks (print a table, save JSON and plots)")
    # A benchmark's output is its table and progress bar; the agents and devices it runs log
    # only warnings unless --log-level says otherwise.
    bench.set_defaults(default_log_level="warning")
    which = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    _add_gp_update(which)
    _add_ingest(which)
    _add_latency(which)
    _add_regret(which)
    _add_chaos(which)
    _add_store(which)
    _add_decision(which)
    _add_trsm(which)
    _add_fleet(which)
    _add_sampling(which)
    _add_stream(which)
    _add_drift(which)


def _bad_device(benchmark: str, devices: list[str]) -> bool:
    """Whether a `--device` cannot be used here; if so, says so in one line on stderr."""
    from core.devices import resolve_device
    from core.errors import DeviceError

    for device in devices:
        try:
            resolve_device(device)
        except DeviceError as error:
            print(f"cbo-agent bench {benchmark}: error: --device: {error}", file=sys.stderr)
            return True
    return False


def _add_device(parser: argparse.ArgumentParser, *, several: bool = False) -> None:
    """`--device cpu|cuda[:N]`: where the models live (the service's CBO_DEVICE)."""
    if several:
        parser.add_argument(
            "--device",
            nargs="+",
            default=["cpu"],
            metavar="DEVICE",
            help="where the GPs live: cpu, cuda, cuda:N; several are measured in one run (cpu)",
        )
    else:
        parser.add_argument(
            "--device", default="cpu", help="where the GPs live: cpu, cuda, cuda:N (cpu)"
        )


def _gp_update(args: argparse.Namespace) -> int:
    from bench import gp_update

    if _bad_device("gp-update", args.device):
        return 2
    json_path = args.json
    plot_path = args.plot or (json_path.with_suffix(".png") if json_path else None)
    gp_update.run(
        args.sizes,
        args.dim,
        args.batch,
        json_path,
        plot_path,
        reps=args.reps,
        devices=args.device,
        botorch=not args.no_botorch,
    )
    return 0


def _regret(args: argparse.Namespace) -> int:
    from bench import regret

    if _bad_device("regret", [args.device]):
        return 2
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
            device=args.device,
        )
    except regret.BadArguments as error:
        print(f"cbo-agent bench regret: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished runs are saved; rerun the command to go on", file=sys.stderr)
        return 130
    return 1 if result.failed else 0


def _decision(args: argparse.Namespace) -> int:
    from bench import decision

    if _bad_device("decision", [args.device]):
        return 2
    try:
        decision.run(
            args.env,
            args.policy,
            args.rounds,
            args.seed,
            args.setting,
            args.json,
            args.threads,
            device=args.device,
        )
    except decision.BadArguments as error:
        print(f"cbo-agent bench decision: error: {error}", file=sys.stderr)
        return 2
    return 0


def _ingest(args: argparse.Namespace) -> int:
    from bench import ingest

    if _bad_device("ingest", [args.device]):
        return 2
    try:
        if args.merge:
            ingest.merge(args.merge, args.json)
            return 0
        piece = args.repeat_index is not None or args.no_throughput
        if piece and args.json is None:
            raise ingest.BadPieces("a piece (--repeat-index, --no-throughput) needs --json")
        envs = args.latency_envs
        if envs is None:  # a throughput piece measures latencies only when they are named
            envs = [] if args.repeat_index is not None else ["all"]
        ingest.run(
            args.env,
            args.rounds,
            envs,
            args.latency_rounds,
            args.json,
            repeats=args.repeats,
            device=args.device,
            repeat_index=None if args.repeat_index is None else args.repeat_index - 1,
            throughput=not args.no_throughput,
        )
    except (ingest.QueueTooSmall, ingest.BadPieces) as error:
        print(f"cbo-agent bench ingest: error: {error}", file=sys.stderr)
        return 2
    return 0


def _latency(args: argparse.Namespace) -> int:
    from bench import learn_latency

    learn_latency.run(
        args.env,
        args.history,
        args.rounds,
        args.rate,
        args.repeats,
        tuple(args.modes),
        args.json,
    )
    return 0


def _chaos(args: argparse.Namespace) -> int:
    from bench import chaos

    options = chaos.ChaosOptions(
        kills=args.kills,
        broker_restarts=args.broker_restarts,
        connection_cuts=args.connection_cuts,
        rounds=args.rounds,
        seed=args.seed,
        policy=args.policy,
        forge=not args.no_forger,
        flood=args.flood,
        flood_rate=args.flood_rate,
    )
    result = chaos.run(options, args.json, args.workdir)
    return 0 if result.ok else 1


def _store(args: argparse.Namespace) -> int:
    from connectors.store import StoreError

    if "postgresql" in args.backends:
        problem = _postgres_problem(args.postgres)
        if problem is not None:
            print(f"cbo-agent bench store: {problem}", file=sys.stderr)
            return 2
    from bench import store

    try:
        store.run(
            args.spec,
            args.rounds,
            args.repeats,
            args.backends,
            args.postgres,
            args.json,
            args.workdir,
        )
    except StoreError as error:
        print(f"cbo-agent bench store: {error}", file=sys.stderr)
        return 2
    return 0


def _postgres_problem(admin_url: str) -> str | None:
    """One line if the PostgreSQL server cannot be reached with `admin_url`, else None."""
    import psycopg

    try:
        psycopg.connect(admin_url, connect_timeout=5).close()
    except psycopg.Error as error:
        detail = " ".join(str(error).split())
        return f"no PostgreSQL at --postgres {admin_url} ({detail}); or --backends sqlite"
    return None


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


def _sampling(args: argparse.Namespace) -> int:
    from bench import sampling

    sampling.run(
        args.n_test,
        args.t,
        args.samples,
        args.reps,
        args.memory_cap_mb,
        args.timeout_s,
        args.json,
        methods=args.methods,
    )
    return 0


def _add_sampling(which: argparse._SubParsersAction) -> None:
    sampling = which.add_parser(
        "sampling",
        help="joint posterior samples of an array GP: Matheron vs dense vs BoTorch (paper 002)",
    )
    sampling.add_argument("--n-test", type=positive_int, nargs="+", default=list(range(5, 310, 50)))
    sampling.add_argument("--t", type=positive_int, nargs="+", default=[10, 64, 256, 1024, 4096])
    sampling.add_argument("--samples", type=positive_int, default=256)
    sampling.add_argument("--reps", type=positive_int, default=5, help="interleaved repeats")
    sampling.add_argument(
        "--methods",
        nargs="+",
        choices=["matheron", "distributional", "botorch"],
        default=["matheron", "distributional", "botorch"],
    )
    sampling.add_argument(
        "--memory-cap-mb",
        type=float,
        default=4096.0,
        help="do not run a method whose dense matrices need more",
    )
    sampling.add_argument(
        "--timeout-s",
        type=float,
        default=300.0,
        help="a measurement running longer is a failed row",
    )
    sampling.add_argument("--json", type=Path, help="write the rows as JSON here")
    sampling.set_defaults(handler=_sampling)


def _stream(args: argparse.Namespace) -> int:
    from bench import stream

    if args.budget is not None and (args.capacity is None or args.budget > args.capacity):
        print("cbo-agent bench stream: error: --budget needs a --capacity at least as large",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.service:
        return _stream_service(args)
    service_only = {"--time-limit": args.time_limit is not None, "--pipeline": args.pipeline != 1,
                    "--store": args.store is not None,
                    "--every": args.every is not None}  # fmt: skip
    if any(service_only.values()):
        option = next(o for o, given in service_only.items() if given)
        print(f"cbo-agent bench stream: error: {option} is for --service runs", file=sys.stderr)
        return 2
    try:
        stream.run(
            args.rounds,
            args.json,
            capacity=args.capacity,
            budget=args.budget,
            batch=args.nodes,
            dim=args.dim,
            refits=not args.no_refits,
            resume=args.resume,
            stop_after=args.stop_after,
        )
    except stream.ResumeError as error:
        print(f"cbo-agent bench stream: error: {error}", file=sys.stderr)
        return 2
    return 0


def _stream_service(args: argparse.Namespace) -> int:
    from bench import stream_service
    from connectors.mosquitto import find_mosquitto

    refused = [o for o, v in (("--resume", args.resume), ("--stop-after", args.stop_after),
                              ("--no-refits", args.no_refits)) if v]  # fmt: skip
    if refused:
        print(f"cbo-agent bench stream: error: {refused[0]} is for the model-only run, not "
              "--service", file=sys.stderr)  # fmt: skip
        return 2
    if args.store is not None and args.store.exists():
        print(f"cbo-agent bench stream: error: --store {args.store} exists (it takes a new file)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.time_limit is not None and not args.time_limit > 0:
        print("cbo-agent bench stream: error: --time-limit must be positive", file=sys.stderr)
        return 2
    if args.pipeline > 64:
        print("cbo-agent bench stream: error: --pipeline is at most 64", file=sys.stderr)
        return 2
    if find_mosquitto() is None:
        print("cbo-agent bench stream: error: --service needs mosquitto on PATH", file=sys.stderr)
        return 2
    stream_service.run(
        args.rounds,
        args.json,
        capacity=args.capacity,
        budget=args.budget,
        batch=args.nodes,
        dim=args.dim,
        pipeline=args.pipeline,
        time_limit_s=args.time_limit,
        store_path=args.store,
        every=args.every,
    )
    return 0


def _drift(args: argparse.Namespace) -> int:
    from bench import drift
    from sim.registry import environment_names

    unknown = [m for m in args.models if m not in drift.MODELS]
    if unknown or args.env not in environment_names():
        what = f"unknown model {unknown[0]!r}" if unknown else f"unknown environment {args.env!r}"
        print(f"cbo-agent bench drift: error: {what}", file=sys.stderr)
        return 2
    options = {
        "capacity": args.capacity,
        "budget": args.budget,
        "window": args.window,
        "time_scale": args.time_scale,
        "period": args.period,
        "refit_every": args.refit_every,
        "initial": args.initial,
    }
    drift.run(
        args.env, args.models, args.seeds, args.rounds, args.json, options, workers=args.workers
    )
    return 0


def _add_drift(which: argparse._SubParsersAction) -> None:
    drift = which.add_parser(
        "drift",
        help="GP-UCB's cumulative (dynamic) regret: stationary, bounded, window, time, change",
    )
    drift.add_argument("--env", default="dropwave-drift", help="environment (default: drifting)")
    drift.add_argument("--models", nargs="+", default=["stationary", "window", "time"])
    drift.add_argument("--seeds", type=positive_int, default=3)
    drift.add_argument("--rounds", type=positive_int, default=300)
    drift.add_argument("--capacity", type=positive_int, default=100, help="of `bounded`")
    drift.add_argument("--budget", type=positive_int, default=60, help="of `bounded`")
    drift.add_argument("--window", type=positive_int, default=100, help="of `window`")
    drift.add_argument("--time-scale", type=float, default=100.0, help="of `time`: rounds per τ")
    drift.add_argument(
        "--period", type=positive_int, default=52, help="of `period`: rounds per period"
    )
    drift.add_argument("--refit-every", type=positive_int, default=20)
    drift.add_argument("--initial", type=positive_int, default=10, help="random rounds first")
    drift.add_argument("--json", type=Path, help="write the runs as JSON here")
    drift.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="runs at once, each a process on one torch thread (1)",
    )
    drift.set_defaults(handler=_drift)


def _add_stream(which: argparse._SubParsersAction) -> None:
    stream = which.add_parser(
        "stream",
        help="N readings per node through a bounded node GP (or, --service, through the agent on "
        "a broker): memory, update, refit",
    )
    stream.add_argument("--rounds", type=positive_int, default=100_000, help="readings per node")
    stream.add_argument("--capacity", type=positive_int, default=2000, help="exact up to")
    stream.add_argument("--budget", type=positive_int, default=1000, help="rows kept past it")
    stream.add_argument("--nodes", type=positive_int, default=3, help="node GPs (default 3)")
    stream.add_argument("--dim", type=positive_int, default=3, help="inputs per node (default 3)")
    stream.add_argument("--no-refits", action="store_true", help="do not time refits")
    stream.add_argument("--json", type=Path, help="write the checkpoints as JSON here")
    stream.add_argument(
        "--resume",
        action="store_true",
        help="continue the run of --json from its last checkpoint (its settings, its state)",
    )
    stream.add_argument(
        "--stop-after", type=positive_int, help="end at the first checkpoint at or past this"
    )
    stream.add_argument(
        "--service",
        action="store_true",
        help="through the running agent instead: a local Mosquitto (the shipped configuration), "
        "the agent in this process, devices publishing the same readings in another; update "
        "p50/p99 is then each reading's publication -> stored and learned, refit s a node's "
        "refit beside the loop, rss the agent's",
    )
    stream.add_argument(
        "--pipeline",
        type=positive_int,
        default=1,
        help="with --service: rounds in flight at once (the spec's schedule.pipeline, 1 to 64)",
    )
    stream.add_argument(
        "--store",
        type=Path,
        metavar="PATH",
        help="with --service: keep the agent's store (SQLite) here, a new file (default: a "
        "temporary one, removed)",
    )
    stream.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="with --service: end the run after this long (the checkpoints reached are kept)",
    )
    stream.add_argument(
        "--every",
        type=positive_int,
        metavar="K",
        help="with --service: a checkpoint every K rounds too (for the RSS slope per round)",
    )
    stream.set_defaults(handler=_stream)


def _add_gp_update(which: argparse._SubParsersAction) -> None:
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
    gp.add_argument(
        "--no-botorch",
        action="store_true",
        help="skip BoTorch's update and its check (its caches need ~10 GB at n = 4000, b = 8)",
    )
    _add_device(gp, several=True)
    gp.set_defaults(handler=_gp_update)


def _add_ingest(which: argparse._SubParsersAction) -> None:
    ingest = which.add_parser(
        "ingest", help="feedback throughput through Mosquitto (agent vs bare client), latency"
    )
    ingest.add_argument("--env", default="alpine2", help="environment of the readings")
    ingest.add_argument("--rounds", type=positive_int, default=1000, help="rounds of readings")
    ingest.add_argument(
        "--latency-envs",
        nargs="*",
        metavar="E",
        default=None,
        help="environments whose decision latency is measured ('all', the default: every one "
        "with a spec in examples/; none given: skip; with --repeat-index: none unless named)",
    )
    ingest.add_argument("--latency-rounds", type=positive_int, default=20)
    ingest.add_argument(
        "--repeats", type=positive_int, default=5, help="interleaved runs per side (5)"
    )
    ingest.add_argument(
        "--repeat-index",
        type=positive_int,
        metavar="I",
        help="run only the I-th of the --repeats pairs (1-based), as a piece of the table: "
        "write it with --json and put the pieces together with --merge",
    )
    ingest.add_argument(
        "--no-throughput",
        action="store_true",
        help="measure only the decision latencies (a piece of the table, with --json)",
    )
    ingest.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="PIECE",
        help="print (and with --json write) the table the pieces' JSON files make together; "
        "measures nothing",
    )
    ingest.add_argument("--json", type=Path, help="write the results as JSON here")
    _add_device(ingest)
    ingest.set_defaults(handler=_ingest)


def _add_latency(which: argparse._SubParsersAction) -> None:
    latency = which.add_parser(
        "latency",
        help="reading -> stored -> learned latency per message while refits run (p50/p99)",
    )
    latency.add_argument("--env", default="alpine2", help="environment of the readings")
    latency.add_argument(
        "--history", type=positive_int, default=1000, help="rounds learned before (n per node)"
    )
    latency.add_argument(
        "--rounds", type=positive_int, default=100, help="rounds whose readings are timed"
    )
    latency.add_argument("--rate", type=float, default=100.0, help="readings per second sent (100)")
    latency.add_argument("--repeats", type=positive_int, default=5, help="runs per mode (5)")
    latency.add_argument(
        "--modes",
        nargs="+",
        choices=["beside", "inline", "unfrozen"],
        default=["beside", "inline"],
        help="refits beside the loop (the service) and/or inside the batch (before); "
        "unfrozen: beside, without the service's gc.freeze (before it)",
    )
    latency.add_argument("--json", type=Path, help="write the results as JSON here")
    latency.set_defaults(handler=_latency)


def _add_decision(which: argparse._SubParsersAction) -> None:
    decision = which.add_parser(
        "decision", help="proposal time per round (p50, p95) on every shipped example"
    )
    decision.add_argument(
        "--env", nargs="+", metavar="E", help="environments (default: every one with a spec)"
    )
    decision.add_argument("--policy", help="policy for every environment (default: the spec's)")
    decision.add_argument("--rounds", type=positive_int, default=20, help="policy rounds (20)")
    decision.add_argument("--seed", type=int, default=0, help="episode seed (0)")
    decision.add_argument(
        "--setting",
        type=_policy_setting,
        action="append",
        default=[],
        metavar="[POLICY:]KEY=VALUE",
        help="policy setting, value parsed as YAML (POLICY: only where that policy runs); "
        "repeatable",
    )
    decision.add_argument("--threads", type=positive_int, help="torch threads (torch's default)")
    decision.add_argument("--json", type=Path, help="write the rows as JSON here")
    _add_device(decision)
    decision.set_defaults(handler=_decision)


def _trsm(args: argparse.Namespace) -> int:
    from bench import trsm

    trsm.run(args.sizes, args.reps, args.json)
    return 0


def _add_trsm(which: argparse._SubParsersAction) -> None:
    trsm = which.add_parser(
        "trsm", help="the GP's in-place triangular solve (cython_blas) beside torch's, per size"
    )
    trsm.add_argument("--sizes", type=int, nargs="+", default=[500, 2000, 4000])
    trsm.add_argument("--reps", type=positive_int, default=7, help="interleaved repeats (7)")
    trsm.add_argument("--json", type=Path, help="write the rows as JSON here")
    trsm.set_defaults(handler=_trsm)


def _add_chaos(which: argparse._SubParsersAction) -> None:
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
    chaos.add_argument("--rounds", type=positive_int, default=40, help="max_rounds R (40)")
    chaos.add_argument("--seed", type=int, default=0, help="when and how to disrupt (0)")
    chaos.add_argument("--policy", default="random", help="the agent's policy (random)")
    chaos.add_argument(
        "--no-forger", action="store_true", help="no forging device beside the real one"
    )
    chaos.add_argument(
        "--flood",
        type=int,
        default=20_000,
        help="invalid messages a flooding device publishes beside the real one (20000; 0: none)",
    )
    chaos.add_argument(
        "--flood-rate", type=float, default=200.0, help="the flood's messages per second (200)"
    )
    chaos.add_argument("--json", type=Path, help="write the results as JSON here")
    chaos.add_argument(
        "--workdir", type=Path, help="keep the spec, store, logs and broker data here"
    )
    chaos.set_defaults(handler=_chaos)


def _fleet(args: argparse.Namespace) -> int:
    from bench import fleet

    if _bad_device("fleet", [args.device]):
        return 2
    stores = args.store or ["sqlite"]
    for store in stores:
        if store != "sqlite" and not store.startswith(("postgresql://", "postgres://")):
            print(
                f"cbo-agent bench fleet: error: --store {store!r}: sqlite or postgresql://...",
                file=sys.stderr,
            )
            return 2
    rows = fleet.run(
        args.experiments,
        args.replicas,
        stores,
        args.json,
        lease_ttl_s=args.lease_ttl,
        window_s=args.window,
        workdir=args.workdir,
        device=args.device,
    )
    return 1 if any(row.audit_problems for row in rows) else 0


def _add_fleet(which: argparse._SubParsersAction) -> None:
    fleet = which.add_parser(
        "fleet",
        help="replicas of cbo-agent serve on one store: decisions/s, decision p95, memory per "
        "experiment, failover time; every run audited",
    )
    fleet.add_argument(
        "--experiments", type=positive_int, nargs="+", default=[10, 100], help="N (10 100)"
    )
    fleet.add_argument(
        "--replicas", type=positive_int, nargs="+", default=[1], help="R (1); R > 1 kills one"
    )
    fleet.add_argument(
        "--store",
        action="append",
        metavar="URL",
        help="sqlite (a new file per run) or a PostgreSQL administrative URL (a scratch "
        "database per run, dropped after it); repeatable (default sqlite)",
    )
    fleet.add_argument("--lease-ttl", type=float, default=5.0, help="lease TTL, seconds (5)")
    fleet.add_argument("--window", type=float, default=20.0, help="measured seconds (20)")
    fleet.add_argument(
        "--workdir", type=Path, default=Path("results/bench-fleet"), help="logs and stores"
    )
    fleet.add_argument("--json", type=Path, help="write the rows as JSON here")
    _add_device(fleet)
    fleet.set_defaults(handler=_fleet)


def _add_store(which: argparse._SubParsersAction) -> None:
    from bench.harness.postgres import DEFAULT_ADMIN_URL

    store = which.add_parser(
        "store",
        help="the store alone: rounds written per second and bytes per 1,000 rounds, "
        "SQLite beside PostgreSQL",
    )
    store.add_argument(
        "--spec",
        type=Path,
        default=Path("examples/alpine2.yaml"),
        help="the experiment whose rounds are written (examples/alpine2.yaml)",
    )
    store.add_argument("--rounds", type=positive_int, default=1000, help="rounds per run (1000)")
    store.add_argument(
        "--repeats", type=positive_int, default=5, help="runs per backend, interleaved (5)"
    )
    store.add_argument(
        "--backends",
        nargs="+",
        choices=["sqlite", "postgresql"],
        default=["sqlite", "postgresql"],
        help="(both)",
    )
    store.add_argument(
        "--postgres",
        default=DEFAULT_ADMIN_URL,
        metavar="URL",
        help="a PostgreSQL server's administrative URL: each run creates and drops a scratch "
        f"database there ({DEFAULT_ADMIN_URL})",
    )
    store.add_argument(
        "--workdir", type=Path, help="where the SQLite files go (the temporary directory)"
    )
    store.add_argument("--json", type=Path, help="write the rows as JSON here")
    store.set_defaults(handler=_store)


def _add_regret(which: argparse._SubParsersAction) -> None:
    regret = which.add_parser(
        "regret",
        help="regret curves of policies on simulated environments over seeds (JSON, table, PNG)",
    )
    regret.add_argument("--list", action="store_true", help="list environments and policies")
    regret.add_argument(
        "--env", nargs="+", metavar="E", help="environments (default: every one with a spec)"
    )
    regret.add_argument("--policy", nargs="+", metavar="P", help="policies (default: all)")
    regret.add_argument("--seeds", type=positive_int, default=20, help="seeds 0..N-1 (20)")
    regret.add_argument(
        "--rounds",
        type=positive_int,
        help="policy rounds (100; paper 001's budgeted domains: as many as the budget pays "
        "for at the cheapest trial, so the budget ends the run)",
    )
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
        "--workers", type=positive_int, help="parallel runs (default: the CPU count)"
    )
    regret.add_argument("--force", action="store_true", help="redo runs already saved in DIR")
    _add_device(regret)
    regret.set_defaults(handler=_regret)
