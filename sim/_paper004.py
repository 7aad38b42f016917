"""Shared machinery of the paper-004 (MCBO) environments: soft function networks acting in
[0, 1]^A and hard-intervention causal graphs, their initial designs, noise draws, a 1-D
maximizer and the derivation of representative node ranges.

Private to `sim`; the public classes are in toygraph.py, psagraph.py, dropwave.py, alpine2.py,
ackley.py and rosenbrock.py.
"""

from __future__ import annotations

import math
import random
from abc import abstractmethod
from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from sim.base import ActionInfo, Environment, Intervention

UNIT = (0.0, 1.0)


def fn_actions(targets: Sequence[Sequence[str]]) -> tuple[ActionInfo, ...]:
    """Soft actions a0, a1, ... in [0, 1]; `targets[j]` are the nodes action j feeds."""
    return tuple(
        ActionInfo(name=f"a{j}", targets=tuple(nodes), bounds=UNIT)
        for j, nodes in enumerate(targets)
    )


def noise(num: int, std: float, generator: torch.Generator | None) -> torch.Tensor:
    """(num,) float64 draws of N(0, std²); exact zeros when std == 0 (noiseless nodes)."""
    if std == 0.0:
        return torch.zeros(num, dtype=torch.float64)
    return std * torch.randn(num, generator=generator, dtype=torch.float64)


def seeded_generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(int(seed))
    return generator


class SoftNetwork(Environment):
    """A function network of Astudillo & Frazier (2021) as used in paper 004.

    Actions are soft: each a_j ∈ [0, 1] is an extra input of the nodes it targets and the
    environment rescales it internally, as the authors' code does. A missing action is 0.
    Subclasses implement `_mean_reward`, the vectorized oracle over a batch of action vectors.
    """

    def action_vector(self, values: Intervention) -> np.ndarray:
        """(A,) float64 action vector in `actions` order, missing actions as 0."""
        return np.array([float(values.get(name, 0.0)) for name in self.action_names])

    def _action_tensor(self, values: Intervention) -> torch.Tensor:
        return torch.from_numpy(self.action_vector(values))

    @abstractmethod
    def _mean_reward(self, actions: np.ndarray) -> np.ndarray:
        """E[Y | a] for a batch of action vectors: (N, A) -> (N,), float64."""

    def expected_reward(self, intervention: Intervention) -> float:
        values = self.validate(intervention)
        return float(self._mean_reward(self.action_vector(values)[None, :])[0])

    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """2·(A+1) uniform random actions in [0, 1]^A [C `n_init_evals`], seeded.

        The paper's text says 2A+1 samples [P]; the authors' code runs 2·(A+1).
        """
        count = 2 * (len(self.actions) + 1)
        draws = torch.rand(
            count, len(self.actions), generator=seeded_generator(seed), dtype=torch.float64
        )
        return [dict(zip(self.action_names, row.tolist(), strict=True)) for row in draws]


class HardGraph(Environment):
    """A causal graph with hard interventions: each action sets one node, do(X = value)."""

    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """10 observational rounds ({}) and then 2 random interventions on each non-empty
        target set, values uniform in the action bounds [P §5 "10 observational samples and
        samples from 2 random interventions on each I"; C `generate_initial_design_causal`].
        Seeded here; the authors' code drew them from the global torch generator.
        """
        generator = seeded_generator(seed)
        design: list[dict[str, float]] = [{} for _ in range(10)]
        for target_set in self.target_sets:
            if not target_set:
                continue
            for _ in range(2):
                draws = torch.rand(len(target_set), generator=generator, dtype=torch.float64)
                design.append(
                    {
                        name: _scale(self.action(name).bounds, float(u))
                        for name, u in zip(target_set, draws, strict=True)
                    }
                )
        return design


def _scale(bounds: tuple[float, float], unit: float) -> float:
    low, high = bounds
    return low + (high - low) * unit


def maximize_scalar(
    func: Callable[[np.ndarray], np.ndarray], low: float, high: float, grid: int = 20_001
) -> tuple[float, float]:
    """Global max of a smooth 1-D function on [low, high]: dense grid, then a bounded Brent
    refinement in the two grid cells around the best grid point. Returns (argmax, max).

    `func` must be vectorized over a 1-D float64 array.
    """
    xs = np.linspace(low, high, grid)
    best = int(np.argmax(func(xs)))
    left, right = xs[max(best - 1, 0)], xs[min(best + 1, grid - 1)]
    result = minimize_scalar(
        lambda x: -float(func(np.array([x]))[0]),
        bounds=(left, right),
        method="bounded",
        options={"xatol": 1e-12 * max(1.0, abs(high - low))},
    )
    candidates = [(float(xs[best]), float(func(xs[best : best + 1])[0]))]
    candidates.append((float(result.x), -float(result.fun)))
    return max(candidates, key=lambda pair: pair[1])


# ------------------------------------------------------------------ representative node ranges
def random_intervention(env: Environment, rng: random.Random) -> dict[str, float]:
    """A random admissible intervention: soft, uniform in the box of the action bounds; hard,
    a uniformly chosen target set (∅ included when allowed) with uniform values."""
    names = env.action_names if env.intervention_type == "soft" else rng.choice(env.target_sets)
    return {name: _scale(env.action(name).bounds, rng.random()) for name in names}


def sampled_ranges(
    env: Environment, interventions: int, per_intervention: int, seed: int
) -> dict[str, tuple[float, float]]:
    """(min, max) of every node over `interventions` random admissible interventions with
    `per_intervention` noisy rounds each. The recipe behind the hard-coded `NodeInfo.bounds`."""
    rng = random.Random(seed)
    generator = seeded_generator(seed)
    low = dict.fromkeys(env.node_names, math.inf)
    high = dict.fromkeys(env.node_names, -math.inf)
    for _ in range(interventions):
        readings = env.sample(random_intervention(env, rng), per_intervention, generator)
        for name, values in readings.items():
            low[name] = min(low[name], float(values.min()))
            high[name] = max(high[name], float(values.max()))
    return {name: (low[name], high[name]) for name in env.node_names}


def padded_bounds(low: float, high: float, pad: float = 0.05) -> tuple[float, float]:
    """Pad a range by `pad` of its span on each side and round outward to a multiple of
    5·10^(k−2), where 10^k is the order of magnitude of the padded span."""
    span = max(high - low, 1e-12)
    low, high = low - pad * span, high + pad * span
    step = 5.0 * 10.0 ** (math.floor(math.log10(high - low)) - 2)
    return (
        round(math.floor(low / step) * step, 10),
        round(math.ceil(high / step) * step, 10),
    )
