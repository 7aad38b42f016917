"""`cbo-agent bench latency`: reading → stored → learned, per message, while refits run.

The agent's experiment first holds H acknowledged rounds whose readings it has learned (n ≈ H
observations per node) and M more acknowledged rounds awaiting theirs. A publisher in another
process then sends the M rounds' readings through Mosquitto at a steady rate, each stamped with
the wall time just before it is published; the agent reports each batch once it is stored
durably and learned (`AgentService(on_learned=...)`). A reading's latency is the difference:
broker transit, the group-commit window, the SQLite commit and the GP update, and any wait
behind other work on the event loop.

The spec's model settings are the shipped defaults (`refit_every` 5, `misfit_z` 4): with n in
the thousands a refit is due after almost every round. The broker runs the shipped
configuration (`bench.harness.shipped_broker`). Two modes, interleaved over repeats:
  beside   refits run in a worker thread and are swapped in (`agent.refits`; the service's way);
  inline   refits run inside the batch that makes them due (the service before `agent.refits`);
  unfrozen beside, with the garbage collector as Python has it: no `gc.freeze` of what lives
           at the start (the service before `agent.runtime.freeze_long_lived`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import paho.mqtt.client as paho
from rich.console import Console

from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection
from agent.experiment import Experiment
from agent.paths import example_spec as example_spec_path
from agent.runtime import AgentService
from bench.harness.shipped_broker import shipped_broker
from bench.ingest import prepare_rounds
from bench.report import machine_info, print_table, wide_console, write_json
from connectors.mosquitto import MosquittoBroker
from connectors.schemas import Reading, encode
from connectors.store import Store
from connectors.topics import Topics
from core.spec import ExperimentSpec, load_spec

__all__ = ["LearnLatency", "run"]

MODES = ("beside", "inline", "unfrozen")
STALL_MS = 10.0  # loop stalls reported from this long
TOPICS = Topics()
WAIT_S = 300.0


@dataclass
class LearnLatency:
    """One run of one mode: per-reading latencies (ms) and what the model did meanwhile."""

    mode: str
    repeat: int
    observations: list[int]  # per node, when the measured readings started
    readings: int
    rate_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    transit_p50_ms: float  # publish -> routed by the agent: broker and client stack
    transit_p99_ms: float
    refits_installed: int  # results swapped in (beside: one per node refitted) in the window
    window_s: float = 0.0  # first reading published -> last one learned
    workers_alive_at_start: int = 0  # processes of earlier repeats still running at the start
    refits_started: int = 0  # jobs started in the window (each refits its due nodes in turn)
    fits_finished: int = 0  # fits the fit process finished in the window
    fits_ended: int = 0  # fits ended unfinished (at the service's stop)
    install_ms: list[float] = field(default_factory=list)  # the loop's time per install
    install_rows: list[int] = field(default_factory=list)  # rows appended/forgotten per install
    install_at_s: list[float] = field(default_factory=list)  # when, from the window's start
    # the process's garbage collections in the window: (s from the window's start, generation,
    # ms) — a collection stops every thread of the interpreter, the event loop's included
    gc_pauses: list[tuple[float, int, float]] = field(default_factory=list)
    # the event loop's stalls over STALL_MS in the window: (s from the window's start, ms) —
    # how much later than asked a 1 ms sleep woke (a batch's work on the loop, an install, a GC)
    loop_stalls: list[tuple[float, float]] = field(default_factory=list)
    latencies_ms: list[float] = field(repr=False, default_factory=list)
    # (published at, from the window's start, s; latency, ms) per reading: the timeline
    timeline: list[tuple[float, float]] = field(repr=False, default_factory=list)


def _spec(env: str, rounds: int) -> ExperimentSpec:
    """The example's spec with its default model settings (refits on), a random policy, and
    timeouts long enough that no prepared round closes before its readings come."""
    spec = load_spec(example_spec_path(env))
    return spec.model_copy(
        update={
            "name": "latency",
            "policy": spec.policy.model_copy(update={"name": "random", "settings": {}}),
            "schedule": spec.schedule.model_copy(
                update={"max_rounds": rounds, "round_timeout_s": 3600.0, "ack_timeout_s": 3600.0}
            ),
        }
    )


def _learn_history(spec: ExperimentSpec, store_path: Path, readings: list[Reading]) -> None:
    """Store and learn the history's readings (no refits: the service's first batch refits)."""
    with Store(store_path) as store:
        exp = Experiment(spec, store, background_refits=True)
        chunk = 600
        for start in range(0, len(readings), chunk):
            exp.on_readings(readings[start : start + chunk])


def _publish_paced(port: int, rows: list[dict], rate: float, topic: str) -> None:
    """Publish the readings at `rate` per second, each stamped just before it leaves (QoS 1).
    Runs in its own process, so its work does not share the agent's interpreter."""
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2, client_id="bench-latency-pub", protocol=paho.MQTTv5
    )
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        started = time.monotonic()
        infos = []
        for i, row in enumerate(rows):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            payload = encode(Reading(**{**row, "at": time.time()}))
            infos.append(client.publish(topic, payload, qos=1))
        for info in infos:
            info.wait_for_publish(timeout=60)
    finally:
        client.loop_stop()
        client.disconnect()


