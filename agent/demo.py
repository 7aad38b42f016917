"""`cbo-agent demo`: the whole system on one machine, watched live.

An embedded MQTT broker (amqtt) on loopback — or an external one with `--broker` (any form of
`agent.config.BROKER_FORMS`: HOST:PORT, mqtt://, mqtts://, tcp://) — a
simulator of a paper environment as the MQTT device, and the agent service. The terminal shows
each round as it closes (action, reward, E[y | action], cumulative regret, decision latency),
/metrics is served meanwhile, and at the end a regret plot is saved.

Everything the options choose is checked before anything starts (`prepare_demo`): an unknown
environment or policy, a policy the environment's spec cannot use (D-GP-UCB needs a decomposed
reward), a malformed `--broker` or one that cannot be reached, or a metrics port already in use
is one line on stderr and exit code 2. The demo never moves to another port by itself:
`--metrics-port 0` asks for any free one.

`--seed` seeds the run (the initial design, the simulator's noise, delays and jitter). The
environment is always the instance its example spec describes: seeded environments (weather,
decomposed-synthetic) draw a new instance per seed, and the spec of another instance would have
other sensors or functions, so the device would reject the spec's actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from rich.console import Console
from rich.live import Live
from rich.table import Table

from agent.config import (
    AgentConfig,
    BrokerAddress,
    BrokerSection,
    ConfigError,
    MetricsSection,
    StoreSection,
    parse_broker_address,
)
from agent.fatal import report_fatal
from agent.paths import ExamplesNotFound
from agent.paths import example_spec as example_spec_path
from agent.rounds import RoundEvent
from agent.runtime import AgentService
from agent.tasks import stop_tasks
from agent.validate import check_policy
from connectors.embedded_broker import embedded_broker
from connectors.mqtt import MqttConnection, MqttConnectionError
from core.plain_errors import unknown_name
from core.spec import ExperimentSpec, load_spec
from sim.base import Environment
from sim.device import DeviceSettings, SimulatorDevice
from sim.registry import environment_names, make_environment

log = structlog.get_logger(__name__)

DEFAULT_ENV = "dropwave"  # two actions: the agent visibly finds the peak within 30 rounds
DEFAULT_ROUNDS = 30
SPEC_ENV_SEED = 0  # the instance of a seeded environment that examples/<env>.yaml describes
PROBE_TIMEOUT_S = 5.0  # an external broker that does not answer a CONNECT by then is not there
DEVICE_READY_S = 30.0


class DemoError(ValueError):
    """The demo's options cannot work; the message is one line for the user."""


@dataclass
class DemoOptions:
    env: str = DEFAULT_ENV
    policy: str | None = None
    rounds: int = DEFAULT_ROUNDS
    broker: str | None = None  # an external broker (BROKER_FORMS); None starts the embedded one
    broker_password: str | None = None  # for the user of `broker` (--password-file)
    live: bool = True
    out: Path = Path("results/demo")
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464  # 0: any free port
    seed: int = 0


@dataclass
class DemoResult:
    rounds: int
    initial_rounds: int = 0
    expected: list[float] = field(default_factory=list)
    cumulative_regret: list[float] = field(default_factory=list)
    optimum: float = math.nan
    plot: Path | None = None


def check_metrics_port(host: str, port: int) -> None:
    """Raise DemoError if the metrics server could not listen on host:port.

    The probe binds as the server will (http.server sets SO_REUSEADDR), so a port that an earlier
    run left in TIME_WAIT is free here as it is for the server. Port 0 (any free port) always is.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise DemoError(
                f"--metrics-port {port}: cannot listen on {host}:{port} ({error.strerror}); "
                "stop what holds it, or choose another port (0: any free port)"
            ) from None


async def _announce_metrics(service: AgentService, console: Console) -> None:
    while service.metrics_server is None:
        await asyncio.sleep(0.05)
    console.print(f"metrics: {service.metrics_server.url}/metrics while the demo runs")


def demo_spec(options: DemoOptions) -> ExperimentSpec:
    """The environment's example spec, paced for a demo: a round limit, short timeouts."""
    spec = load_spec(example_spec_path(options.env))
    updates = {
        "name": f"demo-{options.env}",
        "schedule": spec.schedule.model_copy(
            update={"max_rounds": options.rounds, "ack_timeout_s": 5.0, "round_timeout_s": 5.0}
        ),
        # the spec's design rounds (by default a few, scaled to the actions and the round limit)
        "initial_design": spec.initial_design.model_copy(update={"seed": options.seed}),
    }
    if options.policy is not None:
        updates["policy"] = spec.policy.model_copy(
            update={
                "name": options.policy,
                "settings": spec.policy.settings if options.policy == spec.policy.name else {},
            }
        )
    return spec.model_copy(update=updates)


