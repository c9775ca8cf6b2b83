"""The client term of the router's score (geo/route.py): per replica, how much farther a client located
elsewhere (behind a trusted proxy) is from it than the edge is, as floors x inflation, both ways; computed
for every replica at once and kept per client place."""

from __future__ import annotations

import math

import numpy as np

from geo.decision import Replica, Where
from geo.orders import PlaceArrays
from geo.places import EARTH_RADIUS_KM, FIBRE_KM_PER_MS

_MAX_CACHED = 4096  # client places whose terms are kept
# Client places within a quarter degree (~28 km: under 0.5 ms of fibre round trip) share their terms:
# GeoIP places are cities, and a city's addresses are one place anyway.
_PLACE_GRID = 4.0


class ClientTerms:
    def __init__(self, replicas: list[Replica], path_inflation: float) -> None:
        self.replicas = replicas
        self.path_inflation = path_inflation
        self._terms: dict[tuple[int, int, bool], np.ndarray] = {}
        self._places: PlaceArrays | None = None

    def of(self, where: Where) -> np.ndarray:
        """Each replica's client term in ms (by its place in the catalogue) for a client at ``where``."""
        key = (round(where.latitude * _PLACE_GRID), round(where.longitude * _PLACE_GRID), where.located)
        terms = self._terms.get(key)
        if terms is not None:
            return terms
        if self._places is None:
            self._places = PlaceArrays.of(self.replicas)
        p = self._places
        lat1 = math.radians(where.latitude)
        h = (
            np.sin((p.lat - lat1) / 2) ** 2
            + math.cos(lat1) * np.cos(p.lat) * np.sin((p.lon - math.radians(where.longitude)) / 2) ** 2
        )
        from_client_km = 2 * EARTH_RADIUS_KM * np.arcsin(np.minimum(1.0, np.sqrt(h)))
        double_inflation = 2 * self.path_inflation
        terms = np.where(
            p.known, double_inflation * (from_client_km / FIBRE_KM_PER_MS - p.edge_one_way_ms), 0.0
        )
        if len(self._terms) >= _MAX_CACHED:
            self._terms.clear()
        self._terms[key] = terms
        return terms
