"""`cbo-agent bench chaos`: kill -9 the agent, restart the broker, cut the agent's connection.

Setup, all on 127.0.0.1: a Mosquitto with persistence (saved after every change), the simulator
device (`cbo-agent sim`, JSON log) and the agent (`cbo-agent run`, reaching the broker through
a TCP proxy, `bench.harness.tcp_proxy`) as subprocesses, on the example spec of the environment
with the random policy, short ack and round timeouts, ``max_rounds`` R and a total budget of
(R − ½) rounds' cost, so that the budget, not the round limit, ends the run after R − 1 rounds.

Chaos, in a seeded random order and spread over the first 80 % of the run:
  agent kills      SIGKILL of the agent, restarted after a short random downtime. Each kill
                   picks a moment: a random one; right after a ``round.proposed`` log line (the
                   window between reserving the budget and publishing); right after
                   ``round.published`` (before the ack is handled); or a kill during start-up
                   (killed, restarted, and killed again while it loads and recovers).
  broker restarts  the broker stopped — SIGKILL for the first and every other one, SIGTERM for
                   the rest — and started again on the same port after a random pause: every
                   client's connection is cut, and the agent's persistent session is what
                   survives.
  connection cuts  every connection of the agent reset at the proxy (TCP RST both ways) and new
                   ones refused for a random moment, while the broker and the device stay up:
                   the agent must notice, reconnect and resume its persistent session.

Adversaries beside the real device (`bench.harness.adversaries`), on a broker that runs the
shipped ACL with a login per device (deploy/mosquitto/acl, make-passwd.sh): a forging device
that, every half second, forges a "rejected" ack, a reading and an oracle message for the newest
round — on its own topics claiming the real device's id, on its own topics as itself, and on
the real device's topics — and a flooding device that publishes `flood` invalid payloads on its
own topic at `flood_rate` per second. `forgeries_accepted` counts what of the forgeries the
store holds afterwards (readings, oracle values, rounds ended by a forged rejection); it must be
0, as must `real_readings_lost`, the real device's readings neither stored nor still queued.

Live audits: before every disruption, and after the last one at every round the agent closes
until it exits, the device is paused for a moment and the live agent's /metrics
(`cbo_observations` per node, `cbo_budget_spent`) are compared with the store
(`bench.harness.check.LiveAudit`): readings in the model vs readings accepted. The last
audit (or the first that disagreed) is reported.

Once the agent has finished: the readings still queued for the agent's session are drained, every
process is stopped, and `bench.harness.check.verify` compares the store, the model a
restarted agent rebuilds from it, and the device's log. Every wait has a timeout.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.harness.adversaries import Flooder, Forger
from bench.harness.check import (
    Check,
    DeviceRecord,
    LiveAudit,
    Verdict,
    audit_once,
    device_record,
    drain_session,
    verify,
)
from bench.harness.procs import (
    AGENT_ID,
    DEVICE_ID,
    EXPERIMENT,
    ChildDied,
    Cluster,
    DeviceOptions,
    distinct_rounds,
    round_cost,
    write_spec,
)
from bench.report import print_table, wide_console, write_json
from connectors.store import Store
from core.spec import ExperimentSpec, load_spec

REQUIRED_FIELDS = (
    "kills",
    "broker_restarts",
    "connection_cuts",
    "readings_accepted",
    "readings_in_model",
    "rounds_completed",
    "budget",
    "budget_spent",
    "actions_applied_twice",
    "forgeries_sent",
    "forgeries_accepted",
    "flood_sent",
    "real_readings_lost",
)
FORGER, FLOODER = "forger", "flooder"  # the adversaries' device logins
KILL_MOMENTS = ("random", "after_proposed", "after_published", "startup")
STARTUP_S = 90.0  # a life of the agent, from exec to subscribed, on a busy two-core machine
AUDIT_SETTLE_S = 1.5  # device paused: what is in flight reaches the agent well within this


@dataclass
class ChaosOptions:
    kills: int = 10
    broker_restarts: int = 3
    connection_cuts: int = 3
    rounds: int = 40
    seed: int = 0
    env: str = "dropwave"
    policy: str = "random"
    ack_timeout_s: float = 2.0
    round_timeout_s: float = 2.0
    device: DeviceOptions = field(
        default_factory=lambda: DeviceOptions(
            delay_s=0.1, jitter_s=0.3, drop_rate=0.02, duplicate_rate=0.1
        )
    )
    max_downtime_s: float = 1.5
    time_limit_s: float = 900.0
    forge: bool = True  # a forging device beside the real one
    flood: int = 20_000  # invalid messages from a flooding device (0: none)
    flood_rate: float = 200.0  # ... at most this many per second


@dataclass
class ChaosResult:
    numbers: dict[str, Any]
    verdict: Verdict
    log: list[str]

    @property
    def ok(self) -> bool:
        return self.verdict.ok and bool(self.numbers.get("agent_finished"))

    def as_json(self) -> dict[str, Any]:
        return {
            **self.numbers,
            "ok": self.ok,
            "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in self.verdict.checks},
            "disruptions": self.log,
        }


class _Chaos:
    """Applies the disruptions to a running cluster, audits the live agent, and keeps count."""

    def __init__(
        self, cluster: Cluster, options: ChaosOptions, spec: ExperimentSpec, deadline: float
    ) -> None:
        self.cluster = cluster
        self.options = options
        self.spec = spec
        self.rng = random.Random(options.seed)
        self.deadline = deadline
        self.kills = 0
        self.broker_restarts = 0
        self.broker_kills = 0
        self.kills_before_publish = 0
        self.kills_before_ack = 0
        self.connection_cuts = 0
        self.closed_at_cuts: list[int] = []
        self._sessions_before_cut = 0  # agent sessions seen when the last cut was made
        self.live_audits = 0
        self.audit: LiveAudit | None = None  # the last audit, or the first that disagreed
        self.log: list[str] = []
        self.started = time.monotonic()

    # ------------------------------------------------------------------ schedule
    def plan(self) -> list[tuple[str, str]]:
        """(what, how) for every disruption, in a seeded random order."""
        options, rng = self.options, self.rng
        moments = [KILL_MOMENTS[i % len(KILL_MOMENTS)] for i in range(options.kills)]
        rng.shuffle(moments)
        kills = []
        left = options.kills
        for moment in moments:  # a start-up kill is two kills: one to restart, one while starting
            if left <= 0:
                break
            if moment == "startup" and left < 2:
                moment = "random"
            kills.append(("kill", moment))
            left -= 2 if moment == "startup" else 1
        brokers = [
            ("broker", "sigkill" if i % 2 == 0 else "sigterm")
            for i in range(options.broker_restarts)
        ]
        cuts = [("cut", "connection")] * options.connection_cuts
        plan = kills + brokers + cuts
        rng.shuffle(plan)
        return plan

    def run(self) -> None:
        plan = self.plan()
        # spread over the first 80 % of the rounds the budget pays for (R − 1), so that the
        # last disruption still finds a round in flight
        span = max(int(0.8 * (self.options.rounds - 1)), 1)
        for index, (what, how) in enumerate(plan):
            target = math.ceil((index + 1) * span / (len(plan) + 1))
            if not self._wait_for_progress(target):
                self._note(f"agent finished before disruption {index + 1} of {len(plan)}")
                return
            self._audit()
            if what == "kill":
                self._kill(how)
            elif what == "broker":
                self._restart_broker(how)
            else:
                self._cut_connection()

    def _closed(self) -> int:
        return len(distinct_rounds(self.cluster.agent_events("round.closed")))

    def _wait_for_progress(self, target: int) -> bool:
        """Wait until `target` rounds have closed; False if the agent finished first."""
        agent = self.cluster.agent
        assert agent is not None
        while self._closed() < target:
            if not agent.alive:
                return False
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"no progress to {target} closed rounds before the time limit")
            time.sleep(0.02)
        return agent.alive

    # ------------------------------------------------------------------ disruptions
    def _kill(self, moment: str) -> None:
        agent = self.cluster.agent
        assert agent is not None
        waited = ""
        if moment == "random":
            time.sleep(self.rng.uniform(0.0, 1.5))
        elif moment in ("after_proposed", "after_published"):
            event = "round." + moment.removeprefix("after_")
            agent.log.poll()  # what is logged already does not count
            since = len(agent.log.events)
            try:
                timeout_s = 3 * self.options.round_timeout_s + 5
                agent.log.wait_for(event, timeout_s, since=since, child=agent)
            except TimeoutError:
                waited = f" (no {event} in time: killed anyway)"
            except ChildDied:
                return
        if not agent.alive:
            return
        self._sigkill_and_restart(moment + waited)
        if moment == "startup":
            time.sleep(self.rng.uniform(0.3, 4.0))  # importing, opening the store, recovering
            self._sigkill_and_restart("while starting")

    def _sigkill_and_restart(self, why: str) -> None:
        agent = self.cluster.agent
        assert agent is not None
        if not agent.alive:
            return
        agent.kill()
        self.kills += 1
        found = self._inspect_store()
        self._note(f"SIGKILL agent ({why}){found}")
        time.sleep(self.rng.uniform(0.1, self.options.max_downtime_s))
        self.cluster.start_agent()

    def _inspect_store(self) -> str:
        """What the dead agent left: a reserved but unpublished round, an unacked action."""
        path = self.cluster.store_path
        if not path.exists():
            return ""
        with Store(path) as store:
            if EXPERIMENT not in store.experiment_names():
                return ""
            open_rounds = store.open_rounds(EXPERIMENT)
        unpublished = [r.round for r in open_rounds if r.status == "proposed" and r.attempt == 0]
        unacked = [r.round for r in open_rounds if r.status == "published"]
        notes = []
        if unpublished:
            self.kills_before_publish += 1
            notes.append(f"round {unpublished[0]} reserved, not published")
        if unacked:
            self.kills_before_ack += 1
            notes.append(f"round {unacked[0]} published, not acked")
        return f": {'; '.join(notes)}" if notes else ""

    def _restart_broker(self, how: str) -> None:
        broker = self.cluster.broker
        time.sleep(self.rng.uniform(0.0, 1.0))
        broker.stop(graceful=how == "sigterm")
        self.broker_restarts += 1
        self.broker_kills += how == "sigkill"
        pause = self.rng.uniform(0.2, self.options.max_downtime_s)
        time.sleep(pause)
        broker.start(timeout_s=10.0)
        self._note(f"broker {how}, down {pause:.2f} s")

    def _cut_connection(self) -> None:
        """Reset the agent's connection at the proxy; refuse reconnections for a moment."""
        proxy = self.cluster.proxy
        assert proxy is not None, "connection cuts need the cluster's proxy"
        time.sleep(self.rng.uniform(0.0, 1.0))
        # A cut must sever a session, not a reconnection still in its handshake: wait until the
        # agent has subscribed again since the previous cut.
        if not self._wait_for_session(self._sessions_before_cut):
            self._note("the agent had no new session since the last cut: not cut")
            return
        if not proxy.wait_for_connection(STARTUP_S):
            self._note("no connection of the agent to cut")
            return
        self._sessions_before_cut = self._sessions()
        refuse_s = self.rng.uniform(0.0, self.options.max_downtime_s)
        closed = self._closed()
        severed = proxy.cut(refuse_s=refuse_s)
        if severed:
            self.connection_cuts += 1
            self.closed_at_cuts.append(closed)
        self._note(f"cut the agent's connection ({severed} reset), refused for {refuse_s:.2f} s")

    def _sessions(self) -> int:
        return len(self.cluster.agent_events("agent.subscribed"))

    def _wait_for_session(self, seen: int) -> bool:
        """Wait until the agent has had more than `seen` sessions; False if it died or none
        came within the start-up time."""
        agent = self.cluster.agent
        assert agent is not None
        deadline = time.monotonic() + STARTUP_S
        while self._sessions() <= seen:
            if not agent.alive or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    # ------------------------------------------------------------------ live audit
    def follow(self) -> None:
        """After the last disruption: audit the live agent at every round it closes, until it
        exits (or an audit disagrees)."""
        agent = self.cluster.agent
        assert agent is not None
        agent.log.poll()
        since = len(agent.log.events)
        try:
            while self.audit is None or self.audit.agrees:
                closed = agent.log.wait_for(
                    "round.closed", self._time_left(STARTUP_S), since=since, child=agent
                )
                since = next(i for i, e in enumerate(agent.log.events) if e is closed) + 1
                self._audit()
        except (ChildDied, TimeoutError):
            pass  # finished (or stuck: the run's own wait reports that)
        if self.audit is None:
            self._note("no live audit: the agent never answered with its model")
        else:
            self._note(
                f"{self.live_audits} live audits; the last at {self.audit.store.rounds_closed} "
                f"closed rounds: {self.audit.readings_in_model} readings in the model, "
                f"{self.audit.readings_accepted} accepted"
            )

    def _audit(self) -> None:
        """Compare the live agent's model (its /metrics) with the store, the device paused.

        Pausing the device means nothing new arrives, so what is in flight settles: /metrics is
        scraped, then the store read, until the two agree or AUDIT_SETTLE_S passes. Skipped if
        the agent is gone, or has not updated its model in this life yet (no gauges).
        """
        agent, device = self.cluster.agent, self.cluster.device
        assert agent is not None and device is not None
        served = agent.log.named("metrics.serving")
        if not served or not agent.alive:
            return
        url = f"http://127.0.0.1:{int(served[-1]['port'])}"
        device.pause()
        try:
            audit = self._settle(url)
        except OSError:
            return  # it exited meanwhile
        finally:
            device.resume()
        if not audit.exported:
            return
        self.live_audits += 1
        if self.audit is None or self.audit.agrees:
            self.audit = audit

    def _settle(self, url: str) -> LiveAudit:
        deadline = time.monotonic() + AUDIT_SETTLE_S
        scrapes = 0
        while True:
            audit = audit_once(url, self.spec, self.cluster.store_path)
            scrapes += 1
            audit.scrapes = scrapes
            if audit.agrees or not audit.exported or time.monotonic() >= deadline:
                return audit
            time.sleep(0.05)

    def _time_left(self, cap_s: float) -> float:
        return max(min(self.deadline - time.monotonic(), cap_s), 1.0)

    def _note(self, text: str) -> None:
        self.log.append(f"{time.monotonic() - self.started:7.2f} s  {text}")


