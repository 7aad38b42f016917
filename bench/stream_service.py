"""`cbo-agent bench stream --service`: the stream's readings through the running agent.

The same readings as the model-only run (`bench.stream.stream_readings`: N rounds of one
reading per node, inputs half uniform and half near one point) go through the service as a
device would send them, over a local Mosquitto with the shipped configuration:

- the spec (`stream_spec`): one node X<i> per node GP, no parents, fed by `dim` soft actions
  a<i>_<j> in [0, 1], so node i's GP sees (its actions) -> its reading, the model-only run's
  (inputs) -> (output); the reward is X0; the `random` policy (a decision costs little, so the
  agent's own work is what is measured); the model's shipped defaults (refits every 5 readings
  and on a misfit, beside the event loop) with `model.capacity` and `model.budget`;
- the devices, in a process of their own (`_devices`): an actuator that, for the action of
  round t, acknowledges what it "applied" — round t's inputs of the stream, which the agent
  stores and learns from in place of what it asked for (docs/protocol.md, `cbo.ack`:
  `applied`) — and one sensor per node that publishes round t's reading of that node;
- the agent, `AgentService` in this process (as `bench latency` and `bench ingest` run it):
  its event loop, its store (SQLite, fsync), its refits beside the loop in its fit process.

At each checkpoint (the model-only run's) a row like the model-only run's, with `mode`
"service": the rows the widest node holds, the resident memory of this process (the agent;
its fit process is a child and reported beside, `fit_rss_mb`), the p50 and p99 since the
previous checkpoint of each reading's latency from the device's publication (its `at`) to
stored and learned (`AgentService(on_learned=...)`: broker transit, group commit, SQLite, the
GP update, any wait on the loop), and the median of the refits' fit seconds installed in that
window (the agent's own refits, beside the loop; None when none was). Each window also
records, in `windows`, its readings per second, the mean GP update the agent measured
(`cbo_gp_update_seconds`), refits installed and the load average. The JSON is written at every
checkpoint, so a run cut off by a time limit keeps what it measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import paho.mqtt.client as paho
import psutil
from rich.console import Console

from agent.config import AgentConfig, BrokerSection, MetricsSection, StoreSection
from agent.runtime import AgentService
from bench.harness.shipped_broker import shipped_broker
from bench.report import machine_info, print_table, wide_console, write_json
from bench.stream import Checkpoint, checkpoints, flat_after_budget, stream_readings
from connectors.mosquitto import MosquittoBroker
from connectors.schemas import Ack, Action, Reading, decode, encode
from connectors.topics import Topics
from core.gp.bounded import BoundedGP
from core.spec import ExperimentSpec

__all__ = ["ServiceWindow", "run", "stream_spec"]

EXPERIMENT = "stream"
ACTUATOR = "stream-actuator"
TOPICS = Topics()
START_S = 120.0  # to connect and subscribe, agent and devices
STALL_S = 300.0  # no reading learned for this long: the run is stuck, end it
ACKS_KEPT = 128  # acks remembered for re-published actions (more than the rounds in flight)


def _sensor(node: int) -> str:
    return f"stream-sensor-{node}"


def stream_spec(
    rounds: int,
    batch: int,
    dim: int,
    capacity: int | None,
    budget: int | None,
    pipeline: int = 1,
) -> ExperimentSpec:
    """The experiment the devices serve: see the module."""
    nodes = [f"X{i}" for i in range(batch)]
    return ExperimentSpec.model_validate(
        {
            "name": EXPERIMENT,
            "intervention": "soft",
            # y in [-1, 4] before noise (`stream_readings`)
            "nodes": [{"name": n, "bounds": [-2.0, 5.0], "noise_std": 0.1} for n in nodes],
            "actions": [
                {"name": f"a{i}_{j}", "targets": [n], "bounds": [0.0, 1.0], "cost": 0.0}
                for i, n in enumerate(nodes)
                for j in range(dim)
            ],
            "reward": {"node": nodes[0]},
            "model": {"capacity": capacity, "budget": budget},
            "policy": {"name": "random"},
            "initial_design": {"rounds": 0},
            "schedule": {
                "max_rounds": rounds,
                "pipeline": pipeline,
                "round_timeout_s": 3600.0,
                "ack_timeout_s": 3600.0,
            },
            "devices": [
                {"id": ACTUATOR, "actuator": True},
                *({"id": _sensor(i), "nodes": [n]} for i, n in enumerate(nodes)),
            ],
        }
    )


def _devices(port: int, rounds: int, batch: int, dim: int, seed: int, ready) -> None:
    """The actuator and the sensors (one MQTT client, each message under its device's id):
    for the action of round t, the ack with round t's inputs as applied, then each node's
    reading of round t. Sets `ready` (a multiprocessing Event) once subscribed; runs in its
    own process until the parent ends it."""
    x, y = stream_readings(rounds, batch, dim, seed)
    x, y = x.tolist(), y.tolist()
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2, client_id="bench-stream-devices", protocol=paho.MQTTv5
    )
    client.max_inflight_messages_set(1000)
    acked: dict[str, bytes] = {}  # action id -> its ack, to acknowledge a re-publish again

    def on_action(_client, _userdata, message) -> None:
        action = decode(message.payload)
        if not isinstance(action, Action) or not 0 <= action.round < rounds:
            return
        if action.action_id in acked:  # a re-publish: the same ack, not applied again
            client.publish(TOPICS.ack(EXPERIMENT, ACTUATOR), acked[action.action_id], qos=1)
            return
        t = action.round
        applied = {f"a{i}_{j}": x[t][i][j] for i in range(batch) for j in range(dim)}
        ack = encode(
            Ack(
                experiment=EXPERIMENT,
                round=t,
                action_id=action.action_id,
                device_id=ACTUATOR,
                status="applied",
                applied=applied,
                at=time.time(),
            )
        )
        acked[action.action_id] = ack
        while len(acked) > ACKS_KEPT:  # the oldest first (dicts keep their order)
            del acked[next(iter(acked))]
        client.publish(TOPICS.ack(EXPERIMENT, ACTUATOR), ack, qos=1)
        for i in range(batch):
            reading = Reading(
                experiment=EXPERIMENT,
                round=t,
                node=f"X{i}",
                value=y[t][i],
                seq=t,
                device_id=_sensor(i),
                at=time.time(),
            )
            client.publish(TOPICS.reading(EXPERIMENT, _sensor(i)), encode(reading), qos=1)

    def on_connect(_client, _userdata, _flags, _reason, _properties) -> None:
        client.subscribe(TOPICS.action(EXPERIMENT, ACTUATOR), qos=1)

    client.on_message = on_action
    client.on_connect = on_connect
    client.on_subscribe = lambda *_: ready.set()
    client.connect("127.0.0.1", port)
    client.loop_forever()


@dataclass
class ServiceWindow:
    """What else the service did between the previous checkpoint and checkpoint n."""

    n: int
    readings_per_s: float  # readings (all nodes) learned per second of the window
    gp_update_mean_ms: float  # the agent's own measure of its GP updates (a batch each)
    refits_installed: int
    fit_rss_mb: float | None  # the agent's fit process (None: not running)
    load_average: float  # 1-minute, at the checkpoint
    # the agent's per-round records in memory at the checkpoint: `Experiment.rounds`, the
    # model's history (`len` where it is a plain list, before issue 22's bound) and the
    # rewards it keeps (`NetworkModel.observed_rewards`)
    rounds_held: int = 0
    history_held: int = 0
    rewards_held: int = 0


class _Recorder:
    """Turns the agent's learned batches into checkpoints (on the event loop)."""

    def __init__(self, service: AgentService, batch: int, marks: list[int], save) -> None:
        self.service, self.batch, self.save = service, batch, save
        self.marks = list(marks)
        self.rows: list[Checkpoint] = []
        self.windows: list[ServiceWindow] = []
        self.latencies: list[float] = []
        self.learned = 0  # readings, all nodes
        self.last_learned_at = time.monotonic()
        self._window_start = time.monotonic()
        self._fits_seen = 0
        self._installed_seen = 0
        self._updates = (0.0, 0.0)  # (count, sum) of cbo_gp_update_seconds

    @property
    def n(self) -> int:
        return self.learned // self.batch

    def on_learned(self, _experiment: str, batch: list[tuple[Reading, float]], at: float) -> None:
        self.latencies.extend(1000.0 * (at - reading.at) for reading, _ in batch)
        self.learned += len(batch)
        self.last_learned_at = time.monotonic()
        while self.marks and self.n >= self.marks[0]:
            self._checkpoint(self.marks.pop(0))

    def _gp_updates(self) -> tuple[float, float]:
        registry = self.service.metrics.registry
        labels = {"experiment": EXPERIMENT}
        count = registry.get_sample_value("cbo_gp_update_seconds_count", labels) or 0.0
        total = registry.get_sample_value("cbo_gp_update_seconds_sum", labels) or 0.0
        return count, total

    def _checkpoint(self, mark: int) -> None:
        exp = self.service.experiments[EXPERIMENT]
        gp = exp.model.gp
        refits = self.service.refits.get(EXPERIMENT)
        # the fits since the last checkpoint: the refits keep only their latest records
        fits_total = getattr(refits, "fits_installed", 0)
        recent = list(getattr(refits, "fit_seconds", []))
        fits = recent[len(recent) - min(fits_total - self._fits_seen, len(recent)) :]
        installed = (refits.installed if refits is not None else 0) - self._installed_seen
        self._fits_seen = fits_total
        self._installed_seen += installed
        lat = self.latencies or [float("nan")]
        cuts = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
        self.rows.append(
            Checkpoint(
                n=mark,
                rows=int(gp.num_observations.max()),
                rss_mb=psutil.Process().memory_info().rss / 2**20,
                update_p50_ms=statistics.median(lat),
                update_p99_ms=cuts[98],
                refit_s=statistics.median(fits) if fits else None,
                switched=isinstance(gp, BoundedGP) and all(gp.switched),
                mode="service",
            )
        )
        count, total = self._gp_updates()
        before_count, before_total = self._updates
        self._updates = (count, total)
        now = time.monotonic()
        self.windows.append(
            ServiceWindow(
                n=mark,
                readings_per_s=len(self.latencies) / max(now - self._window_start, 1e-9),
                gp_update_mean_ms=1e3 * (total - before_total) / max(count - before_count, 1),
                refits_installed=installed,
                fit_rss_mb=_fit_rss_mb(self.service),
                load_average=os.getloadavg()[0],
                rounds_held=len(exp.rounds),
                history_held=getattr(exp.model.history, "held", len(exp.model.history)),
                rewards_held=len(exp.model.observed_rewards),
            )
        )
        self.latencies = []
        self._window_start = now
        self.save()


def _fit_rss_mb(service: AgentService) -> float | None:
    pid = service._fit_worker.pid  # the agent's fit process: its memory is reported beside
    if pid is None:
        return None
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).memory_info().rss / 2**20
    return None


