"""Where places are and how far apart: the city table and the speed-of-light floor between two points.

Light in optical fibre travels at about 200,000 km/s (refractive index ~1.5), so every 100 km of path
costs at least 0.5 ms one way, 1 ms round trip. Real cable routes are longer than the great circle and
routing adds more, so a real RTT sits well above this floor: the router multiplies it by a path-inflation
factor until it has measured the path, and netem's link profiles may never go below it.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Annotated

import msgspec

from nearshore.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CITIES_FILE = CONFIGS / "cities.toml"

FIBRE_KM_PER_MS = 200.0  # 200,000 km/s
EARTH_RADIUS_KM = 6371.0088  # mean radius (IUGG)

Latitude = Annotated[float, msgspec.Meta(ge=-90, le=90)]
Longitude = Annotated[float, msgspec.Meta(ge=-180, le=180)]


class City(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    lat: Latitude
    lon: Longitude
    country: str = ""  # ISO 3166-1 alpha-2
    continent: str = ""  # two-letter continent code, as GeoIP databases give it (AF, EU, NA, ...)


@functools.cache
def cities(path: Path = CITIES_FILE) -> dict[str, City]:
    """The city table (``configs/cities.toml``), read once."""
    return load_config(path, dict[str, City])


def city(name: str) -> City:
    table = cities()
    if name not in table:
        raise KeyError(f"unknown city {name!r} (known: {', '.join(sorted(table))})")
    return table[name]


def great_circle_km(lat_a: float, lon_a: float, lat_b: float, lon_b: float) -> float:
    """Haversine distance on a sphere of the Earth's mean radius (within ~0.5% of the ellipsoid)."""
    lat1, lat2 = math.radians(lat_a), math.radians(lat_b)
    dlat, dlon = lat2 - lat1, math.radians(lon_b - lon_a)
    h = math.sin(dlat / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin(dlon / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def distance_km(city_a: str, city_b: str) -> float:
    a, b = city(city_a), city(city_b)
    return great_circle_km(a.lat, a.lon, b.lat, b.lon)


def floor_one_way_ms(km: float) -> float:
    return km / FIBRE_KM_PER_MS


def floor_rtt_ms(city_a: str, city_b: str) -> float:
    """The speed-of-light floor for the great-circle distance between two cities, as a round trip in ms."""
    return 2 * floor_one_way_ms(distance_km(city_a, city_b))
