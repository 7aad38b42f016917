"""Paper 003's flu-prevention task: an age-structured SIR season with vaccination at its start.

Paper 003 (§Experiments, Flu Prevention) uses "a flu age-stratified SIR model (Del Valle, Hyman,
and Chitnis 2013)" with five age groups, a contact matrix and susceptibility that vary by age,
a vaccination rate x ∈ [0, 1]^5 per group, and "the average sick days per person f(x) within one
year" split into the contribution f_j of each group, f = Σ_j f_j, minimised under a budget. The
paper gives no equations or numbers; the model below follows Del Valle et al. 2013 (Math.
Biosci. Eng. 10:1475) in form — frequency-dependent transmission through a reciprocal contact
matrix with age-dependent susceptibility, R0 from the next-generation matrix, residual immunity
— with parameters from the sources in the table.

Dynamics, per group i with population N_i (fractions s_i, ι_i, r_i of the group):

    λ_i = q σ_i Σ_j C_ij ι_j                 force of infection (C_ij: daily contacts of one
    ds_i/dt = -λ_i s_i                        person of i with people of j; N_i C_ij = N_j C_ji)
    dι_i/dt =  λ_i s_i - γ ι_i
    dr_i/dt =  γ ι_i

Season start (day 0): a fraction ρ_i is immune from earlier seasons, ι_i(0) = ι0, and the
vaccination campaign moves ε x_i of the remaining susceptibles to R (doses go to a fraction x_i
of the whole group; only susceptibles benefit, with efficacy ε). q is set so that the spectral
radius of the next-generation matrix q σ_i C_ij / γ equals R0. Integration: classical RK4 with a
1-day step over 365 days (daily output), vectorised over batches of x; RK4 keeps s+ι+r exactly
(to rounding) and differs from a 0.1-day step by ~1e-11.

Outputs: attack_i = ι_i(0) + s_i(0) - s_i(365) (infections this season, seeds included) and the
component f_i = d_i · attack_i · N_i / N, group i's contribution to the average sick days per
person of the whole population (d_i = sick days per infection).

Sign convention: the components are the physical, positive sick-day contributions ("sick_days_*"
nodes); the reward node "neg_sick_days" = -Σ_j f_j, i.e. linear g with weights g_j = -1, so the
reward is maximised and the regret f(x*) - f(x) = sick_days(x) - sick_days(x*) ≥ 0, as in paper
003's max formulation (digest §5: "negate the outputs (g_j = -1)").

Parameters (name = value: source / reason):

  age groups = 0-19, 20-49, 50-64, 65-69, 70+
      paper 003.
  population (millions) = 83.2, 126.8, 58.8, 12.4, 27.8 (shares .269 .410 .190 .040 .090)
      US Census 2010 (Howden & Meyer 2011, "Age and Sex Composition: 2010", Table 1), 5-year
      bins summed.
  contact matrix C (contacts per person per day) = `CONTACTS_RAW`, made reciprocal
      POLYMOD-like (Mossong et al. 2008, PLoS Med. 5:e74): assortative by age, children
      ≈15.6 contacts/day, 70+ ≈6.8/day. An aggregation by us to these bins, not a
      transcription; Del Valle et al.'s EpiSimS matrices use other age bins.
  susceptibility σ = 1.0, 0.75, 0.65, 0.6, 0.6
      assumed: susceptibility per contact declines with age (Del Valle et al. 2013 let it vary
      by group; Glasser et al. 2012, Math. Biosci. 235:1).
  R0 (fully susceptible population) = 1.4
      with the residual immunity below, the season-start reproduction number is 1.23, inside
      the IQR 1.19-1.37 (median 1.28) of seasonal influenza estimates (Biggerstaff et al. 2014,
      BMC Infect. Dis. 14:480).
  infectious period 1/γ = 4 days
      typical influenza value (3-5 days; Carrat et al. 2008).
  residual immunity ρ = 0.10, 0.15, 0.20, 0.25, 0.30
      assumed: grows with age through earlier exposure (Del Valle et al. 2013 discuss
      residual immunity).
  initial infected ι0 = 1e-4 of every group (≈31 000 people)
      assumed seeding.
  sick days per infection d = 0.67 × (4.0, 4.5, 5.0, 6.0, 7.0)
      symptomatic fraction ≈ 0.67 (Carrat et al. 2008, Am. J. Epidemiol. 167:775) × days of
      illness, assumed longer with age.
  vaccine efficacy ε = 0.6
      Osterholm et al. 2012 (Lancet Infect. Dis. 12:36): pooled TIV efficacy 59%.
  horizon = 365 days, RK4 step 1 day
      paper: "within one year".
  reporting noise = std 0.005 sick days per person on every component
      assumed surveillance error, ≈2% of the largest component.
  budget B = 0.10 doses per person of the whole population per season (≈31 million doses)
      chosen so the budget binds and the optimum is informative: from B ≈ 0.15 the best plan
      all but stops the epidemic (< 0.012 sick days, a flat near-zero region); at 0.10 it cuts
      sick days by 74% while random feasible plans lose 0.12-0.46 days to it.

Cost: action i has cost 0 and cost_per_unit = N_i / N (doses per person of the population per
unit vaccination rate), so `cost(x)` = Σ_i share_i x_i is the doses used, and a spec's per-round
budget B is the constraint Σ_i share_i x_i ≤ B under which `optimum` is computed.

Without vaccination: attack rate 21.6% overall (37%, 20%, 13%, 9%, 5.5% by group), 0.638 sick
days per person. Optimum at the default budget: all doses to 0-19 (x = 0.371, 0, 0, 0, 0), 0.165
sick days per person — vaccinating the main transmitters, as in Medlock & Galvani 2009 (Science
325:1705); random feasible plans: median 0.52, uniform x = 0.1: 0.43.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import scipy.optimize
import torch

from sim._decomposed import DTYPE, DecomposedEnvironment
from sim.base import ActionInfo, NodeInfo, Optimum

GROUPS = ("0_19", "20_49", "50_64", "65_69", "70_plus")
POPULATION_MILLIONS = (83.2, 126.8, 58.8, 12.4, 27.8)
# Daily contacts of one person of the row group with people of the column group, before the
# reciprocity correction N_i C_ij = N_j C_ji (POLYMOD-like, see the module table).
CONTACTS_RAW = (
    (9.0, 4.5, 1.5, 0.3, 0.4),
    (3.0, 8.0, 2.2, 0.4, 0.5),
    (2.0, 4.5, 3.5, 0.6, 0.7),
    (1.2, 2.5, 1.8, 1.3, 1.0),
    (1.0, 1.8, 1.4, 0.8, 1.6),
)
SUSCEPTIBILITY = (1.0, 0.75, 0.65, 0.6, 0.6)
RESIDUAL_IMMUNITY = (0.10, 0.15, 0.20, 0.25, 0.30)
SICK_DAYS_PER_INFECTION = tuple(0.67 * d for d in (4.0, 4.5, 5.0, 6.0, 7.0))
R0 = 1.4
INFECTIOUS_DAYS = 4.0
INITIAL_INFECTED = 1e-4
VACCINE_EFFICACY = 0.6
HORIZON_DAYS = 365
REPORTING_NOISE_STD = 0.005
DEFAULT_BUDGET = 0.10


class AgeStructuredSIR(DecomposedEnvironment):
    """Five-age-group SIR flu season; actions: vaccination rates; reward: -sick days per person.

    Args:
        budget: doses per person of the whole population per season, B in Σ share_i x_i ≤ B;
            `optimum` respects it (default 0.10, see the module table).
        r0: basic reproduction number in a fully susceptible population.
        vaccine_efficacy: ε, a float or one value per group.
        noise_std: reporting-noise std of every component (sick days per person).
        n_initial: size of `initial_design` (default 2·(A+1) = 12).

    Attributes:
        population: (5,) float64 people per group; `shares` = population / total.
        contacts: (5, 5) reciprocal daily contact matrix C.
        transmissibility: q (per contact per day), calibrated to `r0`.
    """

    reward_kind = "linear"

    def __init__(
        self,
        budget: float = DEFAULT_BUDGET,
        r0: float = R0,
        vaccine_efficacy: float | Sequence[float] = VACCINE_EFFICACY,
        noise_std: float = REPORTING_NOISE_STD,
        n_initial: int = 12,
    ) -> None:
        self.budget = float(budget)
        self.r0 = float(r0)
        self.n_initial = n_initial
        self.population = np.array(POPULATION_MILLIONS) * 1e6
        self.shares = self.population / self.population.sum()
        raw = self.shares[:, None] * np.array(CONTACTS_RAW)
        self.contacts = (raw + raw.T) / (2.0 * self.shares[:, None])
        self.susceptibility = np.array(SUSCEPTIBILITY)
        self.gamma = 1.0 / INFECTIOUS_DAYS
        self.efficacy = np.broadcast_to(np.asarray(vaccine_efficacy, dtype=float), (5,)).copy()
        self.residual_immunity = np.array(RESIDUAL_IMMUNITY)
        self.sick_days_per_infection = np.array(SICK_DAYS_PER_INFECTION)
        next_gen = self.susceptibility[:, None] * self.contacts / self.gamma
        self.transmissibility = self.r0 / float(np.abs(np.linalg.eigvals(next_gen)).max())
        self._noise_std = torch.full((5,), float(noise_std), dtype=DTYPE)
        self._cache: dict[tuple[float, ...], np.ndarray] = {}

        components = tuple(f"sick_days_{g}" for g in GROUPS)
        # Representative ranges: sick days fall monotonically with vaccination, so the extremes
        # are at x = 0 and x = 1 (the latter ignores the budget), padded by 3 noise stds.
        worst, best = self._components_np(np.stack([np.zeros(5), np.ones(5)]))
        pad = 3.0 * float(noise_std)
        nodes = [
            NodeInfo(
                name, (), float(noise_std), (float(best[j] - pad), float(1.1 * worst[j] + pad))
            )
            for j, name in enumerate(components)
        ]
        reward_bounds = (float(-1.1 * worst.sum() - pad), float(-best.sum() + pad))
        nodes.append(NodeInfo("neg_sick_days", components, 0.0, reward_bounds))
        actions = tuple(
            ActionInfo(f"vacc_{g}", components, (0.0, 1.0), cost=0.0, cost_per_unit=float(s))
            for g, s in zip(GROUPS, self.shares, strict=True)
        )
        super().__init__(
            name="sir",
            intervention_type="soft",
            nodes=tuple(nodes),
            actions=actions,
            reward_node="neg_sick_days",
            description=(
                "paper 003 flu prevention: five-age-group SIR season, vaccination rates per "
                f"group, reward = -average sick days per person; budget {self.budget} doses/person"
            ),
            reward_components=components,
        )

    # ----------------------------------------------------------------- epidemic
    def _start(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fractions (s, ι, r) of every group on day 0 after vaccination; x: (B, 5)."""
        infected = np.full_like(x, INITIAL_INFECTED)
        susceptible = (1.0 - self.residual_immunity - INITIAL_INFECTED) * (1.0 - self.efficacy * x)
        return susceptible, infected, 1.0 - susceptible - infected

    def _rates(self, s: np.ndarray, i: np.ndarray) -> tuple[np.ndarray, ...]:
        """(ds, dι, dr)/dt of the group fractions; they sum to zero."""
        force = self.transmissibility * self.susceptibility * (i @ self.contacts.T)
        incidence = force * s
        recovery = self.gamma * i
        return -incidence, incidence - recovery, recovery

    def _rk4_day(self, state: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """One classical RK4 step of one day for (s, ι, r); r is integrated, not derived, so
        s + ι + r = 1 is a real check (RK4 keeps linear invariants up to rounding)."""
        k1 = self._rates(state[0], state[1])
        mid1 = [y + 0.5 * k for y, k in zip(state, k1, strict=True)]
        k2 = self._rates(mid1[0], mid1[1])
        mid2 = [y + 0.5 * k for y, k in zip(state, k2, strict=True)]
        k3 = self._rates(mid2[0], mid2[1])
        k4 = self._rates(state[0] + k3[0], state[1] + k3[1])
        return tuple(
            y + (a + 2.0 * b + 2.0 * c + d) / 6.0
            for y, a, b, c, d in zip(state, k1, k2, k3, k4, strict=True)
        )

    def _components_np(self, x: np.ndarray) -> np.ndarray:
        """(B, 5) vaccination rates -> (B, 5) sick-day contributions per person of the total."""
        state = self._start(x)
        for _ in range(HORIZON_DAYS):
            state = self._rk4_day(state)
        attack = INITIAL_INFECTED + self._start(x)[0] - state[0]
        return self.sick_days_per_infection * attack * self.shares

    def trajectory(self, x: torch.Tensor | Sequence[float]) -> dict[str, torch.Tensor]:
        """Daily people counts of the season: x (..., 5) -> S, I, R each (..., 366, 5) float64.

        R includes the residually immune and the vaccinated. Each compartment is integrated on
        its own, so S + I + R = N_i for every group and day is a property of the integrator.
        """
        x = np.asarray(torch.as_tensor(x, dtype=DTYPE))
        state = self._start(x.reshape(-1, 5))
        days = [state]
        for _ in range(HORIZON_DAYS):
            state = self._rk4_day(state)
            days.append(state)
        shape = (*x.shape[:-1], HORIZON_DAYS + 1, 5)
        return {
            name: torch.from_numpy((np.stack(frac, 1) * self.population).reshape(shape))
            for name, frac in zip("SIR", zip(*days, strict=True), strict=True)
        }

    def attack_rates(self, x: torch.Tensor | Sequence[float]) -> torch.Tensor:
        """Fraction of each group infected during the season: (..., 5) -> (..., 5)."""
        return self.expected_components(torch.as_tensor(x, dtype=DTYPE)) / torch.from_numpy(
            self.sick_days_per_infection * self.shares
        )

    # ----------------------------------------------------------------- decomposition
    def expected_components(self, x: torch.Tensor) -> torch.Tensor:
        """(..., 5) vaccination rates -> (..., 5) noiseless sick days per person by group."""
        x = torch.as_tensor(x, dtype=DTYPE)
        if x.dim() == 1:
            return torch.from_numpy(self._cached_components(tuple(x.tolist())).copy())
        flat = x.reshape(-1, 5).numpy()
        return torch.from_numpy(self._components_np(flat)).reshape(x.shape)

    def _cached_components(self, x: tuple[float, ...]) -> np.ndarray:
        """One plan's components, memoised: an agent samples the same plan many times."""
        if x not in self._cache:
            if len(self._cache) >= 1024:
                self._cache.clear()
            self._cache[x] = self._components_np(np.array([x]))[0]
        return self._cache[x]

    def reward_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Known weights g_j(x) ≡ -1 (reward = -sick days): (..., 5) -> (..., 5)."""
        return -torch.ones(*x.shape[:-1], 5, dtype=DTYPE)

    def compose_reward(self, components: torch.Tensor) -> torch.Tensor:
        """g = -Σ_j f_j: (..., 5) -> (...)."""
        return -components.sum(-1)

    def reward_derivative_bounds(self) -> list[float]:
        """B_j = max |g_j| = 1."""
        return [1.0] * 5

    def total_sick_days(self, x: torch.Tensor | Sequence[float]) -> torch.Tensor:
        """Noiseless average sick days per person: (..., 5) -> (...) (= -f)."""
        return self.expected_components(torch.as_tensor(x, dtype=DTYPE)).sum(-1)

    # ----------------------------------------------------------------- budget
    def doses(self, x: torch.Tensor | Sequence[float]) -> torch.Tensor:
        """Doses per person of the population, Σ_i share_i x_i: (..., 5) -> (...)."""
        return torch.as_tensor(x, dtype=DTYPE) @ torch.from_numpy(self.shares)

    def feasible(self, x: torch.Tensor | Sequence[float], tol: float = 1e-9) -> torch.Tensor:
        """Whether x lies in [0, 1]^5 and within the budget: (..., 5) -> (...) bool."""
        x = torch.as_tensor(x, dtype=DTYPE)
        in_box = ((x >= -tol) & (x <= 1.0 + tol)).all(-1)
        return in_box & (self.doses(x) <= self.budget + tol)

    def random_feasible(self, num: int, rng: np.random.Generator) -> np.ndarray:
        """`num` points uniform on {x ∈ [0, 1]^5 : Σ share_i x_i ≤ budget}, (num, 5).

        Rejection from whichever of the two enclosing sets is smaller: the unit box, or the
        simplex {x ≥ 0, Σ share_i x_i ≤ budget} (uniform via a flat Dirichlet on 6 coordinates),
        so small budgets do not starve the sampler.
        """
        scale = self.budget / self.shares
        from_simplex = float(np.prod(scale)) / math.factorial(5) < 1.0
        out: list[np.ndarray] = []
        while sum(len(o) for o in out) < num:
            m = 4 * num + 64
            if from_simplex:
                draw = rng.dirichlet(np.ones(6), m)[:, :5] * scale
                out.append(draw[(draw <= 1.0).all(-1)])
            else:
                draw = rng.random((m, 5))
                out.append(draw[draw @ self.shares <= self.budget])
        return np.concatenate(out)[:num]

    # ----------------------------------------------------------------- oracle
    def _compute_optimum(self) -> Optimum:
        """min sick days over the budget polytope: batched search, then SLSQP multistart.

        Stage 1 evaluates 2048 uniform feasible points and the 120 greedy vertices (groups
        filled to 1 in every order until the budget is spent) in one batched integration;
        stage 2 polishes the best 4 with SLSQP (central-difference gradients, batched).
        """
        rng = np.random.default_rng(0)
        starts = np.concatenate([self.random_feasible(2048, rng), self._greedy_vertices()])
        values = self._components_np(starts).sum(-1)
        best_x, best_v = starts[values.argmin()], float(values.min())
        for start in starts[np.argsort(values)[:4]]:
            x, v = self._polish(start)
            if v < best_v:
                best_x, best_v = x, v
        return Optimum(self.intervention_of(torch.from_numpy(best_x)), -best_v)

    def _greedy_vertices(self) -> np.ndarray:
        vertices = []
        for order in itertools.permutations(range(5)):
            x, left = np.zeros(5), self.budget
            for g in order:
                x[g] = min(1.0, left / self.shares[g])
                left -= x[g] * self.shares[g]
            vertices.append(x)
        return np.array(vertices)

    def _polish(self, start: np.ndarray) -> tuple[np.ndarray, float]:
        # The model extends smoothly beyond [0, 1], so central differences are fine on the faces.
        step = 1e-6
        offsets = np.concatenate([np.zeros((1, 5)), step * np.eye(5), -step * np.eye(5)])

        def fun_and_grad(x: np.ndarray) -> tuple[float, np.ndarray]:
            v = self._components_np(x + offsets).sum(-1)
            return float(v[0]), (v[1:6] - v[6:]) / (2.0 * step)

        result = scipy.optimize.minimize(
            fun_and_grad,
            start,
            jac=True,
            method="SLSQP",
            bounds=[(0.0, 1.0)] * 5,
            constraints=[
                {
                    "type": "ineq",
                    "fun": lambda x: self.budget - x @ self.shares,
                    "jac": lambda x: -self.shares,
                }
            ],
            options={"maxiter": 200, "ftol": 1e-12},
        )
        x = np.clip(result.x, 0.0, 1.0)
        excess = x @ self.shares - self.budget
        if excess > 0:  # SLSQP may overshoot by ~1e-12; scale back onto the budget
            x = x * (self.budget / (x @ self.shares))
        return x, float(self._components_np(x[None]).sum())

    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """`n_initial` (default 12) plans uniform on the budget polytope (numpy PCG64, `seed`)."""
        x = self.random_feasible(self.n_initial, np.random.default_rng(seed))
        return [self.intervention_of(torch.from_numpy(row)) for row in x]