async def _serve(
    spec: ExperimentSpec,
    broker: MosquittoBroker,
    store_path: Path,
    recorder_for,
    devices: multiprocessing.Process,
    ready,
    time_limit_s: float | None,
) -> _Recorder:
    config = AgentConfig(
        agent_id="bench-stream",
        broker=BrokerSection(url=broker.url),
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(store_path)),
    )
    service = AgentService(config, [spec])
    recorder = recorder_for(service)
    service.on_learned = recorder.on_learned
    # the devices listen before the agent proposes its first round (an action published to
    # nobody is lost, and the agent would wait for its ack timeout)
    devices.start()
    if not await asyncio.to_thread(ready.wait, START_S):
        raise TimeoutError("the devices did not subscribe to their actions")
    task = asyncio.create_task(service.run())
    started = time.monotonic()
    recorder.last_learned_at = started
    try:
        while not task.done() and recorder.marks:
            if time_limit_s is not None and time.monotonic() - started > time_limit_s:
                break
            if time.monotonic() - recorder.last_learned_at > STALL_S:
                raise TimeoutError(f"no reading learned for {STALL_S:.0f} s")
            await asyncio.sleep(0.1)
        if task.done():
            task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return recorder


def run(
    rounds: int,
    json_path: Path | None,
    *,
    capacity: int | None = 2000,
    budget: int | None = 1000,
    batch: int = 3,
    dim: int = 3,
    seed: int = 0,
    pipeline: int = 1,
    time_limit_s: float | None = None,
    store_path: Path | None = None,
    console: Console | None = None,
    every: int | None = None,
) -> tuple[list[Checkpoint], list[ServiceWindow]]:
    """Feed `rounds` readings per node through the agent; print and save the checkpoints (at
    every one, when `json_path` is given). `time_limit_s` ends the run early (what was
    measured stays); `store_path` keeps the agent's store (SQLite) there, a new file; `every`
    adds a checkpoint every that many rounds (the agent's RSS per round needs more points than
    the geometric ladder gives)."""
    console = console or wide_console()
    spec = stream_spec(rounds, batch, dim, capacity, budget, pipeline)
    marks = checkpoints(rounds, capacity)
    if every is not None:
        marks = sorted({*marks, *range(every, rounds, every)})
    shipped = shipped_broker()
    began = time.perf_counter()
    recorder: _Recorder | None = None

    def save() -> None:
        if json_path is None or recorder is None:
            return
        write_json(
            json_path,
            {
                "machine": machine_info(),
                "mode": "service",
                "load_average": os.getloadavg(),
                "rounds": rounds,
                "batch": batch,
                "dim": dim,
                "capacity": capacity,
                "budget": budget,
                "seed": seed,
                "pipeline": pipeline,
                "every": every,
                "seconds": time.perf_counter() - began,
                "reached": recorder.n,  # readings per node learned when this was written
                "broker": shipped.describe(),
                "flat_after_budget": flat_after_budget(recorder.rows, budget),
                "checkpoints": [asdict(r) for r in recorder.rows],
                "windows": [asdict(w) for w in recorder.windows],
            },
        )

    def recorder_for(service: AgentService) -> _Recorder:
        nonlocal recorder
        recorder = _Recorder(service, batch, marks, save)
        return recorder

    with tempfile.TemporaryDirectory(prefix="cbo-stream-") as tmp:
        workdir = Path(tmp)
        with MosquittoBroker(workdir / "mosquitto", shipped.options(workdir)) as broker:
            spawn = multiprocessing.get_context("spawn")
            ready = spawn.Event()
            devices = spawn.Process(
                target=_devices, args=(broker.port, rounds, batch, dim, seed, ready), daemon=True
            )
            try:
                asyncio.run(
                    _serve(spec, broker, store_path or workdir / "agent.sqlite", recorder_for,
                           devices, ready, time_limit_s)
                )  # fmt: skip
            finally:
                if devices.is_alive():
                    devices.terminate()
                    devices.join(10)
    assert recorder is not None
    elapsed = time.perf_counter() - began
    rows, windows = recorder.rows, recorder.windows
    save()
    reached = f", stopped at {recorder.n}" if recorder.n < rounds else ""
    print_table(
        f"Stream of {rounds} readings per node through the agent ({batch} nodes, dim {dim}, "
        f"capacity {capacity}, budget {budget}; {elapsed:.0f} s{reached}; {shipped.describe()})",
        ["n", "rows", "rss MB", "reading->learned p50 ms", "p99 ms", "refit s", "readings/s"],
        [
            (r.n, r.rows, r.rss_mb, r.update_p50_ms, r.update_p99_ms, r.refit_s, w.readings_per_s)
            for r, w in zip(rows, windows, strict=True)
        ],
        console,
    )
    flat = flat_after_budget(rows, budget)
    if None not in flat.values():  # there were windows after the nodes settled
        console.print(
            "after the budget was reached: max/min rss {:.3f}, max/min update p99 {:.3f} "
            "(target: within 1.2)".format(flat["rss_mb"], flat["update_p99_ms"])
        )
    if json_path is not None:
        console.print(f"results: {json_path}")
    return rows, windows
