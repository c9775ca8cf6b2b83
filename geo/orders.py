"""What the router keeps per (model, residency) scope: the replicas serving it by tier, and the routable ones
in bound order (geo/route.py builds and reads them); and the replicas' places as arrays."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from geo.decision import Replica


@dataclass(slots=True)
class Order:
    """The routable replicas serving a (model, residency) scope, in the catalog's order, with the part of
    their bound that is the same for every client (the round trip) as an array."""

    epoch: int
    valid_until: float  # the next ejection's end: the set changes then
    replicas: list[Replica]
    rtt_ms: np.ndarray  # float64, each one's round trip (measured, floored; or the inflated floor)
    index: np.ndarray  # each one's place in Router.replicas (to gather client terms)
    position: dict[str, int]  # replica id -> its place in ``replicas``
    by_region: dict[str, list[int]]  # region -> its replicas' places
    # The two arrays as lists, for the scan of a few replicas (geo/scan_bounds.py).
    rtt_list: list[float] = field(init=False)
    index_list: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.rtt_list = self.rtt_ms.tolist()
        self.index_list = self.index.tolist()


@dataclass(frozen=True, slots=True)
class Scope:
    """The replicas serving a model within a residency scope, in the catalog's order, and their two tiers."""

    every: list[Replica]
    remote: list[Replica]  # across the ocean (every one, when no region is local)
    local: list[Replica]  # on this side of it: the degraded tier


@dataclass(frozen=True, slots=True)
class PlaceArrays:
    """The replicas' places as arrays (radians), for the client terms of a new client place at once."""

    lat: np.ndarray
    lon: np.ndarray
    known: np.ndarray
    edge_one_way_ms: np.ndarray

    @classmethod
    def of(cls, replicas: list[Replica]) -> PlaceArrays:
        return cls(
            np.radians([r.place.latitude for r in replicas]),
            np.radians([r.place.longitude for r in replicas]),
            np.array([r.place.known for r in replicas]),
            np.array([r.edge_one_way_ms for r in replicas]),
        )