async def _measure(
    mode: str,
    repeat: int,
    env: str,
    history: int,
    measured: int,
    rate: float,
    broker: MosquittoBroker,
    workdir: Path,
) -> LearnLatency:
    spec = _spec(env, history + measured)
    store_path = workdir / f"latency-{mode}-{repeat}.sqlite"
    readings = await asyncio.to_thread(prepare_rounds, env, spec, store_path, repeat)
    await asyncio.to_thread(
        _learn_history, spec, store_path, [r for r in readings if r.round < history]
    )
    fresh = [r for r in readings if r.round >= history]
    latencies: list[float] = []
    transits: list[float] = []
    stamps: list[float] = []

    def learned(_: str, batch: list[tuple[Reading, float]], at: float) -> None:
        latencies.extend(1000.0 * (at - reading.at) for reading, _ in batch)
        transits.extend(1000.0 * (routed - reading.at) for reading, routed in batch)
        stamps.extend(reading.at for reading, _ in batch)

    # fit processes of earlier repeats still alive now would compete with this one for the cores
    alive = len(multiprocessing.active_children())
    pauses: list[tuple[float, int, float]] = []
    collecting: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            collecting[:] = [time.perf_counter()]
        elif collecting:
            ms = 1000.0 * (time.perf_counter() - collecting[0])
            pauses.append((time.time(), int(info.get("generation", -1)), ms))

    stalls: list[tuple[float, float]] = []

    async def watch_loop() -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(0.001)
            late_ms = 1000.0 * (time.perf_counter() - asked) - 1.0
            if late_ms >= STALL_MS:
                stalls.append((time.time(), late_ms))

    config = AgentConfig(
        agent_id=f"bench-latency-{mode}-{repeat}",
        broker=BrokerSection(url=broker.url),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(store_path)),
    )
    service = AgentService(
        config,
        [spec],
        on_learned=learned,
        background_refits=mode != "inline",
        freeze_gc=mode != "unfrozen",
    )
    task = asyncio.create_task(service.run())
    watcher = asyncio.create_task(watch_loop())
    gc.callbacks.append(on_gc)
    try:
        await _until(task, lambda: service.link.connected)
        observations = service.experiments[spec.name].model.gp.num_observations.tolist()
        refits = service.refits.get(spec.name)
        rows = [r.model_dump(mode="json") for r in fresh]
        publisher = multiprocessing.get_context("spawn").Process(
            target=_publish_paced,
            args=(broker.port, rows, rate, TOPICS.reading(spec.name, spec.actuator_id)),
            daemon=True,
        )
        publisher.start()
        await _until(task, lambda: len(latencies) >= len(fresh) or task.done())
        ended = time.time()
        await asyncio.to_thread(publisher.join, 30)
    finally:
        gc.callbacks.remove(on_gc)
        for running in (watcher, task):
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    # getattr: the same benchmark runs against the service before these counters existed
    worker = getattr(refits, "worker", None)
    window_start = min(stamps, default=ended)  # the first reading's publication
    window_s = ended - window_start
    installed = refits.installed if refits is not None else 0
    return LearnLatency(
        mode=mode,
        repeat=repeat,
        observations=observations,
        readings=len(latencies),
        rate_per_s=rate,
        p50_ms=_quantile(latencies, 0.50),
        p99_ms=_quantile(latencies, 0.99),
        max_ms=max(latencies, default=float("nan")),
        transit_p50_ms=_quantile(transits, 0.50),
        transit_p99_ms=_quantile(transits, 0.99),
        refits_installed=installed,
        window_s=window_s,
        workers_alive_at_start=alive,
        refits_started=refits.started if refits is not None else 0,
        fits_finished=getattr(worker, "fits", -1),
        fits_ended=getattr(worker, "ended", -1),
        install_ms=[1000.0 * s for s in getattr(refits, "install_seconds", [])],
        install_rows=list(getattr(refits, "install_rows", [])),
        install_at_s=[at - window_start for at in getattr(refits, "install_at", [])],
        gc_pauses=[
            (at - window_start, gen, ms) for at, gen, ms in pauses if window_start <= at <= ended
        ],
        loop_stalls=[(at - window_start, ms) for at, ms in stalls if window_start <= at <= ended],
        latencies_ms=latencies,
        timeline=[(at - window_start, ms) for at, ms in zip(stamps, latencies, strict=True)],
    )


