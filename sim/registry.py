"""Environment names on the command line -> constructors."""

from __future__ import annotations

import functools
from collections.abc import Callable

from sim.ackley import Ackley
from sim.additive_er import DIMENSIONS, AdditiveER
from sim.alpine2 import Alpine2
from sim.alpine2_budget import Alpine2Budget
from sim.base import Environment
from sim.brusselator import Brusselator
from sim.decomposed_synthetic import DecomposedSynthetic
from sim.dropwave import Dropwave
from sim.dropwave_drift import DropwaveDrift
from sim.environmental import Environmental
from sim.gw10 import GW10
from sim.gw20 import GW20
from sim.key2 import KEY2
from sim.key3 import KEY3
from sim.kiln import Kiln
from sim.kiln_draft import KilnDraft
from sim.mamujoco import MaMuJoCoSwimmer
from sim.mamujoco_ant import MaMuJoCoAnt
from sim.mc import MC
from sim.mpe_tag import MPETag
from sim.psagraph import PSAGraph
from sim.rosenbrock import Rosenbrock
from sim.sir import AgeStructuredSIR
from sim.sir_school_terms import SchoolTermsSIR
from sim.sir_seasonal import SeasonalSIR
from sim.toygraph import ToyGraph
from sim.tr import TR
from sim.weather import WeatherField

# Seeded environments draw a new instance per seed (paper 003: "new kernels and target each
# trial"); the others ignore the seed.
_FACTORIES: dict[str, Callable[[int], Environment]] = {
    "toygraph": lambda seed: ToyGraph(),
    "psagraph": lambda seed: PSAGraph(),
    "dropwave": lambda seed: Dropwave(noisy=False),
    "dropwave-noisy": lambda seed: Dropwave(noisy=True),
    # issue 22's drifting systems: the instance is round 0's, `at(t)` round t's (oracle, optimum)
    "dropwave-drift": lambda seed: DropwaveDrift(),
    "alpine2": lambda seed: Alpine2(noisy=False),
    "alpine2-noisy": lambda seed: Alpine2(noisy=True),
    "alpine2-budget": lambda seed: Alpine2Budget(),
    "ackley": lambda seed: Ackley(),
    "rosenbrock": lambda seed: Rosenbrock(noisy=False),
    "rosenbrock-noisy": lambda seed: Rosenbrock(noisy=True),
    "decomposed-synthetic": lambda seed: DecomposedSynthetic(seed=seed),
    "sir": lambda seed: AgeStructuredSIR(),
    "sir-seasonal": lambda seed: SeasonalSIR(),
    "sir-school-terms": lambda seed: SchoolTermsSIR(),
    "weather": lambda seed: WeatherField(seed=seed),
    # paper 002's composite problem: an array node (a 3 x 4 field) and reward g(field)
    "environmental": lambda seed: Environmental(),
    # and its PDE problem: the Brusselator's 2 x 64 x 64 field on py-pde (imported on first solve)
    "brusselator": lambda seed: Brusselator(),
    # issue 15: a field (16 probes) that feeds a scalar node, the reward
    "kiln": lambda seed: Kiln(),
    # and one whose field reveals a disturbance the actions do not (an unseen draft)
    "kiln-draft": lambda seed: KilnDraft(),
    # paper 001's subgoal domains: a seed draws the oracle's test environments
    "gw10": lambda seed: GW10.create(seed),
    "gw20": lambda seed: GW20.create(seed),
    "tr": lambda seed: TR.create(seed),
    "key2": lambda seed: KEY2.create(seed),
    "key3": lambda seed: KEY3.create(seed),
    "mc": lambda seed: MC.create(seed),
    # paper 000's synthetic additive functions: the graph per D, the functions per seed
    **{f"additive-er-{d}": functools.partial(AdditiveER, d) for d in DIMENSIONS},
    # paper 000's predator–prey (mpe2's simple_tag): θ is the predators' controller; a seed
    # changes only the episodes' start positions, which the device's noise stream draws
    "mpe-tag": lambda seed: MPETag(heterogeneous=False),
    "mpe-tag-het": lambda seed: MPETag(heterogeneous=True),
    # the same task with θ the predators' role-based HOM policy (sim/hom.py) and its ablations
    "mpe-tag-hom": lambda seed: MPETag(controller="hom"),
    "mpe-tag-hom-no-ra": lambda seed: MPETag(controller="hom-no-ra"),
    "mpe-tag-hom-no-ri": lambda seed: MPETag(controller="hom-no-ri"),
    "mpe-tag-het-hom": lambda seed: MPETag(heterogeneous=True, controller="hom"),
    # paper 000's Multi-agent MuJoCo (gymnasium-robotics on mujoco): θ is the two agents' linear
    # policies; a seed changes only the episodes' start noise, as for mpe-tag
    "mamujoco-swimmer": lambda seed: MaMuJoCoSwimmer(),
    # the 2x4 Ant, two agents of two legs, each with a linear policy on its joints and the torso
    "mamujoco-ant": lambda seed: MaMuJoCoAnt(),
}


def environment_names() -> list[str]:
    return list(_FACTORIES)


@functools.cache
def make_environment(name: str, seed: int = 0) -> Environment:
    """The environment called `name` (seed matters only for environments drawn at random).

    Instances are cached per (name, seed): optima and oracles are computed once per process.
    """
    try:
        factory = _FACTORIES[name]
    except KeyError:
        known = ", ".join(_FACTORIES)
        raise KeyError(f"unknown environment {name!r}; known: {known}") from None
    return factory(seed)