class RoundView:
    """The terminal view: a live table on a terminal, plain lines otherwise."""

    def __init__(
        self,
        console: Console,
        live: bool,
        title: str,
        optimum: float,
        *,
        design_rounds: int = 0,
        policy: str = "",
    ) -> None:
        self.console = console
        self.title = title
        self.optimum = optimum
        self.design_rounds = design_rounds
        self.policy = policy
        self.rows: list[tuple[str, ...]] = []
        self.latency: dict[int, float] = {}
        self.live = Live(self._table(), console=console, refresh_per_second=4) if live else None

    def __enter__(self) -> RoundView:
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.__exit__(*exc)

    def handle(self, event: RoundEvent) -> None:
        if event.kind == "published" and event.decision_latency_s is not None:
            self.latency[event.round] = event.decision_latency_s
        if event.kind == "finished":
            self._line(f"no new rounds: {event.detail}")
        elif event.kind in ("rejected", "expired"):
            self._line(f"round {event.round} {event.kind}: {event.detail}")
        if event.kind != "closed" or event.round is None:
            return
        action = ", ".join(f"{k}={v:.3g}" for k, v in event.intervention.items()) or "observe"
        design = event.round < self.design_rounds
        row = (
            str(event.round),
            "random (design)" if design else self.policy,
            action,
            _fmt(event.reward),
            _fmt(event.expected_reward),
            _fmt(event.cumulative_regret),
            _fmt(self.latency.get(event.round), "{:.3f}s"),
        )
        self.rows.append(row)
        if self.live:
            self.live.update(self._table())
        else:
            self._line(
                "round {} by {} action [{}] reward {} E[y|a] {} cum.regret {} latency {}".format(
                    *row
                )
            )

    def _line(self, text: str) -> None:
        if self.live:
            self.live.console.print(text, markup=False)
        else:
            print(text, flush=True)

    def _table(self) -> Table:
        table = Table(title=f"{self.title} (optimum {self.optimum:.4g})", title_justify="left")
        for column in (
            "round",
            "chosen by",
            "action",
            "reward",
            "E[y|a]",
            "cum. regret",
            "latency",
        ):
            table.add_column(
                column, justify="left" if column in ("chosen by", "action") else "right"
            )
        for row in self.rows[-18:]:
            table.add_row(*row)
        return table


def _fmt(value: float | None, pattern: str = "{:.4g}") -> str:
    return "—" if value is None else pattern.format(value)


@contextlib.asynccontextmanager
async def _broker(address: BrokerAddress | None) -> AsyncIterator[tuple[BrokerAddress, str]]:
    """(address, protocol) of the broker to use, starting the embedded one if needed."""
    if address is None:
        async with embedded_broker() as port:
            yield BrokerAddress("127.0.0.1", port), "3.1.1"  # amqtt speaks 3.1.1 only
        return
    yield address, "auto"


async def _check_reachable(address: BrokerAddress) -> None:
    """Connect once, so that a broker that is not there is one line, not retries and a timeout.

    Raises:
        DemoError: naming the broker and why it cannot be used.
    """
    probe = address.broker_config(timeout_s=PROBE_TIMEOUT_S, probe_timeout_s=PROBE_TIMEOUT_S)
    try:
        async with MqttConnection(probe):
            pass
    except MqttConnectionError as error:
        raise DemoError(
            f"--broker {address.url}: cannot connect ({error}); start a broker there, or leave "
            "out --broker to use the embedded one"
        ) from None


def prepare_demo(options: DemoOptions) -> tuple[ExperimentSpec, Environment]:
    """The demo's spec and environment, checked before anything starts.

    Raises:
        DemoError: unknown environment or policy, a policy the spec cannot use, a bad --broker,
            a metrics port in use.
    """
    if options.env not in environment_names():
        raise DemoError(unknown_name("environment", options.env, environment_names()))
    if options.broker is not None:
        broker_address(options.broker)
    try:
        spec = demo_spec(options)
    except ExamplesNotFound as error:
        raise DemoError(str(error)) from None
    problems = check_policy(spec)
    if problems:
        policy = spec.policy.name
        hint = ""
        if policy == "dgpucb":
            usable = ", ".join(decomposed_environments())
            hint = f" (dgpucb needs a decomposed reward: --env {usable})"
        elif policy in ("eicf", "ucbcf"):
            usable = ", ".join(array_environments())
            hint = f" ({policy} needs a reward g of arrays: --env {usable})"
        problem = problems[0].removeprefix(f"{policy}: ")
        raise DemoError(f"--policy {policy} on --env {options.env}: {problem}{hint}")
    check_metrics_port(options.metrics_host, options.metrics_port)
    return spec, make_environment(options.env, SPEC_ENV_SEED)


def decomposed_environments() -> list[str]:
    """Environments whose example spec decomposes the reward into scalar components
    (D-GP-UCB's need)."""
    specs = {name: load_spec(example_spec_path(name)) for name in environment_names()}
    return [n for n, s in specs.items() if s.reward.components and not s.array_nodes]


def array_environments() -> list[str]:
    """Environments whose example spec's reward is a function of arrays (paper 002: the
    composite policies'; `kiln`'s field feeds a scalar reward node instead, issue 15)."""
    return [n for n in environment_names() if load_spec(example_spec_path(n)).composite_reward]


def broker_address(text: str) -> BrokerAddress:
    """`--broker` read as every command reads a broker (`agent.config.parse_broker_address`).

    Raises:
        DemoError: one line naming the mistake.
    """
    try:
        return parse_broker_address(text)
    except ConfigError as error:
        raise DemoError(f"--broker {error}") from None


