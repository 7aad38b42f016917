"""`cbo-agent bench ingest`: feedback throughput through a real Mosquitto, and decision latency.

Throughput. A local Mosquitto with the shipped configuration (`deploy/mosquitto/mosquitto.conf`:
its in-flight window, queue limits and persistence; `bench.harness.shipped_broker`) holds N
queued readings for each receiver's persistent session; each receiver then connects and drains
them, timed from the moment it is subscribed to the moment the last reading is handled:
  bare   an aiomqtt subscriber that only counts messages (the ceiling of the client stack);
  agent  the service: decode and validate, join to rounds, store durably (SQLite, fsync),
         update every node's GP (row appends), acknowledge — with the spec's default model
         settings, so refits run (beside the event loop) as they would in production.
The agent's experiment holds R acknowledged rounds (proposed in-process beforehand), and the
readings are those the environment produces for them, so every one is accepted and teaches.
Each side runs `repeats` times (5 by default), interleaved and alternating which goes first,
each run with a fresh session and a fresh copy of the prepared store; the table reports the
medians and the spread (min–max), and agent/bare per pair of runs. Beside the rates, the CPU
time of the benchmark's process per message during each drain: a rate depends on how much of the
cores the drain got, its CPU time hardly, so bare/agent CPU per message says what agent/bare
would be on cores of its own.

Decision latency. For each environment, the service runs K rounds against the simulator device
over the same broker; the latency of a round is the time from its last reading to the next action
leaving for the broker. Beside it: one "refit everything" round as the papers' code does it —
every node's hyperparameters fitted from scratch and its factor rebuilt — on the same final data.
The environments: those named, where "all" (the default) stands for every environment with a
spec in examples/ (13 with the shipped specs: roughly 5 minutes at K = 20 on an idle 2-core
machine, 10–12 when other work shares the cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import paho.mqtt.client as paho
import torch
from rich.console import Console

from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection
from agent.experiment import Experiment
from agent.paths import ExamplesNotFound
from agent.paths import example_spec as example_spec_path
from agent.rounds import RoundEvent
from agent.runtime import AgentService
from agent.tasks import stop_tasks
from bench.harness.shipped_broker import ShippedBroker, shipped_broker
from bench.report import (
    device_info,
    machine_info,
    print_table,
    progress_bar,
    wide_console,
    write_json,
)
from connectors.mosquitto import MosquittoBroker
from connectors.mqtt import BrokerConfig, MqttConnection
from connectors.schemas import Ack, Reading, encode
from connectors.store import Store
from connectors.topics import Topics
from core.hyperfit import fit_hyperparameters
from core.spec import ExperimentSpec, load_spec
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import environment_names, make_environment

TOPICS = Topics()
WAIT_S = 600.0
ALL = "all"  # stands for every environment with a spec in examples/


class QueueTooSmall(ValueError):
    """The shipped broker configuration cannot queue the readings the benchmark sends."""


class BadPieces(ValueError):
    """Pieces given to `merge` that are not pieces of one table (a user's mistake)."""


@dataclass
class IngestResult:
    """`repeats` interleaved runs of each side; rates in messages per second."""

    readings: int
    rounds: int
    nodes: int
    broker: str
    bare_runs: list[float]
    agent_runs: list[float]
    # CPU time of the benchmark's process per message while each run drained (ms): the
    # client's loop for bare; the agent's loop and its store/learn worker thread for agent (not
    # its fit process, which runs beside at a lower priority). Unlike the rates, this hardly
    # depends on how many other processes share the cores.
    bare_cpu_ms: list[float]
    agent_cpu_ms: list[float]
    # which repeat each pair of runs is (0-based: its side order, bare or agent first, and its
    # session names follow from it); a piece run alone (`--repeat-index`) holds one
    repeat_indices: list[int] = field(default_factory=list)
    load_average: list[float] = field(default_factory=list)  # 1-min load, each run's start

    @property
    def bare_msgs_per_s(self) -> float:
        return statistics.median(self.bare_runs)

    @property
    def agent_msgs_per_s(self) -> float:
        return statistics.median(self.agent_runs)

    @property
    def ratios(self) -> list[float]:
        """agent/bare of each pair of runs (the same repeat)."""
        return [a / b for a, b in zip(self.agent_runs, self.bare_runs, strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def cpu_ratio(self) -> float:
        """bare/agent CPU per message (medians): agent/bare throughput on cores of its own."""
        return statistics.median(self.bare_cpu_ms) / statistics.median(self.agent_cpu_ms)

    def summary(self) -> dict:
        return {
            **asdict(self),
            "bare_msgs_per_s": self.bare_msgs_per_s,
            "agent_msgs_per_s": self.agent_msgs_per_s,
            "ratios": self.ratios,
            "ratio": self.ratio,
            "cpu_ratio": self.cpu_ratio,
        }

    @classmethod
    def merged(cls, parts: Sequence[IngestResult]) -> IngestResult:
        """The pieces of one table (`--repeat-index` runs) as one result, in repeat order.

        Raises:
            BadPieces: the pieces measured different things (env, rounds, broker settings)
                or hold the same repeat twice.
        """
        if not parts:
            raise BadPieces("no throughput pieces to merge")
        first = parts[0]
        what = lambda r: (r.readings, r.rounds, r.nodes, r.broker)  # noqa: E731
        for part in parts[1:]:
            if what(part) != what(first):
                raise BadPieces(f"pieces measured different things: {what(first)} and {what(part)}")
        pairs = sorted(
            (
                (index, i, part)
                for part in parts
                for i, index in enumerate(part.repeat_indices or range(len(part.bare_runs)))
            ),
            key=lambda pair: pair[0],
        )
        indices = [index for index, _, _ in pairs]
        if len(set(indices)) != len(indices):
            raise BadPieces(f"a repeat appears twice among the pieces: {indices}")
        pick = lambda name: [getattr(p, name)[i] for _, i, p in pairs]  # noqa: E731
        loads = [p.load_average[i] if p.load_average else math.nan for _, i, p in pairs]
        return cls(
            first.readings,
            first.rounds,
            first.nodes,
            first.broker,
            pick("bare_runs"),
            pick("agent_runs"),
            pick("bare_cpu_ms"),
            pick("agent_cpu_ms"),
            indices,
            loads,
        )


@dataclass
class LatencyResult:
    env: str
    policy: str
    rounds: int
    decision_latency_p50_s: float
    decision_latency_p95_s: float
    decision_seconds_p50: float
    refit_everything_s: float
    device: str = "cpu"
    device_name: str = ""


# ---------------------------------------------------------------------- throughput
def _throughput_spec(env: str, rounds: int) -> ExperimentSpec:
    spec = load_spec(example_spec_path(env))
    return spec.model_copy(
        update={
            "name": "ingest",
            "policy": spec.policy.model_copy(update={"name": "random", "settings": {}}),
            "schedule": spec.schedule.model_copy(
                update={"max_rounds": rounds, "round_timeout_s": 3600.0, "ack_timeout_s": 3600.0}
            ),
        }
    )


def prepare_rounds(
    env_name: str, spec: ExperimentSpec, store_path: Path, seed: int, device: str = "cpu"
) -> list[Reading]:
    """R acknowledged rounds in the agent's store, and the readings the environment gives."""
    env = make_environment(env_name, seed)
    generator = torch.Generator().manual_seed(seed)
    readings: list[Reading] = []
    with Store(store_path) as store:
        exp = Experiment(spec, store, seed=seed, device=device)
        for seq in range(spec.schedule.max_rounds):
            live = exp.propose()
            exp.mark_published(live.number)
            exp.on_ack(
                Ack(
                    experiment=spec.name,
                    round=live.number,
                    action_id=live.action.action_id,
                    device_id=spec.actuator_id,
                    status="applied",
                    reason=None,
                    applied=live.intervention,
                    at=time.time(),
                )
            )
            values = env.step(live.intervention, generator)
            readings += [
                Reading(
                    experiment=spec.name,
                    round=live.number,
                    node=node,
                    value=value,
                    seq=seq,
                    device_id=spec.actuator_id,  # the spec's one device: its topic below
                    at=time.time(),
                )
                for node, value in values.items()
            ]
    return readings


def _fill(port: int, payloads: list[bytes], topic: str) -> None:
    """Publish every payload with QoS 1 and wait for the broker to have them all."""
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2, client_id="bench-filler", protocol=paho.MQTTv5
    )
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [client.publish(topic, payload, qos=1) for payload in payloads]
        for info in infos:
            info.wait_for_publish(timeout=60)
    finally:
        client.loop_stop()
        client.disconnect()


def _session_config(port: int, client_id: str) -> BrokerConfig:
    return BrokerConfig(
        host="127.0.0.1",
        port=port,
        client_id=client_id,
        protocol="5",
        clean_start=False,
        session_expiry_s=600,
    )


async def _bare_rate(
    port: int, payloads: list[bytes], topic: str, client_id: str
) -> tuple[float, float]:
    """Messages per second, and CPU ms per message."""
    config = _session_config(port, client_id)
    async with MqttConnection(config) as connection:
        await connection.subscribe(topic)
    await asyncio.to_thread(_fill, port, payloads, topic)
    async with MqttConnection(config) as connection:
        started, cpu, count = time.perf_counter(), time.process_time(), 0
        async for _ in connection.messages():
            count += 1
            if count == len(payloads):
                break
        cpu_ms = 1e3 * (time.process_time() - cpu) / count
        return count / (time.perf_counter() - started), cpu_ms


async def _agent_rate(
    port: int,
    spec: ExperimentSpec,
    store_path: Path,
    payloads: list[bytes],
    agent_id: str,
    device: str = "cpu",
) -> tuple[float, float]:
    """Messages per second, and CPU ms per message (see `IngestResult.agent_cpu_ms`)."""
    config = AgentConfig(
        agent_id=agent_id,
        device=device,
        broker=BrokerSection(url=f"mqtt://127.0.0.1:{port}"),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(store_path)),
    )
    # A first, short life creates the agent's persistent session and subscriptions.
    await _run_until(AgentService(config, [spec]), lambda service: service.link.connected)
    await asyncio.to_thread(_fill, port, payloads, TOPICS.reading(spec.name, spec.actuator_id))
    service = AgentService(config, [spec])
    marks: dict[str, float] = {}

    def drained(current: AgentService) -> bool:
        if "start" not in marks and current.link.connected:
            marks["start"], marks["cpu"] = time.perf_counter(), time.process_time()
        handled = sum(
            current.handled[(spec.name, "reading", outcome)]
            for outcome in ("accepted", "late", "duplicate")
        )
        return handled >= len(payloads)

    await _run_until(service, drained, poll_s=0.002)
    wall, cpu = time.perf_counter() - marks["start"], time.process_time() - marks["cpu"]
    return len(payloads) / wall, 1e3 * cpu / len(payloads)


async def _run_until(service: AgentService, done, poll_s: float = 0.01) -> None:
    task = asyncio.create_task(service.run())
    try:
        deadline = time.monotonic() + WAIT_S
        while not (service.experiments and done(service)):
            if task.done():
                task.result()
                raise RuntimeError("the agent stopped before the benchmark condition held")
            if time.monotonic() > deadline:
                raise TimeoutError("benchmark condition not reached in time")
            await asyncio.sleep(poll_s)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def measure_throughput(
    env: str,
    rounds: int,
    broker: MosquittoBroker,
    workdir: Path,
    shipped: ShippedBroker,
    repeats: int = 5,
    seed: int = 0,
    device: str = "cpu",
    only: int | None = None,
) -> IngestResult:
    """`repeats` runs of each side, interleaved, alternating which side goes first; with
    `only`, just that repeat's pair (0-based), in the order the full run gives it — a piece
    of the table that `IngestResult.merged` puts together with the others."""
    spec = _throughput_spec(env, rounds)
    prepared = workdir / "ingest-prepared.sqlite"
    readings = await asyncio.to_thread(prepare_rounds, env, spec, prepared, seed, device)
    limit = shipped.max_queued_messages
    if limit and len(readings) > limit:
        raise QueueTooSmall(
            f"the shipped broker configuration queues at most {limit} messages per session "
            f"(max_queued_messages in {shipped.path}); {rounds} rounds of {env} send "
            f"{len(readings)}: use --rounds {limit // max(len(readings) // rounds, 1)} or fewer"
        )
    payloads = [encode(reading) for reading in readings]
    bare_runs: list[float] = []
    agent_runs: list[float] = []
    bare_cpu: list[float] = []
    agent_cpu: list[float] = []
    indices = list(range(repeats)) if only is None else [only]
    loads: list[float] = []
    for repeat in indices:
        loads.append(os.getloadavg()[0])

        async def bare(repeat: int = repeat) -> None:
            topic = TOPICS.reading(spec.name, spec.actuator_id)
            rate, cpu_ms = await _bare_rate(broker.port, payloads, topic, f"bench-bare-{repeat}")
            bare_runs.append(rate)
            bare_cpu.append(cpu_ms)

        async def agent(repeat: int = repeat) -> None:
            store_path = workdir / f"ingest-{repeat}.sqlite"
            await asyncio.to_thread(shutil.copyfile, prepared, store_path)
            rate, cpu_ms = await _agent_rate(
                broker.port, spec, store_path, payloads, f"bench-agent-{repeat}", device
            )
            agent_runs.append(rate)
            agent_cpu.append(cpu_ms)

        for side in (bare, agent) if repeat % 2 == 0 else (agent, bare):
            await side()
    return IngestResult(
        len(payloads),
        rounds,
        len(spec.nodes),
        shipped.describe(),
        bare_runs,
        agent_runs,
        bare_cpu,
        agent_cpu,
        indices,
        loads,
    )


# ---------------------------------------------------------------------- decision latency
async def measure_latency(
    env_name: str,
    rounds: int,
    broker: MosquittoBroker,
    workdir: Path,
    seed: int = 0,
    device: str = "cpu",
) -> LatencyResult:
    spec = load_spec(example_spec_path(env_name))
    spec = spec.model_copy(
        update={
            "name": f"latency-{env_name}",
            "schedule": spec.schedule.model_copy(update={"max_rounds": rounds}),
            "initial_design": spec.initial_design.model_copy(
                update={"rounds": min(2 * (len(spec.actions) + 1), rounds // 2)}
            ),
        }
    )
    env = make_environment(env_name, seed)
    device = SimulatorDevice(
        env,
        BrokerConfig(host="127.0.0.1", port=broker.port),
        DeviceSettings(experiment=spec.name, seed=seed),
    )
    events: list[RoundEvent] = []
    config = AgentConfig(
        agent_id=f"latency-{env_name}",
        device=device,
        broker=BrokerSection(url=broker.url),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(workdir / f"{env_name}.db")),
    )
    service = AgentService(config, [spec], on_event=events.append)
    device_task = asyncio.create_task(device.run())
    try:
        await asyncio.wait_for(device.ready.wait(), 30)
        await asyncio.wait_for(service.run(), WAIT_S)
    finally:
        await stop_tasks([device_task])
    policy_rounds = [
        e for e in events if e.round is not None and e.round >= spec.initial_design.rounds
    ]
    latencies = [
        e.decision_latency_s
        for e in policy_rounds
        if e.kind == "published" and e.decision_latency_s is not None
    ]
    decisions = [
        e.decision_seconds
        for e in policy_rounds
        if e.kind == "proposed" and e.decision_seconds is not None
    ]
    refit = await asyncio.to_thread(refit_everything_seconds, service.experiments[spec.name])
    return LatencyResult(
        env_name,
        spec.policy.name,
        rounds,
        _quantile(latencies, 0.5),
        _quantile(latencies, 0.95),
        _quantile(decisions, 0.5),
        refit,
        **device_info(device),
    )


def refit_everything_seconds(experiment: Experiment) -> float:
    """One round of the papers' approach on this data: fit every node from scratch, refactor."""
    gp = experiment.model.gp
    started = time.perf_counter()
    for j in range(gp.batch):
        z, y = gp.member_data(j)
        if y.numel() < 2:
            continue
        y_std = (y - y.mean()) / y.std().clamp_min(1e-9)
        fit_hyperparameters(
            z, y_std, kernel=gp.config.kernel, priors=gp.config.priors, known_noise=None
        )
    gp.rebuild()
    return time.perf_counter() - started


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def latency_env_names(names: Sequence[str] | None = None) -> list[str]:
    """The environments to measure, in the order given; `ALL` ("all") among them, or None,
    stands for every registered environment with a spec in examples/, in the registry's order.

    Raises:
        ValueError: a name is neither "all" nor an environment with a spec (checked before any
            measurement starts, so a typo does not cost the throughput run).
    """
    known = environment_names()
    with_spec = [name for name in known if _has_spec(name)]
    chosen: list[str] = []
    for name in [ALL] if names is None else names:
        for each in with_spec if name == ALL else [name]:
            if each not in chosen:
                chosen.append(each)
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise ValueError(f"unknown environment(s) {unknown}; known: {', '.join(known)}, {ALL}")
    missing = [n for n in chosen if n not in with_spec]
    if missing:
        raise ValueError(f"no spec in examples/ for {missing}")
    return chosen


def _has_spec(name: str) -> bool:
    try:
        example_spec_path(name)
    except ExamplesNotFound:
        return False
    return True


# ---------------------------------------------------------------------- command
def run(
    env: str = "alpine2",
    rounds: int = 1000,
    latency_envs: list[str] | None = None,
    latency_rounds: int = 20,
    json_path: Path | None = None,
    console: Console | None = None,
    repeats: int = 5,
    device: str = "cpu",
    repeat_index: int | None = None,
    throughput: bool = True,
) -> tuple[IngestResult | None, list[LatencyResult]]:
    """Throughput of `rounds` rounds of `env` (`repeats` runs per side), then the latency of
    each of `latency_envs` (see `latency_env_names`: None or "all" = every environment with a
    spec; [] = none).

    A table too long for one sitting runs in pieces, each with its own `json_path`, put
    together by `merge`: `repeat_index` (0-based, below `repeats`) runs only that repeat's
    pair of runs; `throughput` False runs only the decision latencies.

    Raises:
        QueueTooSmall: the shipped broker configuration cannot queue that many readings.
    """
    console = console or wide_console()
    latency_envs = latency_env_names(latency_envs)
    if repeat_index is not None and not 0 <= repeat_index < repeats:
        raise BadPieces(f"repeat index {repeat_index + 1} is not among 1..{repeats}")
    shipped = shipped_broker()
    result: IngestResult | None = None
    with tempfile.TemporaryDirectory(prefix="cbo-ingest-") as tmp:
        workdir = Path(tmp)
        with (
            MosquittoBroker(workdir / "mosquitto", shipped.options(workdir)) as broker,
            progress_bar(console) as progress,
        ):
            task = progress.add_task("ingest", total=int(throughput) + len(latency_envs))
            if throughput:
                result = asyncio.run(
                    measure_throughput(
                        env,
                        rounds,
                        broker,
                        workdir,
                        shipped,
                        repeats,
                        device=device,
                        only=repeat_index,
                    )
                )
                progress.advance(task)
            latencies = []
            for name in latency_envs:
                progress.update(task, description=f"latency {name}")
                latencies.append(
                    asyncio.run(
                        measure_latency(name, latency_rounds, broker, workdir, device=device)
                    )
                )
                progress.advance(task)
    where = device_info(device)
    report(result, latencies, where, console)
    if json_path is not None:
        write_json(
            json_path,
            {
                "machine": machine_info(device),
                "load_average": os.getloadavg(),  # at the end of the run
                "ingest": None if result is None else {**result.summary(), **where},
                "decision_latency": [asdict(r) for r in latencies],
            },
        )
        console.print(f"results: {json_path}")
    return result, latencies


def merge(
    paths: Sequence[Path], json_path: Path | None = None, console: Console | None = None
) -> tuple[IngestResult | None, list[LatencyResult]]:
    """Put the pieces' JSON files (`run` with `repeat_index`, or latencies only) together
    into one table: throughput pairs in repeat order, latencies in the pieces' order.

    Raises:
        BadPieces: a file is not a piece's JSON, or the pieces are not of one table (different
            env, rounds, broker settings or device; a repeat or an environment twice).
    """
    console = console or wide_console()
    pieces = []
    for path in paths:
        try:
            pieces.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as error:
            raise BadPieces(f"{path}: not a bench ingest JSON file ({error})") from None
    throughputs, latencies, devices = [], [], set()
    for path, piece in zip(paths, pieces, strict=True):
        if not isinstance(piece, dict) or "decision_latency" not in piece:
            raise BadPieces(f"{path}: not a bench ingest JSON file")
        ingest = piece.get("ingest")
        if ingest is not None:
            devices.add((ingest.get("device"), ingest.get("device_name")))
            fields = {f for f in IngestResult.__dataclass_fields__ if f in ingest}
            throughputs.append(IngestResult(**{f: ingest[f] for f in fields}))
        latencies += [LatencyResult(**row) for row in piece["decision_latency"]]
    envs = [r.env for r in latencies]
    if len(set(envs)) != len(envs):
        raise BadPieces(f"an environment's decision latency appears twice: {envs}")
    if len(devices) > 1:
        raise BadPieces(f"pieces measured on different devices: {sorted(devices)}")
    result = IngestResult.merged(throughputs) if throughputs else None
    device, name = next(iter(devices)) if devices else ("cpu", "")
    where = {"device": device or "cpu", "device_name": name or ""}
    report(result, latencies, where, console)
    if json_path is not None:
        write_json(
            json_path,
            {
                "machine": pieces[0].get("machine"),
                "pieces": [str(path) for path in paths],
                "load_average": [piece.get("load_average") for piece in pieces],
                "ingest": None if result is None else {**result.summary(), **where},
                "decision_latency": [asdict(r) for r in latencies],
            },
        )
        console.print(f"results: {json_path}")
    return result, latencies


def report(
    throughput: IngestResult | None,
    latencies: list[LatencyResult],
    where: dict[str, str],
    console: Console,
) -> None:
    """The throughput table (if measured) and the decision-latency table (if any)."""
    spread = lambda runs: f"{min(runs):,.0f}-{max(runs):,.0f}"  # noqa: E731
    if throughput is not None:
        loads = [x for x in throughput.load_average if not math.isnan(x)]
        load = f"; load {min(loads):.1f}-{max(loads):.1f}" if loads else ""
        print_table(
            f"Feedback ingest through Mosquitto ({throughput.readings} readings, "
            f"{throughput.rounds} rounds of {throughput.nodes} nodes; "
            f"{len(throughput.bare_runs)} interleaved runs per side, medians; "
            f"{throughput.broker}; models on {where['device']}: {where['device_name']}{load})",
            [
                "bare msgs/s",
                "(min-max)",
                "agent msgs/s",
                "(min-max)",
                "agent/bare",
                "(min-max)",
                "CPU ms/msg bare",
                "CPU ms/msg agent",
                "CPU bare/agent",
            ],
            [
                (
                    throughput.bare_msgs_per_s,
                    spread(throughput.bare_runs),
                    throughput.agent_msgs_per_s,
                    spread(throughput.agent_runs),
                    throughput.ratio,
                    f"{min(throughput.ratios):.2f}-{max(throughput.ratios):.2f}",
                    statistics.median(throughput.bare_cpu_ms),
                    statistics.median(throughput.agent_cpu_ms),
                    throughput.cpu_ratio,
                )
            ],
            console,
        )
    if latencies:
        print_table(
            "Decision latency (last reading of a round -> next action published)",
            [
                "device",
                "env",
                "policy",
                "rounds",
                "p50 s",
                "p95 s",
                "policy p50 s",
                "refit-everything s",
            ],
            [
                (
                    r.device,
                    r.env,
                    r.policy,
                    r.rounds,
                    r.decision_latency_p50_s,
                    r.decision_latency_p95_s,
                    r.decision_seconds_p50,
                    r.refit_everything_s,
                )
                for r in latencies
            ],
            console,
        )
