"""PSAGraph of Aglietti et al. (2020), after Ferro et al. (2015), as used in paper 004 (MCBO)."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import torch
from scipy.optimize import minimize

from sim._paper004 import HardGraph, noise
from sim._quadrature import standard_normal_rule, uniform_rule
from sim.base import ActionInfo, Intervention, NodeInfo, Optimum

AGE_RANGE = (55.0, 75.0)  # [C] age ~ U(55, 75)
BMI_STD = 0.7  # [C] torch.normal(mean, 0.7): a standard deviation
PSA_STD = 0.4  # [C] torch.normal(mean, 0.4)
MODEL_STD = {  # [C] `additive_noise_dists`, the noise the model assumes (see class docstring)
    "age": 20.0 / math.sqrt(12.0),  # U(−10, 10)
    "bmi": BMI_STD,
    "aspirin": 1e-3,
    "statin": 1e-3,
    "cancer": 1e-3,
    "psa": PSA_STD,
}

# Representative node ranges: min/max of `sim._paper004.sampled_ranges(env, 20000, 10, seed=0)`
# (20000 random admissible interventions, target set uniform over the four sets and dosages
# uniform in [0, 1], × 10 rounds), padded by 5% and rounded (`padded_bounds`).
_BOUNDS = {
    "age": (54.0, 76.0),
    "bmi": (22.65, 29.6),
    "aspirin": (-0.05, 1.05),
    "statin": (-0.05, 1.05),
    "cancer": (0.195, 0.45),
    "psa": (-8.1, -3.3),
}


def _sigmoid(z):
    lib = torch if isinstance(z, torch.Tensor) else np
    return 1.0 / (1.0 + lib.exp(-z))


def _aspirin(age, bmi):
    return _sigmoid(-8.0 + 0.10 * age + 0.03 * bmi)


def _statin(age, bmi):
    return _sigmoid(-13.0 + 0.10 * age + 0.20 * bmi)


def _cancer(age, bmi, aspirin, statin):
    return _sigmoid(2.2 - 0.05 * age + 0.01 * bmi - 0.04 * statin + 0.02 * aspirin)


def _psa_mean(age, bmi, aspirin, statin, cancer):
    """Mean PSA level (before negation)."""
    return 6.8 + 0.04 * age - 0.15 * bmi - 0.60 * statin + 0.55 * aspirin + 1.00 * cancer


class PSAGraph(HardGraph):
    """PSAGraph (Aglietti et al. 2020, after Ferro et al. 2015), as in paper 004.

    Graph (nodes X0..X4, Y of the paper) [P Fig. 3, C parents]:
        age → bmi; age, bmi → aspirin, statin; age, bmi, aspirin, statin → cancer;
        age, bmi, aspirin, statin, cancer → psa.
    Hard interventions do_aspirin and do_statin, dosages in [0, 1] [C: `do_map` is the
    identity]; target sets I = {∅, {aspirin}, {statin}, {aspirin, statin}} [P §5]. The authors'
    code offered only the three non-empty sets during BO (`valid_targets` omits ∅) and used ∅
    only in the initial design; this class follows the paper and allows ∅.

        age     ~ U(55, 75)                                                   [C]
        bmi     ~ N(27 − 0.01·age, 0.7²)                                      [C]
        aspirin = σ(−8.0 + 0.10·age + 0.03·bmi)                               [C]
        statin  = σ(−13.0 + 0.10·age + 0.20·bmi)                              [C]
        cancer  = σ(2.2 − 0.05·age + 0.01·bmi − 0.04·statin + 0.02·aspirin)  [C]
        psa     = −N(6.8 + 0.04·age − 0.15·bmi − 0.60·statin + 0.55·aspirin
                     + 1.00·cancer, 0.4²)                                     [C]
    σ is the logistic function. The `psa` node reads the *negated* PSA level (larger is
    better), as in the code, because CBO minimizes and MCBO maximizes.

    noise_std (what the model assumes): the code's model-side noise distributions [C]:
    age 20/√12 ≈ 5.77 (the std of its U(−10, 10); equal to the std of U(55, 75)), bmi 0.7,
    aspirin/statin/cancer 0.001 (deterministic in the simulator, a jitter for the model),
    psa 0.4.

    Oracle: E[psa | I, a] by quadrature over age (48-point Gauss–Legendre) and bmi | age
    (48-point Gauss–Hermite); psa's own noise averages out linearly. Exact to ~1e-14.

    Optimum: do(aspirin = 0, statin = 1) with E[psa] ≈ −5.15529. The code's test quotes
    −5.151712726 and checks it by a 1000-sample average within 0.05; the exact expectation of
    the code's own equations is −5.15529 (quadrature, dblquad and a 2·10⁷-sample average
    agree). psa increases with the statin dose and decreases with the aspirin dose everywhere
    (also through cancer), so among all target sets the corner of {aspirin, statin} wins;
    computed numerically (multistart L-BFGS-B over every target set).
    """

    def __init__(self) -> None:
        nodes = (
            ("age", ()),
            ("bmi", ("age",)),
            ("aspirin", ("age", "bmi")),
            ("statin", ("age", "bmi")),
            ("cancer", ("age", "bmi", "aspirin", "statin")),
            ("psa", ("age", "bmi", "aspirin", "statin", "cancer")),
        )
        super().__init__(
            name="psagraph",
            intervention_type="hard",
            nodes=tuple(
                NodeInfo(name, parents, MODEL_STD[name], _BOUNDS[name]) for name, parents in nodes
            ),
            actions=(
                ActionInfo("do_aspirin", ("aspirin",), (0.0, 1.0)),
                ActionInfo("do_statin", ("statin",), (0.0, 1.0)),
            ),
            reward_node="psa",
            target_sets=((), ("do_aspirin",), ("do_statin",), ("do_aspirin", "do_statin")),
            description="PSAGraph (Aglietti et al. 2020; paper 004): aspirin and statin dosing "
            "against negated PSA, hard interventions",
        )
        ages, age_w = uniform_rule(*AGE_RANGE, order=48)
        z, z_w = standard_normal_rule(48)
        # Quadrature grid over (age, bmi), flattened: (Q,) each.
        self._age = np.repeat(ages, z.size)
        self._bmi = (27.0 - 0.01 * self._age) + BMI_STD * np.tile(z, ages.size)
        self._weights = np.outer(age_w, z_w).ravel()

    def _sample(
        self, values: dict[str, float], num: int, generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        low, high = AGE_RANGE
        age = low + (high - low) * torch.rand(num, generator=generator, dtype=torch.float64)
        bmi = 27.0 - 0.01 * age + noise(num, BMI_STD, generator)
        aspirin = self._dose(values, "do_aspirin", num, _aspirin(age, bmi))
        statin = self._dose(values, "do_statin", num, _statin(age, bmi))
        cancer = _cancer(age, bmi, aspirin, statin)
        psa = -(_psa_mean(age, bmi, aspirin, statin, cancer) + noise(num, PSA_STD, generator))
        return {
            "age": age,
            "bmi": bmi,
            "aspirin": aspirin,
            "statin": statin,
            "cancer": cancer,
            "psa": psa,
        }

    @staticmethod
    def _dose(values: dict[str, float], action: str, num: int, natural):
        if action in values:
            return torch.full((num,), values[action], dtype=torch.float64)
        return natural

    def _mean_psa(self, aspirin: np.ndarray | None, statin: np.ndarray | None) -> np.ndarray:
        """E[psa] for a batch of dosages, (N,) each; None leaves that drug to its mechanism."""
        batch = max(np.size(d) if d is not None else 1 for d in (aspirin, statin))
        age, bmi = self._age[None, :], self._bmi[None, :]
        a = _aspirin(age, bmi) if aspirin is None else np.reshape(aspirin, (-1, 1))
        s = _statin(age, bmi) if statin is None else np.reshape(statin, (-1, 1))
        mean = -_psa_mean(age, bmi, a, s, _cancer(age, bmi, a, s))
        return np.broadcast_to(mean, (batch, age.size)) @ self._weights

    def expected_reward(self, intervention: Intervention) -> float:
        values = self.validate(intervention)
        return float(self._mean_psa(values.get("do_aspirin"), values.get("do_statin"))[0])

    def _compute_optimum(self) -> Optimum:
        best = Optimum({}, float(self._mean_psa(None, None)[0]))
        for target_set in self.target_sets:
            if not target_set:
                continue

            def objective(x: np.ndarray, names=target_set) -> float:
                doses = dict(zip(names, x, strict=True))
                return -float(self._mean_psa(doses.get("do_aspirin"), doses.get("do_statin"))[0])

            # Multistart L-BFGS-B from the corners and the centre of the dosage box.
            starts = [*product((0.0, 1.0), repeat=len(target_set)), (0.5,) * len(target_set)]
            for start in starts:
                result = minimize(
                    objective, np.array(start), method="L-BFGS-B", bounds=[(0.0, 1.0)] * len(start)
                )
                if -result.fun > best.value:
                    doses = dict(zip(target_set, map(float, result.x), strict=True))
                    best = Optimum(doses, -float(result.fun))
        return best
