"""The speed-of-light floor: no link can be faster than light in fibre over the great-circle distance.

Light in optical fibre travels at about 200,000 km/s (refractive index ~1.5), so every 100 km of path
costs at least 0.5 ms one way, 1 ms round trip. Real cable routes are longer than the great circle and
routing adds more, so a real RTT sits well above this floor; a profile below it is a typo.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Annotated

import msgspec

from nearshore.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CITIES_FILE = CONFIGS / "netem" / "cities.toml"

FIBRE_KM_PER_MS = 200.0  # 200,000 km/s
EARTH_RADIUS_KM = 6371.0088  # mean radius (IUGG)


class City(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    lat: Annotated[float, msgspec.Meta(ge=-90, le=90)]
    lon: Annotated[float, msgspec.Meta(ge=-180, le=180)]


@functools.cache
def cities(path: Path = CITIES_FILE) -> dict[str, City]:
    """The city table (``configs/netem/cities.toml``), read once."""
    return load_config(path, dict[str, City])


def city(name: str) -> City:
    table = cities()
    if name not in table:
        raise KeyError(f"unknown city {name!r} (known: {', '.join(sorted(table))})")
    return table[name]


def great_circle_km(a: City, b: City) -> float:
    """Haversine distance on a sphere of the Earth's mean radius (within ~0.5% of the ellipsoid)."""
    lat1, lat2 = math.radians(a.lat), math.radians(b.lat)
    dlat, dlon = lat2 - lat1, math.radians(b.lon - a.lon)
    h = math.sin(dlat / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin(dlon / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def distance_km(city_a: str, city_b: str) -> float:
    return great_circle_km(city(city_a), city(city_b))


def floor_one_way_ms(km: float) -> float:
    return km / FIBRE_KM_PER_MS


def floor_rtt_ms(city_a: str, city_b: str) -> float:
    """The speed-of-light floor for the great-circle distance, as a round trip in ms."""
    return 2 * floor_one_way_ms(distance_km(city_a, city_b))
