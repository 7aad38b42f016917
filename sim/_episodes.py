"""Environments whose action is a controller's parameter vector θ and whose reward is the return
of one episode run with it (paper 000's MPE and Multi-agent MuJoCo tasks).

A subclass sets `dim`, runs one episode in `episode(theta, seed)` and names, as class
attributes, how many episodes its oracle averages and the return it reports as the optimum's
value (no closed-form optimum exists: the reference is a return no policy is known to beat).
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch

from sim.base import Environment, Optimum


class EpisodeEnvironment(Environment):
    """θ = (theta.0 … theta.{dim-1}) in [−1, 1]; R = the return of one episode with θ."""

    dim: int
    oracle_episodes: int
    reference_return: float
    # Visited states (issue 13): a device that sends them (`DeviceSettings.send_states`), or
    # `bench regret` for a policy that takes them, sets `record_states`; an environment that
    # supports it keeps its last episode's observations (T, agents, obs) in `last_states`
    # (`keep_states`).
    record_states: bool = False
    last_states: np.ndarray | None = None
    records_states: bool = False  # whether `episode` fills `last_states` when asked

    def keep_states(self, visited: list[np.ndarray]) -> None:
        """Keep an episode's observations, each (agents, obs), as `last_states`: evenly thinned
        to at most MAX_ARRAY_ELEMENTS values, so that they fit one reading."""
        from connectors.arrays import MAX_ARRAY_ELEMENTS

        states = np.stack(visited).astype(np.float64)
        room = max(1, MAX_ARRAY_ELEMENTS // (states.shape[1] * states.shape[2]))
        if len(states) > room:
            states = states[np.linspace(0, len(states) - 1, room).round().astype(int)]
        self.last_states = states

    @abstractmethod
    def episode(self, theta: np.ndarray, seed: int) -> float:
        """The return of one episode of the controller θ, its randomness drawn from `seed`."""

    def _theta(self, values: dict[str, float]) -> np.ndarray:
        return np.array([values.get(f"theta.{i}", 0.0) for i in range(self.dim)])

    def cost(self, intervention) -> float:
        """One episode costs 1, as the spec's `parameters.cost`."""
        return 1.0 if intervention else 0.0

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        theta = self._theta(values)
        seeds = torch.randint(0, 2**31 - 1, (num,), generator=generator).tolist()
        returns = [self.episode(theta, seed) for seed in seeds]
        return {"R": torch.tensor(returns, dtype=torch.float64)}

    def expected_reward(self, intervention) -> float:
        theta = self._theta(self.validate(intervention))
        episodes = [self.episode(theta, 10_000 + k) for k in range(self.oracle_episodes)]
        return float(np.mean(episodes))

    def _compute_optimum(self) -> Optimum:
        return Optimum({f"theta.{i}": 0.0 for i in range(self.dim)}, self.reference_return)

    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """Two uniform random θ, the same for every policy of a seed."""
        g = torch.Generator().manual_seed(seed)
        draws = torch.rand(2, self.dim, generator=g, dtype=torch.float64) * 2.0 - 1.0
        return [{f"theta.{i}": float(v) for i, v in enumerate(row)} for row in draws]
