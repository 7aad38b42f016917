"""The node GPs' buffers grow off the way of a reading (issue 17, latency).

A growth allocates and fills (b, c, c) buffers and copies the factor into them: up to a second
at 1,000-2,000 rows on a loaded machine, inside the batch that needed the room. An experiment
with `schedule.max_rounds` makes room for all its rows when it starts
(`NetworkModel.reserve_rounds`), and otherwise the next buffers are made ahead of need
(`IncrementalGP.prepare_spare`, in a worker thread of the service) and taken by the growth.
"""

from __future__ import annotations

import threading

import pytest
import torch

from agent.experiment import Experiment
from connectors.store import Store
from core.gp import GPConfig, IncrementalGP
from core.gp.buffers import next_capacity
from core.network import NetworkModel
from core.spec import parse_spec
from tests.test_agent_join import Clock, ack, reading


def _model(rows: int, seed: int = 0) -> tuple[IncrementalGP, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    bounds = torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    gp = IncrementalGP(bounds.expand(3, 2, 2), GPConfig(noise_variance=1e-2))
    x = torch.rand(rows, 3, 2, generator=gen, dtype=torch.float64)
    y = torch.sin(6 * x).sum(-1) + 0.1 * torch.randn(rows, 3, generator=gen, dtype=torch.float64)
    return gp, x, y


def test_a_growth_takes_the_spare_made_ahead_and_the_model_is_the_same():
    with_spare, x, y = _model(80)
    without, _, _ = _model(80)
    grown_into = None
    for i in range(80):
        if with_spare.spare_wanted():
            # made in another thread, as the service does, while the model is idle
            worker = threading.Thread(target=with_spare.prepare_spare)
            worker.start()
            worker.join()
            grown_into = with_spare._buffers.spare
            assert grown_into is not None and grown_into.capacity > with_spare.room
            assert not with_spare.spare_wanted()  # one spare at a time
        before = with_spare.room
        with_spare.learn_one(x[i], y[i])
        without.learn_one(x[i], y[i])
        if with_spare.room != before:
            # the growth took the spare's tensors: no allocation of its own
            assert grown_into is not None
            assert with_spare._buffers.factor.data_ptr() == grown_into.factor.data_ptr()
            assert with_spare._buffers.spare is None
            grown_into = None
    assert with_spare.room == without.room >= 80
    q = torch.rand(5, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    mine, theirs = with_spare.posterior(q.transpose(0, 1)), without.posterior(q.transpose(0, 1))
    torch.testing.assert_close(mine.mean, theirs.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mine.variance, theirs.variance, rtol=1e-12, atol=1e-12)


def test_a_spare_too_small_for_the_growth_is_not_taken():
    gp, x, y = _model(40)
    gp.prepare_spare()
    spare = gp._buffers.spare
    assert spare is not None
    gp.reserve(spare.capacity + 5)  # a reservation larger than the spare
    assert gp._buffers.factor.data_ptr() != spare.factor.data_ptr()
    assert gp.room == spare.capacity + 5
    for i in range(40):
        gp.learn_one(x[i], y[i])
    assert int(gp.num_observations.min()) == 40


def _spec(max_rounds: int | None, **model):
    return parse_spec(
        {
            "name": "growth",
            "intervention": "soft",
            "nodes": [
                {"name": "A", "bounds": [0, 1], "noise_std": 0.1},
                {"name": "B", "parents": ["A"], "bounds": [-2, 2], "noise_std": 0.1},
            ],
            "actions": [{"name": "u", "targets": ["B"], "bounds": [-1, 1]}],
            "reward": {"node": "B"},
            "model": {"refit_every": None, "misfit_z": None, **model},
            "policy": {"name": "random"},
            "schedule": {"pipeline": 4, "round_timeout_s": 5.0, "max_rounds": max_rounds},
        }
    )


@pytest.mark.parametrize("max_rounds", [60, 300])
def test_an_experiment_with_max_rounds_never_grows_its_buffers_while_it_learns(max_rounds):
    clock = Clock()
    exp = Experiment(_spec(max_rounds), Store(":memory:"), seed=1, clock=clock)
    capacity = exp.model.gp.room
    assert capacity >= max_rounds + 4  # every round's row and the pipeline's pending points
    assert not exp.model.gp.spare_wanted()  # nor a spare, whose memory no growth would use
    seq = 0
    while not exp.finished or exp.in_flight:
        while exp.can_propose(clock()):
            live = exp.propose()
            exp.mark_published(live.number)
            exp.on_ack(ack(exp, live.number))
        for live in exp.open_rounds:
            a = 0.1 + 0.8 * ((live.number * 7) % 11) / 11
            values = {"A": a, "B": a + live.intervention.get("u", 0.0)}
            batch = []
            for node, value in values.items():
                batch.append(reading(exp, live.number, node, value, seq))
                seq += 1
            exp.on_readings(batch)
            assert exp.model.gp.room == capacity, "the buffers grew inside a batch"
    assert int(exp.model.gp.num_observations.min()) == max_rounds


def test_the_reservation_is_bounded_by_its_memory_and_by_a_bounded_model():
    spec = _spec(None)
    model = NetworkModel(spec)
    per_row = model.gp.batch * 8
    assert model.reserve_rounds(10_000, 4, limit_bytes=per_row * 100**2) == 100
    assert model.gp.most_rows == 10_004  # past the 100 rows reserved, spares come ahead of need
    bounded = NetworkModel(_spec(None, capacity=50))
    assert bounded.reserve_rounds(10_000, 4, limit_bytes=2**30) <= 60
    assert next_capacity(100) == 150 and next_capacity(100, 200) == 200


def _factor_bytes(exp: Experiment) -> int:
    gp = exp.model.gp
    return gp.batch * gp.room**2 * (torch.finfo(gp.dtype).bits // 8)


def test_the_experiments_of_one_process_share_its_reservation():
    """A fleet replica (or a `run` with several specs) holding many experiments with a large
    `max_rounds` must not reserve `RESERVE_BYTES` for each: 100 of them took 512 MiB of factor
    each, and a replica of `bench fleet` ran out of memory (the kernel killed it at 21 GB)."""
    from agent.experiment import RESERVE_BYTES, reserve_share

    assert reserve_share(1) == RESERVE_BYTES and reserve_share(0) == RESERVE_BYTES
    exps = [
        Experiment(
            _spec(10_000).model_copy(update={"name": f"e{i}"}),
            Store(":memory:"),
            reserve_bytes=reserve_share(40),
        )
        for i in range(40)
    ]
    assert sum(_factor_bytes(e) for e in exps) <= RESERVE_BYTES
    assert all(e.model.gp.room >= 16 for e in exps)


def test_a_fleet_replica_builds_each_experiment_with_its_share(tmp_path):
    from agent.config import AgentConfig, MetricsSection, StoreSection
    from agent.experiment import reserve_share
    from agent.fleet import FleetService, FleetSettings

    config = AgentConfig(
        agent_id="replica-a",
        metrics=MetricsSection(port=0),
        store=StoreSection(path=str(tmp_path / "fleet.sqlite")),
    )
    with Store(config.store.path) as store:
        service = FleetService(config, FleetSettings(capacity=50), store=store)
        spec = _spec(10_000).model_copy(update={"name": "big"})
        store.submit("big", spec.model_dump(mode="json", by_alias=True))
        lease = store.acquire_lease("big", "replica-a", 30.0)
        exp = service._build(store, lease)
        assert isinstance(exp, Experiment), exp
        assert 0 < _factor_bytes(exp) <= reserve_share(50)


def test_a_service_with_several_specs_gives_each_its_share():
    from agent.config import AgentConfig
    from agent.experiment import RESERVE_BYTES
    from agent.runtime import AgentService

    specs = [_spec(10_000).model_copy(update={"name": f"s{i}"}) for i in range(8)]
    service = AgentService(AgentConfig(), specs)
    with Store(":memory:") as store:
        service._load(store)
        assert sum(_factor_bytes(e) for e in service.experiments.values()) <= RESERVE_BYTES


def test_reserve_mb_sets_what_a_process_reserves_and_0_reserves_nothing_up_front():
    """`reserve_mb` (CBO_RESERVE_MB) is the process's whole reservation: a small container
    lowers it. With 0 a spec with a large `max_rounds` starts with a small buffer, which
    grows as rows come; with 64 MiB the service's experiments stay within 64 MiB."""
    from agent.config import AgentConfig, ConfigError, load_config
    from agent.runtime import AgentService

    assert load_config(environ={}).reserve_mb == 256
    assert load_config(environ={"CBO_RESERVE_MB": "64"}).reserve_mb == 64
    with pytest.raises(ConfigError, match="reserve_mb"):
        load_config(environ={"CBO_RESERVE_MB": "-1"})

    specs = [_spec(10_000).model_copy(update={"name": f"s{i}"}) for i in range(2)]
    sizes = {}
    for reserve_mb in (0, 64, 256):
        service = AgentService(AgentConfig(reserve_mb=reserve_mb), specs)
        with Store(":memory:") as store:
            service._load(store)
            sizes[reserve_mb] = sum(_factor_bytes(e) for e in service.experiments.values())
    assert sizes[64] <= 64 * 2**20 < sizes[256]
    assert sizes[0] < sizes[64]
