"""Refits beside the event loop, in the service through a real Mosquitto: they happen on the
spec's schedule, are swapped in, and leave the exact GP of every stored reading."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from structlog.testing import capture_logs

from agent.refits import RECENT_RECORDS, BackgroundRefits, FitWorker
from agent.runtime import AgentService
from connectors.mqtt import BrokerConfig
from core.gp.refit import RefitJob
from core.network import NetworkModel
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import make_environment
from tests.test_agent_service import WAIT_S, agent_config, fast_spec


@pytest.mark.integration
async def test_refits_run_beside_the_loop_and_leave_the_exact_model(mosquitto, tmp_path):
    # long enough (about 15 s) for the fit process to start and fit more than once
    spec = fast_spec("refits", rounds=30, pipeline=1, min_interval_s=0.5)
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"refit_every": 3})})
    device = SimulatorDevice(
        make_environment("toygraph"),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="refits", delay_s=0.005, seed=4),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    service = AgentService(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    default_lengthscale = NetworkModel(spec).gp.lengthscale
    try:
        with capture_logs() as logs:
            await asyncio.wait_for(service.run(), WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task

    refits = service.refits["refits"]
    assert refits.started >= 1 and refits.installed >= 1
    # one record per install and per node fit, and no more than the latest RECENT_RECORDS
    assert len(refits.install_seconds) == len(refits.install_at) == refits.installed
    assert len(refits.fit_seconds) == refits.fits_installed >= 1
    assert refits.fit_seconds.maxlen == refits.install_rows.maxlen == RECENT_RECORDS
    background = [e for e in logs if e["event"] == "model.refit" and e.get("background")]
    assert background and all(e["fit_s"] > 0 for e in background)
    gp = service.experiments["refits"].model.gp
    assert gp.config.deferred
    assert not torch.allclose(gp.lengthscale, default_lengthscale)  # something was fit

    # The same readings, learned from scratch under the service's final hyperparameters and
    # standardization, give the same posterior: the catch-up appends lost and doubled nothing.
    exp = service.experiments["refits"]
    scratch = NetworkModel(spec)
    for number in sorted(exp.rounds):
        live = exp.rounds[number]
        scratch.observe(scratch.start_round(live.intervention), live.readings, refit=False)
    assert scratch.gp.num_observations.tolist() == gp.num_observations.tolist()
    scratch.gp.load_state(gp.state())
    gen = torch.Generator().manual_seed(0)
    bounds = gp._lower, gp._lower + gp._span
    xq = bounds[0].unsqueeze(1) + torch.rand(gp.batch, 5, gp.dim, generator=gen, dtype=gp.dtype) * (
        bounds[1] - bounds[0]
    ).unsqueeze(1)
    ours, theirs = gp.posterior(xq), scratch.gp.posterior(xq)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=1e-8, atol=1e-8)


_KILLED_AGENT = """
import os, signal, sys, time
from agent.refits import FitWorker
if __name__ == "__main__":
    worker = FitWorker()
    worker.warm()
    print(worker.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_fit_process_exits_when_the_agent_is_killed(tmp_path):
    """A SIGKILLed agent must not leave its fit process behind (it holds torch's memory)."""
    script = tmp_path / "killed_agent.py"
    script.write_text(_KILLED_AGENT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _slow_job() -> dict[str, RefitJob]:
    """A fit of one member at n = 1,500: tens of seconds of a core (it is ended long before)."""
    gen = torch.Generator().manual_seed(0)
    n = 1500
    z = torch.rand(n, 2, generator=gen, dtype=torch.float64)
    y = torch.sin(6 * z[:, 0]) + z[:, 1] + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    job = RefitJob(
        members=[0],
        fit=[True],
        z=[z],
        y=[y],
        dims=[2],
        lengthscale=torch.full((1, 2), 0.5, dtype=torch.float64),
        outputscale=one,
        learned_noise=one * 1e-2,
        known_noise=one * math.nan,
        jitter=one * 0.0,
        kernel="matern52",
        priors="gamma",
        epochs=[0],
        forgotten=[0],
    )
    return {"nodes": job}


async def test_a_cancelled_fit_ends_with_its_process_and_close_ends_the_worker():
    """A fit nobody waits for must not keep a core busy (a stopped service's fits once ran on
    beside the next service); the next fit starts a fresh process, and close ends it."""
    worker = FitWorker()
    worker.warm()
    first = worker.pid
    assert first is not None
    fit = asyncio.create_task(worker.fit(_slow_job()))
    await asyncio.sleep(3.0)  # the job is in the process (or its imports), not finished
    assert not fit.done()
    fit.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await fit
    assert worker.ended == 1 and worker.pid is None and not _alive(first)
    worker.warm()
    second = worker.pid
    assert second is not None and second != first
    worker.close()
    assert worker.pid is None and not _alive(second)


async def test_a_fleet_replica_letting_go_of_an_experiment_leaves_the_shared_fit_running():
    """`keep_worker` (a fleet replica's refits): closing one experiment's refits while its fit
    runs ends neither the fit process nor the fit; without it, the process would be killed and
    every other experiment's next fit would wait for a fresh one to import torch again."""
    worker = FitWorker()
    worker.warm()
    first = worker.pid
    assert first is not None
    refits = BackgroundRefits(None, lambda: None, worker, keep_worker=True)  # type: ignore[arg-type]
    running = asyncio.create_task(refits._refit("nodes", _slow_job()["nodes"]))
    refits._task = running
    await asyncio.sleep(3.0)  # the job is in the process (or its imports), not finished
    assert not running.done()
    await refits.close()
    assert running.cancelled()
    assert worker.ended == 0 and worker.pid == first and _alive(first)
    worker.close()  # ends the fit still under way
    assert not _alive(first)
    await asyncio.sleep(0.5)  # the abandoned fit's waiter sees the pipe close


def test_the_fit_process_is_at_its_lower_priority_before_it_imports_torch():
    """The child's imports (torch, BoTorch: seconds of a core) run at FIT_NICENESS, not at the
    agent's priority beside a service draining its backlog: the spawn target's module imports
    nothing heavy, and lowers the priority before it imports the fits."""
    from agent import fit_process

    probe = (
        "import sys, agent.fit_process; "
        "print(sorted(m for m in ('torch', 'botorch', 'agent.refits') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
    worker = FitWorker()
    try:
        worker.warm()
        pid = worker.pid
        assert pid is not None
        deadline = time.monotonic() + 5.0
        niceness = None
        while time.monotonic() < deadline:  # within moments of the spawn, mid-import
            niceness = os.getpriority(os.PRIO_PROCESS, pid)
            if niceness != os.getpriority(os.PRIO_PROCESS, 0):
                break
            time.sleep(0.01)
        assert niceness == os.getpriority(os.PRIO_PROCESS, 0) + fit_process.FIT_NICENESS or (
            niceness == 19
        )
    finally:
        worker.close()


@pytest.mark.integration
async def test_a_refit_copies_the_rows_only_while_no_batch_is_being_learned(
    mosquitto, tmp_path, monkeypatch
):
    """The refit copies the model's rows on the loop (`refresh_job`) while the driver learns a
    batch in a worker thread: unguarded, the copy could see a row half appended or a bounded
    model's removal half done (rows and data of different lengths: the refit, or its install,
    failed). With every batch slowed to hold the worker most of the time, no copy may overlap
    one."""
    import agent.runtime as runtime

    learning = threading.Event()
    overlaps: list[bool] = []
    apply, refresh = runtime._apply, NetworkModel.refresh_job

    def slow_apply(exp, batch):
        learning.set()
        try:
            time.sleep(0.3)
            return apply(exp, batch)
        finally:
            learning.clear()

    def watched_refresh(self, key, job):
        overlaps.append(learning.is_set())
        return refresh(self, key, job)

    monkeypatch.setattr(runtime, "_apply", slow_apply)
    monkeypatch.setattr(NetworkModel, "refresh_job", watched_refresh)
    spec = fast_spec("copies", rounds=24, pipeline=1, min_interval_s=0.1)
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"refit_every": 2})})
    device = SimulatorDevice(
        make_environment("toygraph"),
        BrokerConfig.from_url(mosquitto.url),
        DeviceSettings(experiment="copies", delay_s=0.0, seed=5),
    )
    device_task = asyncio.create_task(device.run())
    await asyncio.wait_for(device.ready.wait(), WAIT_S)
    service = AgentService(agent_config(mosquitto.url, tmp_path / "agent.sqlite"), [spec])
    try:
        await asyncio.wait_for(service.run(), 3 * WAIT_S)
    finally:
        device_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await device_task
    assert overlaps, "no refit copied rows: the test did not exercise the race"
    assert not any(overlaps), f"{sum(overlaps)} of {len(overlaps)} copies overlapped a batch"
