"""A fleet replica refits its experiments' hyperparameters beside the event loop, as the
single-experiment service does (`agent.refits`): in the fit process, installed between batches.

Inline, a refit ran inside the batch that made it due, in a worker thread of the replica
holding the interpreter lock: at 100 experiments on one replica the refits were most of what a
batch cost, and every other experiment's decision waited behind them (docs/benchmarks.md, "A
fleet of replicas"). Everything is real and on loopback: `cbo-agent serve`, Mosquitto, SQLite,
the simulated devices.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fleet import FleetRig
from bench.harness.procs import wait_until
from tests.brokers import find_mosquitto

pytestmark = [pytest.mark.integration]


def test_a_replica_refits_its_experiments_in_the_fit_process(tmp_path: Path) -> None:
    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed")
    with FleetRig(
        tmp_path, str(tmp_path / "fleet.sqlite"), experiments=2, replicas=1, rounds=10_000
    ) as rig:
        rig.start_replicas()
        rig.start_devices()
        rig.submit_all()
        replica = rig.replicas["replica-0"]

        def fitted() -> set[str]:
            return {e["experiment"] for e in replica.log.named("model.refit") if e["nodes"]}

        wait_until("a node refit of each experiment", lambda: fitted() == set(rig.names), 180)
        refits = replica.log.named("model.refit")
        # a refit installed from the fit process says so, with its fit time; an inline one
        # names its round instead
        assert all(e.get("background") is True and e.get("fit_s") is not None for e in refits)
        assert all("round" not in e for e in refits)
