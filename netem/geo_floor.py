"""The speed-of-light floor every link profile must respect: geo's, the same one the edge's router uses."""

from __future__ import annotations

from geo.places import CONFIGS, City, cities, city, distance_km, floor_one_way_ms, floor_rtt_ms

__all__ = ["CONFIGS", "City", "cities", "city", "distance_km", "floor_one_way_ms", "floor_rtt_ms"]
