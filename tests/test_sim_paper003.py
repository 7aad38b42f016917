"""The three environments of paper 003 (decomposed feedback): synthetic, SIR flu, weather."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.integrate
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim._conus import inside
from sim.decomposed_synthetic import DecomposedSynthetic
from sim.sir import AgeStructuredSIR
from sim.weather import WeatherField, apparent_temperature

DTYPE = torch.float64


@pytest.fixture(scope="module")
def synthetic() -> DecomposedSynthetic:
    return DecomposedSynthetic(seed=0)


@pytest.fixture(scope="module")
def sir() -> AgeStructuredSIR:
    return AgeStructuredSIR()


@pytest.fixture(scope="module")
def weather() -> WeatherField:
    return WeatherField(seed=0, n_sensors=800)


@pytest.fixture(params=["synthetic", "sir", "weather"])
def env(request):
    return request.getfixturevalue(request.param)


def _some_interventions(env, n: int = 5) -> list[dict[str, float]]:
    return env.initial_design(123)[:n]


# --------------------------------------------------------------------- common contract
def test_structure(env) -> None:
    assert env.intervention_type == "soft"
    reward = env.nodes[env._node_index[env.reward_node]]
    assert reward.parents == env.reward_components
    assert reward.noise_std == 0.0
    for j, name in enumerate(env.reward_components):
        node = env.nodes[env._node_index[name]]
        assert node.parents == ()
        assert node.noise_std == pytest.approx(float(env.component_noise_std[j]))
        assert node.bounds[0] < node.bounds[1]
    for action in env.actions:
        assert set(action.targets) == set(env.reward_components)


def test_sample_reward_is_g_of_noisy_components(env) -> None:
    generator = torch.Generator().manual_seed(7)
    for intervention in _some_interventions(env, 3):
        sample = env.sample(intervention, 400, generator)
        components = torch.stack([sample[n] for n in env.reward_components], -1)
        assert all(v.shape == (400,) and v.dtype == DTYPE for v in sample.values())
        torch.testing.assert_close(
            sample[env.reward_node], env.compose_reward(components), rtol=0, atol=1e-12
        )
        mean = env.expected_components(env.action_tensor(intervention))
        std = env.component_noise_std
        assert ((components.mean(0) - mean).abs() < 5 * std / 20).all()
        assert ((components.std(0) / std - 1).abs() < 0.2).all()


def test_oracle_is_g_of_noiseless_components(env) -> None:
    for intervention in _some_interventions(env):
        x = env.action_tensor(intervention)
        expected = float(env.compose_reward(env.expected_components(x)))
        assert env.expected_reward(intervention) == pytest.approx(expected, abs=1e-12)


def test_step_returns_every_node(env) -> None:
    reading = env.step(_some_interventions(env, 1)[0], torch.Generator().manual_seed(0))
    assert set(reading) == set(env.node_names)


def test_initial_design_is_admissible_and_seeded(env) -> None:
    design = env.initial_design(5)
    assert len(design) == 2 * (len(env.actions) + 1)
    assert design == env.initial_design(5)
    assert design != env.initial_design(6)
    for intervention in design:
        env.validate(intervention)
    if env.candidates is not None:
        assert len({tuple(d.values()) for d in design}) == len(design)


def test_linear_envs_expose_weights(synthetic, sir) -> None:
    for env, sign in ((synthetic, 1.0), (sir, -1.0)):
        assert env.reward_kind == "linear"
        x = torch.rand(4, 3, len(env.actions), dtype=DTYPE)
        weights = env.reward_weights(x)
        assert weights.shape == (4, 3, env.num_components)
        assert (weights == sign).all()
        components = torch.randn(4, 3, env.num_components, dtype=DTYPE)
        torch.testing.assert_close(env.compose_reward(components), (weights * components).sum(-1))
        assert env.reward_derivative_bounds() == [1.0] * env.num_components


# --------------------------------------------------------------------- synthetic
def test_synthetic_matches_paper_setup(synthetic) -> None:
    assert synthetic.name == "decomposed-synthetic"
    assert synthetic.candidates.shape == (1000, 1)
    assert synthetic.functions.shape == (10, 1000)
    assert synthetic.component_noise_std.tolist() == pytest.approx([0.01] * 10)
    assert ((synthetic.lengthscales >= 0.03) & (synthetic.lengthscales <= 0.3)).all()
    assert ((synthetic.outputscales >= 0.25) & (synthetic.outputscales <= 1.0)).all()
    torch.testing.assert_close(synthetic.objective, synthetic.functions.sum(0))


def test_synthetic_functions_look_like_their_kernels(synthetic) -> None:
    # Sample std of each draw is of the order of its outputscale; the shortest-lengthscale
    # draw wiggles more (more sign changes of its derivative) than the longest. Turns are counted
    # on every 10th grid point: the draw's jitter (std 1e-4·s) adds turns at the grid's own scale.
    scales = synthetic.functions.std(1) / synthetic.outputscales.sqrt()
    assert ((scales > 0.15) & (scales < 3.0)).all()
    coarse = synthetic.functions[:, ::10]
    turns = (coarse.diff(dim=1).sign().diff(dim=1) != 0).sum(1)
    assert turns[synthetic.lengthscales.argmin()] > turns[synthetic.lengthscales.argmax()]


def test_synthetic_reproducible_per_seed_and_differs_across_seeds(synthetic) -> None:
    again = DecomposedSynthetic(seed=0)
    other = DecomposedSynthetic(seed=1)
    assert torch.equal(again.functions, synthetic.functions)
    assert torch.equal(again.lengthscales, synthetic.lengthscales)
    assert not torch.allclose(other.functions, synthetic.functions)
    assert not torch.allclose(other.lengthscales, synthetic.lengthscales)


def test_synthetic_optimum_is_grid_max(synthetic) -> None:
    best = int(synthetic.objective.argmax())
    assert synthetic.optimum.value == pytest.approx(float(synthetic.objective[best]))
    assert synthetic.optimum.intervention == {"x": float(synthetic.grid[best])}
    assert synthetic.expected_reward(synthetic.optimum.intervention) == synthetic.optimum.value


def test_synthetic_rejects_points_off_the_grid(synthetic) -> None:
    with pytest.raises(ValueError, match="candidates"):
        synthetic.validate({"x": 0.0005})
    with pytest.raises(ValueError, match="outside"):
        synthetic.validate({"x": 1.5})
    with pytest.raises(ValueError):
        synthetic.expected_components(torch.tensor([[0.0005]], dtype=DTYPE))
    synthetic.validate({"x": float(synthetic.grid[17])})


# --------------------------------------------------------------------- SIR
def test_sir_conserves_population_every_day(sir) -> None:
    x = torch.rand(6, 5, dtype=DTYPE)
    x[0] = 0.0
    x[1] = 1.0
    traj = sir.trajectory(x)
    assert traj["S"].shape == (6, 366, 5)
    population = torch.from_numpy(sir.population)
    per_group = traj["S"] + traj["I"] + traj["R"]
    torch.testing.assert_close(per_group, population.expand_as(per_group), rtol=1e-12, atol=0)
    torch.testing.assert_close(
        per_group.sum(-1),
        torch.full((6, 366), population.sum().item(), dtype=DTYPE),
        rtol=1e-12,
        atol=0,
    )
    for compartment in traj.values():
        assert (compartment >= -1e-6).all()
    assert (traj["S"].diff(dim=1) <= 1e-6).all()  # susceptibles only ever leave
    assert (traj["R"].diff(dim=1) >= -1e-6).all()


def test_sir_rk4_matches_tight_solve_ivp(sir) -> None:
    x = np.array([0.3, 0.1, 0.0, 0.5, 0.2])
    s0, i0, _ = sir._start(x[None])

    def rhs(_t, y):
        ds, di, _ = sir._rates(y[None, :5], y[None, 5:])
        return np.concatenate([ds[0], di[0]])

    sol = scipy.integrate.solve_ivp(
        rhs, (0, 365), np.concatenate([s0[0], i0[0]]), rtol=1e-11, atol=1e-13, method="DOP853"
    )
    attack = i0[0] + s0[0] - sol.y[:5, -1]
    reference = sir.sick_days_per_infection * attack * sir.shares
    expected = sir.expected_components(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(expected, reference, rtol=1e-6, atol=1e-9)


def test_sir_zero_vaccination_attack_rate_is_plausible(sir) -> None:
    attack = sir.attack_rates(torch.zeros(5, dtype=DTYPE))
    overall = float((attack * torch.from_numpy(sir.shares)).sum())
    assert 0.10 <= overall <= 0.40
    assert ((attack > 0.02) & (attack < 0.6)).all()
    assert attack[0] == attack.max()  # children carry the epidemic
    sick_days = float(sir.total_sick_days(torch.zeros(5, dtype=DTYPE)))
    assert 0.1 < sick_days < 2.0


@pytest.mark.parametrize("group", range(5))
def test_sir_more_vaccination_never_increases_sick_days(sir, group: int) -> None:
    levels = torch.linspace(0, 1, 21, dtype=DTYPE)
    bases = torch.cat(
        [torch.zeros(1, 5), torch.rand(3, 5, generator=torch.Generator().manual_seed(3))]
    )
    x = bases.to(DTYPE)[:, None, :].repeat(1, 21, 1)
    x[..., group] = levels
    total = sir.total_sick_days(x)  # (4, 21)
    assert (total.diff(dim=-1) <= 1e-12).all()
    assert (total[:, -1] < total[:, 0]).all()


def test_sir_cost_is_doses(sir) -> None:
    plan = {"vacc_0_19": 0.5, "vacc_70_plus": 1.0}
    expected = 0.5 * sir.shares[0] + sir.shares[4]
    assert sir.cost(plan) == pytest.approx(expected)
    assert float(sir.doses(sir.action_tensor(plan))) == pytest.approx(expected)
    assert sum(sir.shares) == pytest.approx(1.0)


def test_sir_optimum_respects_budget(sir) -> None:
    x = sir.action_tensor(sir.optimum.intervention)
    assert bool(sir.feasible(x))
    assert float(sir.doses(x)) <= sir.budget + 1e-12
    assert float(sir.doses(x)) == pytest.approx(sir.budget, abs=1e-6)  # the budget binds
    assert sir.expected_reward(sir.optimum.intervention) == pytest.approx(sir.optimum.value)
    zero = sir.expected_reward({})
    assert sir.optimum.value > zero + 0.1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5))
def test_sir_optimum_beats_random_feasible_plans(sir, raw: list[float]) -> None:
    x = np.array(raw)
    doses = float(x @ sir.shares)
    if doses > sir.budget:
        x = x * (sir.budget / doses)
    intervention = sir.intervention_of(torch.from_numpy(x))
    assert bool(sir.feasible(sir.action_tensor(intervention)))
    assert sir.expected_reward(intervention) <= sir.optimum.value + 1e-9


def test_sir_initial_design_within_budget(sir) -> None:
    for intervention in sir.initial_design(0):
        assert sir.cost(intervention) <= sir.budget + 1e-12


# --------------------------------------------------------------------- weather
def test_apparent_temperature_hand_computed() -> None:
    # e = RH/100 · 6.105 · exp(17.27 T / (237.7 + T)); AT = T + 0.33 e - 0.70 ws - 4.
    # T=0, RH=100, ws=0: e = 6.105 exactly, AT = 0.33 · 6.105 - 4 = -1.98535.
    # T=30, RH=50, ws=2: exp(518.1/267.7) = 6.9266, e = 21.1436, AT = 31.5774.
    # T=20, RH=80, ws=5: exp(345.4/257.7) = 3.8203, e = 18.6581, AT = 18.6572.
    points = torch.tensor([[0.0, 100.0, 0.0], [30.0, 50.0, 2.0], [20.0, 80.0, 5.0]], dtype=DTYPE)
    expected = torch.tensor([-1.98535, 31.5774, 18.6572], dtype=DTYPE)
    torch.testing.assert_close(apparent_temperature(points), expected, rtol=0, atol=2e-4)


def test_weather_sensors_and_field_are_plausible(weather) -> None:
    lat, lon = weather.locations.unbind(-1)
    assert weather.candidates.shape == (800, 2)
    assert ((lat >= 25) & (lat <= 49) & (lon >= -125) & (lon <= -67)).all()
    assert inside(lon.numpy(), lat.numpy()).all()
    t, rh, ws = weather.field.unbind(-1)
    assert float(t.min()) > 10 and float(t.max()) < 50
    assert float(rh.min()) >= 5 and float(rh.max()) <= 98
    assert float(ws.min()) > 0 and float(ws.max()) < 15
    assert float(t[lat > 44].mean()) < float(t[lat < 33].mean())  # cooler to the north
    assert float(rh[lon > -90].mean()) > float(rh[lon < -105].mean())  # humid east, dry west


def test_weather_optimum_is_best_sensor(weather) -> None:
    best = int(weather.apparent.argmax())
    assert weather.optimum.value == pytest.approx(float(weather.apparent[best]))
    lat, lon = weather.locations[best].tolist()
    assert weather.optimum.intervention == {"lat": lat, "lon": lon}
    assert weather.expected_reward({"lat": lat, "lon": lon}) == pytest.approx(weather.optimum.value)


def test_weather_rejects_points_that_are_not_sensors(weather) -> None:
    lat, lon = weather.locations[0].tolist()
    weather.validate({"lat": lat, "lon": lon})
    with pytest.raises(ValueError, match="candidates"):
        weather.validate({"lat": lat + 0.01, "lon": lon})
    with pytest.raises(ValueError, match="outside"):
        weather.validate({"lat": 10.0, "lon": lon})


def test_weather_is_seeded(weather) -> None:
    again = WeatherField(seed=0, n_sensors=800)
    other = WeatherField(seed=1, n_sensors=800)
    assert torch.equal(again.field, weather.field)
    assert torch.equal(again.locations, weather.locations)
    assert not torch.allclose(other.locations, weather.locations)


def test_weather_derivative_bounds_bound_the_gradient(weather) -> None:
    bounds = torch.tensor(weather.reward_derivative_bounds(), dtype=DTYPE)
    assert bounds[2] == pytest.approx(0.7)
    lows = torch.tensor([weather.nodes[j].bounds[0] for j in range(3)], dtype=DTYPE)
    highs = torch.tensor([weather.nodes[j].bounds[1] for j in range(3)], dtype=DTYPE)
    generator = torch.Generator().manual_seed(0)
    points = lows + (highs - lows) * torch.rand(5000, 3, generator=generator, dtype=DTYPE)
    points = torch.cat([points, weather.field]).requires_grad_(True)
    (grad,) = torch.autograd.grad(weather.compose_reward(points).sum(), points)
    assert (grad.abs() <= bounds + 1e-12).all()
    # Tight: attained at the hot, humid corner of the box.
    corner = highs.clone().requires_grad_(True)
    (grad_corner,) = torch.autograd.grad(weather.compose_reward(corner), corner)
    torch.testing.assert_close(grad_corner[:2].abs(), bounds[:2])


def test_weather_reward_is_nonlinear(weather) -> None:
    assert weather.reward_kind == "general"
    assert not hasattr(weather, "reward_weights")
    a, b = weather.field[0], weather.field[1]
    mixed = weather.compose_reward((a + b) / 2)
    assert float((mixed - (weather.compose_reward(a) + weather.compose_reward(b)) / 2).abs()) > 0
