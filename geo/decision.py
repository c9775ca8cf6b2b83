"""What the router decides on and what it returns: a replica as the router sees it, where the client is,
a decision's ranked replicas with each one's score terms, and the refusal when none may serve."""

from __future__ import annotations

from dataclasses import dataclass

from geo.catalog import Place, RegionSpec
from geo.health import Health
from geo.latency import Latency
from nearshore.protocol.load import LoadReport


@dataclass(eq=False, slots=True)
class Replica:
    id: str  # the region's name, or "<region>/<n>" when it has several replicas
    region: str
    url: str
    spec: RegionSpec
    place: Place
    health: Health
    latency: Latency
    models: frozenset[str]
    load: LoadReport | None = None
    inflight: int = 0
    index: int = 0  # its place in Router.replicas
    edge_one_way_ms: float = 0.0  # the fibre floor from the edge, one way (0: the place is not known)

    @property
    def capacity(self) -> int:
        reported = self.load.capacity if self.load is not None else 0
        return min(reported, self.spec.capacity) if reported else self.spec.capacity

    @property
    def busy(self) -> int:
        reported = self.load.running + self.load.waiting if self.load is not None else 0
        return max(reported, self.inflight)

    @property
    def loading(self) -> bool:
        return self.load is not None and not self.load.routable

    @property
    def local(self) -> bool:
        """On this side of the ocean: the degraded tier (RegionSpec.local)."""
        return self.spec.local


@dataclass(frozen=True, slots=True)
class Where:
    """Where the client is, as the router needs it."""

    latitude: float
    longitude: float
    country: str = ""
    continent: str = ""
    located: bool = False  # False: the edge's own place stands in (private, loopback, unknown address)


@dataclass(frozen=True, slots=True)
class Terms:
    rtt_ms: float
    client_ms: float
    queue_ms: float
    load_ms: float
    prefill_ms: float
    affinity_ms: float

    @property
    def total_ms(self) -> float:
        rtt = max(0.0, self.rtt_ms + self.client_ms)
        return rtt + self.queue_ms + self.load_ms + self.prefill_ms - self.affinity_ms


_Row = tuple[float, float, float, float, float, float]  # Terms' fields, in order
# One eligible replica in a decision: (sort key, score, replica, terms).
Scored = tuple[int, float, Replica, _Row]


@dataclass(frozen=True, slots=True)
class Route:
    ranked: list[Replica]  # failover order, the chosen one first
    rows: list[_Row]  # the scored ones' terms, in the same order (the tail of ``ranked`` was not scored)
    policies: tuple[str, ...] = ()  # residency policies that applied
    affinity: bool = False  # a shared prefix decided
    held: bool = False  # hysteresis kept the current region over a better-scoring one
    explored: bool = False  # the first was measured again: its observations were stale (geo/route.py)
    # Every remote replica of the model is down or ejected: the ranked ones are local (the degraded tier).
    cut: bool = False

    @property
    def terms(self) -> list[Terms]:
        # Made when asked (an explanation, a test): a request routed without one never builds them.
        return [Terms(*row) for row in self.rows]

    def explain(self) -> str:
        """``x-nearshore-route``: the choice, its terms and the runner-up."""

        def one(r: Replica, t: Terms) -> str:
            return (
                f"{r.id} score={t.total_ms:.1f}ms rtt={t.rtt_ms:.1f} client={t.client_ms:.1f} "
                f"queue={t.queue_ms:.1f} load={t.load_ms:.1f} prefill={t.prefill_ms:.1f} "
                f"affinity=-{t.affinity_ms:.1f}"
            )

        parts = [one(self.ranked[0], Terms(*self.rows[0]))]
        if len(self.rows) > 1:
            parts.append("runner-up " + one(self.ranked[1], Terms(*self.rows[1])))
        elif len(self.ranked) > 1:  # not scored: it could not win (a loading or full one, behind)
            parts.append(f"runner-up {self.ranked[1].id} (not scored)")
        flags = [f"policy={'+'.join(self.policies)}"] if self.policies else []
        flags += ["affinity"] * self.affinity + ["held"] * self.held + ["explored"] * self.explored
        flags += ["cut"] * self.cut
        return "; ".join(parts + flags)


class NoRoute(Exception):
    """No replica may serve the request now; the message says why (and names the residency policy).
    ``cut``: the model's remote replicas are all down or ejected while the edge has local regions (none of
    them serving it now), so that the edge's degraded tier decides what answers instead."""

    def __init__(self, message: str, policies: tuple[str, ...] = (), cut: bool = False) -> None:
        super().__init__(message)
        self.policies = policies
        self.cut = cut