def run_chaos(options: ChaosOptions, workdir: Path) -> ChaosResult:
    """One chaos run in `workdir` (spec, store, logs, broker data stay there)."""
    started = time.monotonic()
    deadline = started + options.time_limit_s
    spec_path = workdir / "spec.yaml"
    probe = write_spec(spec_path, env=options.env, rounds=options.rounds, budget_total=None)
    budget = round_cost(probe) * (options.rounds - 0.5)
    write_spec(
        spec_path,
        env=options.env,
        rounds=options.rounds,
        budget_total=budget,
        ack_timeout_s=options.ack_timeout_s,
        round_timeout_s=options.round_timeout_s,
        policy=options.policy,
    )
    spec = load_spec(spec_path)
    with Cluster(
        workdir,
        spec_path,
        env=options.env,
        device_options=options.device,
        via_proxy=True,
        logins=(FORGER, FLOODER),
    ) as cluster:
        cluster.start_broker()
        cluster.start_device(timeout_s=STARTUP_S)
        cluster.start_agent()
        port, passwords = cluster.broker.port, cluster.passwords
        forger = flooder = None
        if options.forge:
            login = (FORGER, passwords[FORGER])
            forger = Forger(port, login, spec, DEVICE_ID, cluster.store_path)
            forger.start()
        if options.flood:
            login = (FLOODER, passwords[FLOODER])
            flooder = Flooder(port, login, EXPERIMENT, options.flood, options.flood_rate)
            flooder.start()
        chaos = _Chaos(cluster, options, spec, deadline)
        try:
            chaos.run()
            chaos.follow()
        finally:
            for adversary in (forger, flooder):
                if adversary is not None:
                    adversary.stop()
        agent = cluster.agent
        assert agent is not None
        finished, exit_code = True, None
        try:
            exit_code = agent.wait(max(deadline - time.monotonic(), 1.0))
        except TimeoutError:
            finished = False
            agent.dump_stacks()  # where it waits, in its log
            chaos._note("the agent did not finish before the time limit (stacks in its log)")
        chaos._note(f"agent exited with code {exit_code}" if finished else "agent killed")
        # readings of rounds closed by timeout may still be on their way
        time.sleep(options.device.delay_s + options.device.jitter_s + 1.0)
        if agent.alive:
            agent.kill()
        queued = drain_session(
            cluster.broker.port, AGENT_ID, login=("agent", cluster.passwords["agent"])
        )
        cluster.close()
        record: DeviceRecord = device_record(cluster.device_events())
        lives = len(cluster.agent_lives)
        sessions = len(cluster.agent_events("agent.subscribed"))
        assert cluster.proxy is not None
        refused = cluster.proxy.refused
    verdict = verify(spec_path, cluster.store_path, record, queued, chaos.audit)
    accepted = {"readings": 0, "oracles": 0, "rejections": 0}
    if forger is not None:
        with Store(cluster.store_path) as store:
            accepted = forger.record.accepted_in(store, EXPERIMENT, FORGER)
    forgeries_accepted = sum(accepted.values())
    verdict.checks.append(
        Check(
            "forgeries_accepted == 0",
            forgeries_accepted == 0,
            f"of {forger.record.sent if forger else 0} sent: {accepted['readings']} readings, "
            f"{accepted['oracles']} oracle values, {accepted['rejections']} rejections stored",
        )
    )
    verdict.numbers |= {
        "forgeries_sent": forger.record.sent if forger else 0,
        "forgeries_accepted": forgeries_accepted,
        "flood_sent": flooder.sent if flooder else 0,
        "real_readings_lost": verdict.numbers["readings_lost"],
    }
    numbers = {
        "kills": chaos.kills,
        "broker_restarts": chaos.broker_restarts,
        "connection_cuts": chaos.connection_cuts,
        **{k: verdict.numbers[k] for k in REQUIRED_FIELDS[3:]},
        "broker_kills": chaos.broker_kills,
        "agent_lives": lives,
        "agent_sessions": sessions,
        "connections_refused": refused,
        "rounds_closed_at_cuts": chaos.closed_at_cuts,
        "live_audits": chaos.live_audits,
        "kills_before_publish": chaos.kills_before_publish,
        "kills_before_ack": chaos.kills_before_ack,
        **{k: v for k, v in verdict.numbers.items() if k not in REQUIRED_FIELDS},
        "agent_finished": finished and exit_code == 0,
        "rounds": options.rounds,
        "seed": options.seed,
        "policy": options.policy,
        "env": options.env,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    return ChaosResult(numbers, verdict, chaos.log)


def print_result(result: ChaosResult, console: Console) -> None:
    for line in result.log:
        console.print(line, highlight=False)
    rows = [(name, _show(value)) for name, value in result.numbers.items()]
    print_table("chaos run", ("measure", "value"), rows, console)
    checks = [(c.name, "ok" if c.ok else "FAILED", c.detail) for c in result.verdict.checks]
    checks.append(
        ("agent finished (exit 0)", "ok" if result.numbers["agent_finished"] else "FAILED", "")
    )
    print_table("checks", ("check", "result", "detail"), checks, console)


def _show(value: Any) -> Any:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return value


def run(
    options: ChaosOptions,
    json_path: Path | None = None,
    workdir: Path | None = None,
    console: Console | None = None,
) -> ChaosResult:
    """Run, print the table, write JSON; keep the files only when `workdir` is given."""
    console = console or wide_console()
    temporary = workdir is None
    where = Path(tempfile.mkdtemp(prefix="cbo-chaos-")) if workdir is None else workdir
    where.mkdir(parents=True, exist_ok=True)
    try:
        result = run_chaos(options, where)
    except BaseException:
        console.print(f"chaos run failed; its logs and store are in {where}", highlight=False)
        raise
    print_result(result, console)
    if temporary and result.ok:
        shutil.rmtree(where, ignore_errors=True)
    elif temporary:
        console.print(f"logs, store and broker data kept in {where}", highlight=False)
    if json_path is not None:
        write_json(json_path, result.as_json())
    return result
