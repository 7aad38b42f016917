"""A coarse outline of the contiguous United States, for placing synthetic weather sensors.

Hand-drawn from well-known coastal and border landmarks (capes, city harbours, the Rio Grande,
the 49th parallel, the Great Lakes shore), ~100 vertices, accurate to ~50-100 km — enough to put
sensors on land and to measure distance to the Pacific and to the Atlantic/Gulf coasts. Points
are (lon, lat) in degrees, in order around the outline, split into the stretches that matter for
the weather field.
"""

from __future__ import annotations

import numpy as np

KM_PER_DEG = 111.2

# From the Strait of Juan de Fuca eastwards along the 49th parallel and the Great Lakes.
NORTH_BORDER = (
    (-122.8, 49.0), (-95.2, 49.0), (-95.2, 49.4), (-94.6, 48.7), (-93.0, 48.6), (-91.0, 48.2),
    (-89.6, 48.0), (-88.0, 47.3), (-84.6, 46.5), (-84.1, 46.2), (-83.6, 45.8), (-83.4, 45.0),
    (-82.4, 43.0), (-83.1, 42.3), (-83.4, 41.7), (-81.7, 41.5), (-80.1, 42.1), (-78.9, 42.9),
    (-79.0, 43.3), (-76.5, 43.5), (-76.3, 44.2), (-74.7, 45.0), (-71.5, 45.0), (-71.1, 45.3),
    (-70.3, 45.9), (-70.0, 46.7), (-69.2, 47.4), (-68.2, 47.4), (-67.8, 47.1), (-67.8, 45.7),
)  # fmt: skip
# From Eastport, Maine, down the Atlantic, round Florida and along the Gulf to Brownsville.
ATLANTIC_GULF_COAST = (
    (-67.0, 44.8), (-68.8, 44.4), (-70.2, 43.6), (-70.8, 42.6), (-70.0, 41.8), (-71.4, 41.4),
    (-72.9, 41.2), (-74.0, 40.5), (-74.1, 39.7), (-74.9, 38.9), (-75.1, 38.4), (-75.7, 37.3),
    (-76.0, 36.9), (-75.5, 35.3), (-76.5, 34.7), (-77.9, 33.9), (-79.2, 33.2), (-80.9, 32.0),
    (-81.4, 30.4), (-80.6, 28.4), (-80.0, 26.7), (-80.4, 25.2), (-81.1, 25.1), (-81.8, 26.1),
    (-82.7, 27.5), (-82.8, 28.2), (-83.7, 29.9), (-84.3, 30.0), (-85.4, 29.7), (-86.5, 30.4),
    (-88.0, 30.4), (-89.4, 30.2), (-89.2, 29.2), (-90.5, 29.1), (-91.8, 29.5), (-93.8, 29.7),
    (-94.8, 29.3), (-96.4, 28.4), (-97.3, 27.6), (-97.2, 26.0),
)  # fmt: skip
# Up the Rio Grande and along the Mexican border to the Pacific.
SOUTH_BORDER = (
    (-99.1, 26.5), (-99.5, 27.5), (-100.3, 28.3), (-101.4, 29.8), (-102.4, 29.8), (-103.1, 29.0),
    (-104.5, 29.6), (-106.5, 31.8), (-108.2, 31.8), (-108.2, 31.3), (-111.1, 31.3), (-114.8, 32.5),
    (-114.7, 32.7),
)  # fmt: skip
# From San Diego up the Pacific coast to the Strait of Juan de Fuca.
PACIFIC_COAST = (
    (-117.1, 32.5), (-117.3, 33.2), (-118.4, 33.8), (-119.2, 34.1), (-120.6, 34.6), (-121.0, 35.5),
    (-121.9, 36.6), (-122.5, 37.8), (-123.0, 38.3), (-123.7, 39.0), (-123.8, 39.8), (-124.4, 40.4),
    (-124.1, 41.5), (-124.5, 42.8), (-124.0, 44.6), (-124.0, 46.2), (-124.1, 47.2), (-124.7, 48.4),
    (-123.2, 48.2),
)  # fmt: skip
OUTLINE = np.array(NORTH_BORDER + ATLANTIC_GULF_COAST + SOUTH_BORDER + PACIFIC_COAST)

# Large metropolitan areas (lat, lon, approximate 2010 population in millions): weather
# stations, like people, cluster around them.
CITIES = (
    (40.7, -74.0, 19.6), (34.05, -118.25, 12.8), (41.9, -87.6, 9.5), (32.8, -96.8, 6.4),
    (29.8, -95.4, 5.9), (38.9, -77.0, 5.6), (40.0, -75.2, 6.0), (25.8, -80.2, 5.6),
    (33.75, -84.4, 5.3), (42.36, -71.06, 4.6), (37.77, -122.4, 4.3), (33.45, -112.1, 4.2),
    (47.6, -122.3, 3.4), (44.98, -93.27, 3.3), (32.7, -117.16, 3.1), (38.63, -90.2, 2.8),
    (27.95, -82.46, 2.8), (39.74, -104.99, 2.5), (35.2, -80.8, 1.8), (45.5, -122.7, 2.2),
    (29.4, -98.5, 2.1), (36.17, -115.14, 2.0), (39.1, -94.6, 2.0), (39.96, -83.0, 1.8),
    (36.16, -86.78, 1.6), (39.77, -86.16, 1.8), (30.27, -97.74, 1.7), (40.76, -111.9, 1.1),
    (35.47, -97.5, 1.3), (29.95, -90.07, 1.2), (35.08, -106.65, 0.9), (43.6, -116.2, 0.6),
    (32.2, -110.9, 1.0), (36.75, -119.77, 0.9), (38.58, -121.49, 2.1), (42.33, -83.05, 4.3),
    (41.5, -81.7, 2.1), (40.44, -80.0, 2.4), (43.05, -87.95, 1.6), (35.15, -90.05, 1.3),
)  # fmt: skip


def inside(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Whether each point lies inside `OUTLINE` (even-odd ray casting), vectorised."""
    x0, y0 = OUTLINE[:, 0], OUTLINE[:, 1]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    px, py = lon[:, None], lat[:, None]
    crosses = (y0 > py) != (y1 > py)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = x0 + (py - y0) * (x1 - x0) / (y1 - y0)
    return ((crosses & (px < x_cross)).sum(-1) % 2) == 1


def coast_distance_km(lon: np.ndarray, lat: np.ndarray, coast: tuple) -> np.ndarray:
    """Distance (km) from each point to a polyline, in a local equirectangular projection."""
    line = np.array(coast)
    scale = np.cos(np.deg2rad(lat))[:, None]
    ax, ay = line[:-1, 0], line[:-1, 1]
    bx, by = line[1:, 0], line[1:, 1]
    px, py = lon[:, None], lat[:, None]
    dx, dy = (bx - ax) * scale, by - ay
    wx, wy = (px - ax) * scale, py - ay
    t = np.clip((wx * dx + wy * dy) / np.maximum(dx * dx + dy * dy, 1e-12), 0.0, 1.0)
    dist = np.hypot(wx - t * dx, wy - t * dy)
    return KM_PER_DEG * dist.min(-1)
