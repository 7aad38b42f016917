"""The exploration weight β of the optimistic policies (MCBO, GP-UCB): constant or a schedule.

Both policies use β the way paper 004 does: the optimistic value is μ + β·σ (MCBO: every node's
hallucinated value μ_i + β·σ_i·η_i). BoTorch's `UpperConfidenceBound(beta)` computes μ + √β·σ,
so the paper's GP-UCB grid β ∈ {0.05, 0.5, 5} (run through BoTorch) meant σ-multipliers
{0.22, 0.71, 2.24} there, against {0.05, 0.5, 5} for MCBO. Here both use β as the multiplier.

Schedule (`kind: "log"`). Paper 004 §2.5 (after Chowdhury & Gopalan 2017) gives
β_t = B + ρ·√(2(γ_t + 1 + ln 1/δ)), with γ_t the maximum information gain after t rounds. For the
slowest-growing kernels γ_t = O(ln t) (linear kernel; the SE kernel adds polylog powers that grow
far too fast to be useful in practice), so β_t ∝ √(c + ln t) with c = 1 + ln(1/δ) in units of
the information-gain constant. Normalizing to β at t = 1:

    β_t = β · √(1 + rate · ln t),      t = rounds with a reward reading so far (≥ 1),

and rate = 1/c. The default rate 0.2 corresponds to δ ≈ 0.02 (c ≈ 5): β grows by ×1.39 over
100 rounds and ×1.66 over 1000. `kind: "constant"` (or no schedule) keeps β fixed, as the
paper's experiments do.

Paper 003 (`kind: "paper003"`, for GP-UCB beside D-GP-UCB) uses Srinivas et al.'s β_t on the
UCB μ + √β_t·σ, scaled by 1/5 in its experiments "for both GP-UCB and D-GP-UCB": the
σ-multiplier is then √(scale·β_t) with β_t from `paper_beta` (one GP, so no union over
components), and `beta` is not used.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from core.network import NetworkModel
from policies.base import PolicySettings


class BetaSchedule(PolicySettings):
    """How β grows with the number of rounds t: constant, or β·√(1 + rate·ln t)."""

    kind: Literal["constant", "log", "paper003"] = Field(
        default="log",
        description="`constant`: β; `log`: β·√(1 + rate·ln t); `paper003`: paper 003's β_t "
        "(its confidence bound for a linear reward), times `scale`.",
    )
    rate: float = Field(default=0.2, ge=0, description="`log`: how fast β grows with t.")
    delta: float = Field(
        default=0.05, gt=0, lt=1, description="`paper003`: the confidence parameter δ."
    )
    scale: float = Field(
        default=0.2, gt=0, description="`paper003`: factor on β_t (the paper uses 1/5)."
    )


def beta_at(beta: float, schedule: BetaSchedule | None, model: NetworkModel) -> float:
    """β for the next proposal, given how many rounds the model has seen rewards for."""
    if schedule is None or schedule.kind == "constant":
        return beta
    if schedule.kind == "paper003":
        spec = model.spec
        raw = paper_beta(
            model.reward_count + 1,
            domain_size=None if spec.candidates is None else len(spec.candidates),
            dim=len(spec.actions),
            components=1,
            linear=True,
            delta=schedule.delta,
        )
        return math.sqrt(schedule.scale * raw)
    t = max(model.reward_count, 1)
    return beta * math.sqrt(1.0 + schedule.rate * math.log(t))


def paper_beta(
    t: int, *, domain_size: int | None, dim: int, components: int, linear: bool, delta: float
) -> float:
    """β_t of paper 003 (Thm 7/8 on a finite domain, §2.6 on a box), before scaling."""
    union = 1 if linear else components
    if domain_size is not None:
        return 2 * math.log(domain_size * union * t**2 * math.pi**2 / (6 * delta))
    first = 2 * math.log(2 * union * t**2 * math.pi**2 / (3 * delta))
    return first + 2 * dim * math.log(t**2 * dim * math.sqrt(math.log(4 * dim / delta)))
