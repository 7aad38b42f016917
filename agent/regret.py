"""Regret as the agent reports it.

With a simulator, oracle messages carry E[y | a_t] and the optimum, so regret is true:
    cumulative R_T = Σ_t (f* − E[y | a_t]),   simple r_T = f* − max_t E[y | a_t].
On a real system neither is known; the agent then exports a model-based upper estimate under
its own name: the running sum over rounds of UCB(best candidate) − LCB(chosen action), from the
posterior of the reward given the actions at the time of the decision. Under a calibrated model
each term bounds that round's regret, so the sum is an upper estimate, labelled as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from core.network import NetworkModel
from core.spec import ExperimentSpec


class RegretTracker:
    """Rewards, oracle values and regret of one experiment."""

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec = spec
        self.expected: dict[int, float] = {}
        self.optimum: float | None = None
        self.last_reward: float | None = None
        self.last_reward_round: int | None = None
        self.best_reward: float = -math.inf
        self.upper_estimate: float | None = None

    @property
    def has_oracle(self) -> bool:
        return self.optimum is not None and bool(self.expected)

    @property
    def cumulative(self) -> float | None:
        if not self.has_oracle:
            return None
        return sum(self.optimum - value for value in self.expected.values())

    @property
    def simple(self) -> float | None:
        if not self.has_oracle:
            return None
        return self.optimum - max(self.expected.values())

    def observe_reward(self, round_number: int, reward: float) -> None:
        self.last_reward = reward
        self.last_reward_round = round_number
        self.best_reward = max(self.best_reward, reward)

    def observe_oracle(self, round_number: int, expected: float, optimum: float) -> bool:
        """Record a simulator's oracle values; False for a round already recorded."""
        if round_number in self.expected:
            return False
        self.expected[round_number] = expected
        self.optimum = optimum
        return True

    def add_upper_increment(self, ucb_best: float, lcb_chosen: float) -> None:
        """One round's model-based regret bound, UCB at the best candidate − LCB at the choice."""
        self.upper_estimate = (self.upper_estimate or 0.0) + max(ucb_best - lcb_chosen, 0.0)


REGRET_BETA = 2.0  # σ-multiplier of the bound (≈ 95% two-sided for a Gaussian posterior)
_CANDIDATES = 512


def regret_bound(
    model: NetworkModel, intervention: Mapping[str, float], rng: torch.Generator
) -> tuple[float, float] | None:
    """(UCB of the best candidate, LCB of `intervention`) under the actions -> reward GP.

    Candidates: the spec's finite candidates when it has them, else uniform draws over every
    allowed target set's box, plus every intervention already run. None until the reward GP has
    two observations.
    """
    flat = model.flat_model()
    if int(flat.num_observations[0]) < 2:
        return None
    rows = [_encoded(model, r.intervention) for r in model.history] + _random_rows(model, rng)
    candidates = torch.stack(rows)
    chosen = _encoded(model, intervention).unsqueeze(0)
    post = flat.posterior(torch.cat([chosen, candidates]).unsqueeze(0))
    mean, std = post.mean[0], post.stddev[0]
    ucb_best = float((mean + REGRET_BETA * std).max())
    lcb_chosen = float(mean[0] - REGRET_BETA * std[0])
    return ucb_best, lcb_chosen


def _encoded(model: NetworkModel, intervention: Mapping[str, float]) -> torch.Tensor:
    set_actions = tuple(intervention) if model.spec.intervention == "hard" else ()
    return model.flat_encode(model.action_vector(intervention), set_actions)


def _random_rows(model: NetworkModel, rng: torch.Generator) -> list[torch.Tensor]:
    spec = model.spec
    if spec.candidates is not None:
        points = torch.tensor(spec.candidates, dtype=model.dtype, device=model.device)
        return [model.flat_encode(row) for row in points]
    bounds = model.action_bounds()
    sets = spec.allowed_target_sets()
    per_set = max(_CANDIDATES // len(sets), 1)
    rows = []
    for target_set in sets:
        draws = torch.rand(per_set, len(bounds), generator=rng, dtype=model.dtype)
        values = bounds[:, 0] + draws.to(bounds) * (bounds[:, 1] - bounds[:, 0])
        set_actions = tuple(target_set) if spec.intervention == "hard" else ()
        rows += list(model.flat_encode(values, set_actions))
    return rows