async def run_demo(options: DemoOptions, console: Console | None = None) -> DemoResult:
    """Run the demo to the end; returns what it measured.

    Raises:
        DemoError: before anything starts, when the options cannot work (`prepare_demo`).
    """
    console = console or Console()
    spec, env = prepare_demo(options)
    external = None if options.broker is None else broker_address(options.broker)
    if external is not None and options.broker_password is not None:
        if external.username is None:
            raise DemoError("--password-file needs a user in --broker (mqtt://USER@HOST:PORT)")
        external = dataclasses.replace(external, password=options.broker_password)
    if external is not None:
        await _check_reachable(external)
    try:
        options.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DemoError(f"--out {options.out}: {error.strerror or error}") from None
    store_path = options.out / "demo.sqlite"
    for suffix in ("", "-wal", "-shm"):  # a demo starts afresh every time
        Path(f"{store_path}{suffix}").unlink(missing_ok=True)
    async with _broker(external) as (address, protocol):
        config = AgentConfig(
            agent_id="cbo-demo-agent",
            # a demo starts afresh: nothing a previous demo left queued on the broker is wanted
            broker=BrokerSection(
                url=address.url_with_credentials, protocol=protocol, persistent_session=False
            ),
            metrics=MetricsSection(host=options.metrics_host, port=options.metrics_port),
            store=StoreSection(path=str(store_path)),
        )
        device = SimulatorDevice(
            env,
            address.broker_config(protocol=protocol),
            DeviceSettings(
                experiment=spec.name,
                device_id=spec.actuator_id,  # the device the spec binds (sim-{name})
                delay_s=0.02,
                jitter_s=0.02,
                seed=options.seed,
            ),
        )
        title = f"cbo-agent demo: {options.env}, policy {spec.policy.name}, {options.rounds} rounds"
        view = RoundView(
            console,
            options.live,
            title,
            env.optimum.value,
            design_rounds=spec.design_rounds,
            policy=spec.policy.name,
        )
        with view:
            service = AgentService(config, [spec], on_event=view.handle)
            device_task = asyncio.create_task(device.run(), name="device")
            announce = asyncio.create_task(_announce_metrics(service, console))
            try:
                await _device_ready(device, address)  # actuators listen first
                await service.run()
            finally:
                await stop_tasks((device_task, announce))
    return _summarize(service, spec, env.optimum.value, options, console)


async def _device_ready(device: SimulatorDevice, address: BrokerAddress) -> None:
    try:
        await asyncio.wait_for(device.ready.wait(), DEVICE_READY_S)
    except TimeoutError:
        raise DemoError(
            f"the simulator did not get a session with {address.url} within {DEVICE_READY_S:g} s"
        ) from None


def _summarize(
    service: AgentService,
    spec: ExperimentSpec,
    optimum: float,
    options: DemoOptions,
    console: Console,
) -> DemoResult:
    experiment = service.experiments[spec.name]
    expected = [experiment.regret.expected[r] for r in sorted(experiment.regret.expected)]
    cumulative = []
    total = 0.0
    for value in expected:
        total += optimum - value
        cumulative.append(total)
    result = DemoResult(len(expected), spec.design_rounds, expected, cumulative, optimum)
    if expected:
        result.plot = plot_regret(result, options.out / "regret.png", spec.name)
    initial = spec.design_rounds
    best = max(expected[initial:], default=math.nan)
    console.print(
        f"\n{len(expected)} rounds ({initial} random, then {spec.policy.name}); "
        f"best E[y|a] after the random start {best:.4g} vs optimum {optimum:.4g}; "
        f"cumulative regret {total:.4g}.",
        markup=False,  # "E[y|a]" is text, not a style
    )
    if result.plot:
        console.print(f"regret plot: {result.plot}")
    console.print(f"store: {options.out / 'demo.sqlite'}")
    return result


def plot_regret(result: DemoResult, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = list(range(len(result.expected)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    top.plot(rounds, result.expected, "o-", markersize=3, label="E[y | action] (simulator oracle)")
    top.axhline(result.optimum, color="k", linestyle="--", label="optimum")
    for axis in (top, bottom):
        axis.axvline(
            result.initial_rounds - 0.5,
            color="grey",
            linestyle=":",
            label="random start | policy" if axis is top else None,
        )
    top.set_ylabel("expected reward")
    top.legend(loc="lower right")
    top.set_title(title)
    bottom.plot(rounds, result.cumulative_regret, color="tab:red")
    bottom.set_xlabel("round")
    bottom.set_ylabel("cumulative regret")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(options: DemoOptions) -> int:
    """Entry point of `cbo-agent demo`."""
    console = Console()
    options.live = options.live and console.is_terminal and sys.stdout.isatty()
    try:
        result = asyncio.run(run_demo(options, console))
    except DemoError as error:
        print(f"cbo-agent demo: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # a fault mid-run: one agent.fatal event, no traceback
        return report_fatal("demo", error)
    return 0 if result.rounds > 0 else 1
