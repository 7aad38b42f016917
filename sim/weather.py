"""Paper 003's perceived-temperature task: find the sensor with the highest apparent temperature.

Paper 003 (§Experiments, Perceived Temperature) used "weather data collected from 2906 sensors
in United States provided by OpenWeatherMap": at a location x it reads the actual temperature
f_1(x), humidity f_2(x) and wind speed f_3(x), and the target is the perceived temperature
g(f_1, f_2, f_3), a nonlinear composition; the goal is the location with the highest perceived
temperature. The data and the formula of g are not given, and we have no data, so this module
synthesises a plausible summer-afternoon field (mid-July, ~15:00 local) and uses for g the
apparent temperature of the Australian Bureau of Meteorology (Steadman 1994, Aust. Met. Mag.
43:1-16, the version without radiation; BoM, "Thermal Comfort observations",
http://www.bom.gov.au/info/thermal_stress/):

    AT = T + 0.33 e - 0.70 ws - 4.00,   e = (RH / 100) · 6.105 · exp(17.27 T / (237.7 + T))

with T the dry-bulb temperature (°C), RH the relative humidity (%), ws the wind speed at 10 m
(m/s) and e the water-vapour pressure (hPa). Heat and humidity raise AT, wind lowers it, as the
paper describes.

Nodes: "temperature" (°C), "humidity" (RH, %), "wind_speed" (m/s) — components with no parent
nodes, fed by the actions — and the reward "apparent_temperature" = AT(noisy components).
Actions: "lat", "lon" (degrees); `candidates` = the (N, 2) sensor coordinates, so an
intervention is the choice of one sensor.

Sensors: N (default 2906, as in the paper) at seeded random places inside a coarse outline of the
contiguous US (`sim._conus`): 55% scattered around 40 large metro areas (weight ∝ population,
Gaussian spread 0.7°), 45% uniform over the land, like a station network that thins out away
from cities. The field (d_P, d_A: distance to the Pacific / Atlantic-Gulf coast in km; a
"bump" is a Gaussian in (lat, lon)):

  temperature   34.5 - 0.5 softplus_1.5°(lat - 33)             -0.5 °C/degree north of ~33 N
                + 6.0 bump(33.5 N, 113.5 W; 2.5°, 3.0°)         desert Southwest (Phoenix ~40 °C)
                - 9.0 exp(-d_P / 80)                            Pacific marine layer (SF ~23 °C)
                - 4.0 Rockies ridge (107.5 W ± 3°, 36-46 N)     elevation (Denver ~29 °C)
                - 2.5 exp(-d_A / 80)                            sea breeze (Miami ~32 °C)
                + anomaly: GP, SE lengthscale 2.5°, std 1.5 °C
  humidity      30 + 28 sigmoid((lon + 100) / 3)               dry West, humid East
                + 20 exp(-d_P / 100) + 12 exp(-d_A / 150)       coasts
                - 15 bump(34.5 N, 114 W; 3°, 4°)                 desert
                - 2.0 · (temperature anomaly) + GP, lengthscale 3°, std 5 %
                clipped to [5, 98] %
  wind_speed    softplus(2.5 + 2.5 plains(99 W ± 5°, 30-48 N) + 1.5 exp(-d_P / 100)
                         + 1.0 exp(-d_A / 60) - 1.0 calm Southeast + GP(lengthscale 2°, std 0.8))

The GP anomalies are random-Fourier-feature draws (300 features, seeded), with longitude scaled
by cos 37° so that lengthscales are roughly isotropic on the ground. Ranges over seeds 0-9:
T 18-43 °C, RH 10-84 %, ws 0.6-7 m/s, AT 15-44 °C. The best sensor sits on the humid Gulf or
Florida coast for most seeds and in the Sonoran desert for some (seed 6): a multimodal target.

Observation noise (std, per reading): temperature 0.2 °C, humidity 3 %, wind speed 0.5 m/s —
of the order of the achievable measurement uncertainties in WMO-No. 8 (Guide to Instruments and
Methods of Observation, Annex 1.A). Readings are Gaussian and not clipped (a humidity reading
may exceed 100 % by noise).

Initial design: 2·(A+1) = 6 distinct sensors at random (not in paper; the paper used a random
1/3 of the sensors to learn the kernels, a benchmark protocol outside this simulator).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sim import _conus
from sim._decomposed import DTYPE, DecomposedEnvironment, padded_range
from sim.base import ActionInfo, NodeInfo, Optimum

LAT_RANGE = (25.0, 49.0)
LON_RANGE = (-125.0, -67.0)
DEFAULT_SENSORS = 2906
CITY_FRACTION = 0.55
CITY_SPREAD_DEG = 0.7
NOISE_STD = {"temperature": 0.2, "humidity": 3.0, "wind_speed": 0.5}
COMPONENTS = ("temperature", "humidity", "wind_speed")


def apparent_temperature(components: torch.Tensor) -> torch.Tensor:
    """Steadman/BoM apparent temperature (°C): (..., 3) [T °C, RH %, ws m/s] -> (...)."""
    t, rh, ws = components.unbind(-1)
    vapour_pressure = rh / 100.0 * 6.105 * torch.exp(17.27 * t / (237.7 + t))
    return t + 0.33 * vapour_pressure - 0.70 * ws - 4.00


class WeatherField(DecomposedEnvironment):
    """N weather sensors over the contiguous US; pick the one with the highest apparent temp.

    Args:
        seed: draws the sensor locations and the field's anomalies.
        n_sensors: N (paper: 2906).
        n_initial: size of `initial_design` (default 2·(A+1) = 6).

    Attributes:
        locations: (N, 2) float64 (lat, lon) of the sensors (= `candidates`).
        field: (N, 3) float64 noiseless (temperature, humidity, wind_speed) at the sensors.
        apparent: (N,) float64 noiseless apparent temperature at the sensors.
    """

    reward_kind = "general"

    def __init__(self, seed: int = 0, n_sensors: int = DEFAULT_SENSORS, n_initial: int = 6) -> None:
        rng = np.random.default_rng(seed)
        self.seed = seed
        self.n_initial = n_initial
        lat, lon = _sensor_locations(n_sensors, rng)
        self.locations = torch.from_numpy(np.stack([lat, lon], -1))
        self.field = torch.from_numpy(_weather_field(lat, lon, rng))
        self.apparent = apparent_temperature(self.field)
        self._noise_std = torch.tensor([NOISE_STD[c] for c in COMPONENTS], dtype=DTYPE)

        nodes = [
            NodeInfo(name, (), NOISE_STD[name], padded_range(self.field[:, j], NOISE_STD[name]))
            for j, name in enumerate(COMPONENTS)
        ]
        # AT readings inherit ≈0.7 °C of noise from the components (|∂AT/∂T|·0.2 ⊕ |∂AT/∂RH|·3
        # ⊕ 0.7·0.5 at a hot, humid sensor); pad the range as if it were 1 °C.
        nodes.append(
            NodeInfo("apparent_temperature", COMPONENTS, 0.0, padded_range(self.apparent, 1.0))
        )
        super().__init__(
            name="weather",
            intervention_type="soft",
            nodes=tuple(nodes),
            actions=(
                ActionInfo("lat", COMPONENTS, LAT_RANGE, cost=0.0),
                ActionInfo("lon", COMPONENTS, LON_RANGE, cost=0.0),
            ),
            reward_node="apparent_temperature",
            description=(
                f"paper 003 perceived temperature: {n_sensors} synthetic summer-afternoon sensors "
                f"over the contiguous US (seed {seed}); reward = Steadman apparent temperature"
            ),
            reward_components=COMPONENTS,
            candidates=self.locations.clone(),
        )

    # ----------------------------------------------------------------- decomposition
    def expected_components(self, x: torch.Tensor) -> torch.Tensor:
        """(..., 2) sensor (lat, lon) -> (..., 3) noiseless readings; raises off the sensors."""
        return self.field[self.candidate_index(torch.as_tensor(x, dtype=DTYPE))]

    def compose_reward(self, components: torch.Tensor) -> torch.Tensor:
        """g = apparent temperature (°C) of (..., 3) [T, RH, ws] -> (...); differentiable."""
        return apparent_temperature(components)

    # ----------------------------------------------------------------- oracle
    def _compute_optimum(self) -> Optimum:
        return self._discrete_optimum(self.field)

    def initial_design(self, seed: int) -> list[dict[str, float]]:
        """`n_initial` (default 6) distinct sensors, uniformly at random."""
        return self._candidate_design(seed)


# --------------------------------------------------------------------- the synthetic field
def _sensor_locations(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(lat, lon) of n sensors on land: a city-clustered share and a uniform share."""
    cities = np.array(_conus.CITIES)
    weights = cities[:, 2] / cities[:, 2].sum()
    n_city = round(CITY_FRACTION * n)
    lats: list[np.ndarray] = []
    lons: list[np.ndarray] = []
    for count, clustered in ((n_city, True), (n - n_city, False)):
        got = 0
        while got < count:
            m = 2 * (count - got) + 16
            if clustered:
                pick = rng.choice(len(cities), size=m, p=weights)
                lat = cities[pick, 0] + CITY_SPREAD_DEG * rng.standard_normal(m)
                lon = cities[pick, 1] + CITY_SPREAD_DEG * rng.standard_normal(m)
            else:
                lat = rng.uniform(*LAT_RANGE, m)
                lon = rng.uniform(*LON_RANGE, m)
            keep = _conus.inside(lon, lat) & (lat >= LAT_RANGE[0]) & (lat <= LAT_RANGE[1])
            keep &= (lon >= LON_RANGE[0]) & (lon <= LON_RANGE[1])
            take = np.flatnonzero(keep)[: count - got]
            lats.append(lat[take])
            lons.append(lon[take])
            got += len(take)
    return np.concatenate(lats), np.concatenate(lons)


