"""KEY3 (paper 001, Sec. 5.2): KEY2's key-and-door gridworld with K = 3 subgoals (θ ∈ [0, 9]⁶)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.key2 import KEY2

__all__ = ["KEY3"]


@dataclass(eq=False)
class KEY3(KEY2):
    @classmethod
    def create(cls, seed: int = 0, subgoals: int = 3, name: str = "key3") -> KEY3:
        return super().create(seed, subgoals, name)