async def _until(task: asyncio.Task, done, poll_s: float = 0.01) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if task.done():
            task.result()
            raise RuntimeError("the agent stopped before the benchmark condition held")
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached in time")
        await asyncio.sleep(poll_s)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(
    env: str = "alpine2",
    history: int = 1000,
    measured: int = 100,
    rate: float = 100.0,
    repeats: int = 5,
    modes: tuple[str, ...] = ("beside", "inline"),
    json_path: Path | None = None,
    console: Console | None = None,
) -> list[LearnLatency]:
    """`repeats` runs of each mode, interleaved (beside, inline, beside, ...)."""
    console = console or wide_console()
    shipped = shipped_broker()
    results: list[LearnLatency] = []
    with tempfile.TemporaryDirectory(prefix="cbo-latency-") as tmp:
        workdir = Path(tmp)
        with MosquittoBroker(workdir / "mosquitto", shipped.options(workdir)) as broker:
            for repeat in range(repeats):
                for mode in modes:
                    console.print(f"latency: {mode}, repeat {repeat + 1}/{repeats}")
                    results.append(
                        asyncio.run(
                            _measure(mode, repeat, env, history, measured, rate, broker, workdir)
                        )
                    )
    summary = []
    for mode in modes:
        runs = [r for r in results if r.mode == mode]
        p50s, p99s = [r.p50_ms for r in runs], [r.p99_ms for r in runs]
        summary.append(
            {
                "mode": mode,
                "runs": len(runs),
                "p50_ms_median": statistics.median(p50s),
                "p99_ms_median": statistics.median(p99s),
                "p99_ms_min": min(p99s),
                "p99_ms_max": max(p99s),
                "max_ms_max": max(r.max_ms for r in runs),
                "transit_p50_ms_median": statistics.median(r.transit_p50_ms for r in runs),
                "transit_p99_ms_median": statistics.median(r.transit_p99_ms for r in runs),
                "refits_installed_median": statistics.median(r.refits_installed for r in runs),
            }
        )
    observed = results[0].observations if results else []
    print_table(
        f"Reading -> stored -> learned latency, {env}, n = {observed} per node at start, "
        f"{measured} rounds at {rate:g} readings/s, {repeats} repeats per mode "
        f"({shipped.describe()})",
        [
            "mode",
            "p50 ms (median)",
            "p99 ms (median)",
            "p99 ms (min-max)",
            "max ms",
            "transit p50/p99 ms",
            "refits",
        ],
        [
            (
                s["mode"],
                s["p50_ms_median"],
                s["p99_ms_median"],
                f"{s['p99_ms_min']:.1f}-{s['p99_ms_max']:.1f}",
                s["max_ms_max"],
                f"{s['transit_p50_ms_median']:.1f}/{s['transit_p99_ms_median']:.1f}",
                s["refits_installed_median"],
            )
            for s in summary
        ],
        console,
    )
    print_table(
        "Per window: latency, and what the refits did in it",
        [
            "mode",
            "repeat",
            "window s",
            "p50 ms",
            "p99 ms",
            "max ms",
            "workers alive at start",
            "jobs started",
            "installed",
            "install ms (max)",
            "late rows (max)",
            "fits ended",
            "GCs (gen 2) / max ms",
            f"loop stalls >= {STALL_MS:g} ms / max ms",
        ],
        [
            (
                r.mode,
                r.repeat + 1,
                f"{r.window_s:.1f}",
                r.p50_ms,
                r.p99_ms,
                r.max_ms,
                r.workers_alive_at_start,
                r.refits_started,
                r.refits_installed,
                max(r.install_ms, default=float("nan")),
                max(r.install_rows, default=0),
                r.fits_ended,
                f"{len(r.gc_pauses)} ({sum(1 for p in r.gc_pauses if p[1] == 2)})"
                f" / {max((p[2] for p in r.gc_pauses), default=0.0):.1f}",
                f"{len(r.loop_stalls)} / {max((ms for _, ms in r.loop_stalls), default=0.0):.0f}",
            )
            for r in results
        ],
        console,
    )
    if json_path is not None:
        write_json(
            json_path,
            {
                "machine": machine_info(),
                "env": env,
                "history_rounds": history,
                "measured_rounds": measured,
                "rate_per_s": rate,
                "broker": shipped.describe(),
                "summary": summary,
                # each run's timeline: (published at s from the window's start, latency ms)
                "runs": [
                    {k: v for k, v in asdict(r).items() if k != "latencies_ms"} for r in results
                ],
            },
        )
        console.print(f"results: {json_path}")
    return results