def _random_fourier_field(
    lat: np.ndarray, lon: np.ndarray, lengthscale: float, std: float, rng: np.random.Generator
) -> np.ndarray:
    """An approximate GP draw (SE kernel, `lengthscale` degrees, marginal `std`) at the points."""
    features = 300
    coords = np.stack([lat, lon * math.cos(math.radians(37.0))], -1)
    omega = rng.standard_normal((2, features)) / lengthscale
    phase = rng.uniform(0.0, 2.0 * math.pi, features)
    weights = rng.standard_normal(features)
    return std * math.sqrt(2.0 / features) * np.cos(coords @ omega + phase) @ weights


def _bump(lat: np.ndarray, lon: np.ndarray, lat0, lon0, s_lat, s_lon) -> np.ndarray:
    return np.exp(-0.5 * (((lat - lat0) / s_lat) ** 2 + ((lon - lon0) / s_lon) ** 2))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _weather_field(lat: np.ndarray, lon: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(N, 3) noiseless [temperature °C, humidity %, wind m/s]; see the module docstring."""
    d_pacific = _conus.coast_distance_km(lon, lat, _conus.PACIFIC_COAST)
    d_atlantic = _conus.coast_distance_km(lon, lat, _conus.ATLANTIC_GULF_COAST)
    mid_latitudes = np.exp(-0.5 * ((lat - 41.0) / 5.0) ** 2)

    t_anomaly = _random_fourier_field(lat, lon, 2.5, 1.5, rng)
    temperature = (
        34.5
        - 0.5 * 1.5 * np.logaddexp(0.0, (lat - 33.0) / 1.5)  # flat south of ~33 N
        + 6.0 * _bump(lat, lon, 33.5, -113.5, 2.5, 3.0)
        - 9.0 * np.exp(-d_pacific / 80.0)
        - 4.0 * np.exp(-(((lon + 107.5) / 3.0) ** 2)) * mid_latitudes
        - 2.5 * np.exp(-d_atlantic / 80.0)
        + t_anomaly
    )
    humidity = (
        30.0
        + 28.0 * _sigmoid((lon + 100.0) / 3.0)
        + 20.0 * np.exp(-d_pacific / 100.0)
        + 12.0 * np.exp(-d_atlantic / 150.0)
        - 15.0 * _bump(lat, lon, 34.5, -114.0, 3.0, 4.0)
        - 2.0 * t_anomaly
        + _random_fourier_field(lat, lon, 3.0, 5.0, rng)
    )
    humidity = np.clip(humidity, 5.0, 98.0)
    plains = np.exp(-(((lon + 99.0) / 5.0) ** 2)) * _sigmoid((lat - 30.0) / 1.5)
    plains *= _sigmoid((48.0 - lat) / 1.5)
    calm_southeast = np.exp(-0.5 * ((lat - 33.0) / 4.0) ** 2) * _sigmoid((lon + 95.0) / 3.0)
    wind_drive = (
        2.5
        + 2.5 * plains
        + 1.5 * np.exp(-d_pacific / 100.0)
        + 1.0 * np.exp(-d_atlantic / 60.0)
        - 1.0 * calm_southeast
        + _random_fourier_field(lat, lon, 2.0, 0.8, rng)
    )
    wind = np.logaddexp(0.0, wind_drive)  # softplus: positive, ≈ identity above ~2 m/s
    return np.stack([temperature, humidity, wind], -1)
