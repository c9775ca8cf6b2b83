"""The routing decision: which replicas may serve a request, in which order (DESIGN.md step 3).

Filter: serves the model, allowed by residency, probed up and not ejected, not loading (while another can
serve), not over its in-flight capacity (while another is not). Score, in milliseconds of expected time to
first token:

    rtt      the edge's measured round trip to the replica (until measured: the fibre floor x inflation)
    client   how much farther the client is from the replica than the edge is (a client located elsewhere,
             behind a trusted proxy), as floors x inflation
    queue    requests beyond the replica's capacity, times its recent service time, per slot
    load     a small penalty for a busy batch (utilisation x load_penalty_ms): equal replicas share work
    prefill  the prompt's tokens at the pool's prefill speed
    affinity minus the prefill of the prompt's prefix that the replica already holds (while balanced)

The best region keeps a client group's traffic until another beats it by a margin for ``hold_s`` (no
flapping); within a region the least-loaded replica goes first. The ranked list is the failover order.
Everything here is pure and in memory: probes and responses update it off the request path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from geo.affinity import AffinityTable
from geo.catalog import GeoConfig, Place, RegionSpec, edge_place, region_place
from geo.health import Health
from geo.latency import Latency
from geo.places import floor_one_way_ms, great_circle_km
from geo.residency import Residency
from nearshore.protocol.load import LoadReport

LOAD_PENALTY_MS = 20.0
_MAX_GROUPS = 4096


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


@dataclass(frozen=True, slots=True)
class Route:
    ranked: list[Replica]  # failover order, the chosen one first
    terms: list[Terms]  # the same order
    policies: tuple[str, ...] = ()  # residency policies that applied
    affinity: bool = False  # a shared prefix decided
    held: bool = False  # hysteresis kept the current region over a better-scoring one

    def explain(self) -> str:
        """``x-nearshore-route``: the choice, its terms and the runner-up."""

        def one(r: Replica, t: Terms) -> str:
            return (
                f"{r.id} score={t.total_ms:.1f}ms rtt={t.rtt_ms:.1f} client={t.client_ms:.1f} "
                f"queue={t.queue_ms:.1f} load={t.load_ms:.1f} prefill={t.prefill_ms:.1f} "
                f"affinity=-{t.affinity_ms:.1f}"
            )

        parts = [one(self.ranked[0], self.terms[0])]
        if len(self.ranked) > 1:
            parts.append("runner-up " + one(self.ranked[1], self.terms[1]))
        flags = [f"policy={'+'.join(self.policies)}"] if self.policies else []
        flags += ["affinity"] * self.affinity + ["held"] * self.held
        return "; ".join(parts + flags)


class NoRoute(Exception):
    """No replica may serve the request now; the message says why (and names the residency policy)."""

    def __init__(self, message: str, policies: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.policies = policies


@dataclass(slots=True)
class _Group:
    region: str
    challenger: str = ""
    since: float = 0.0


@dataclass
class Router:
    config: GeoConfig
    replicas: list[Replica]
    edge: Place
    residency: Residency
    affinity: AffinityTable
    _groups: dict[tuple[str, str, tuple[str, ...]], _Group] = field(default_factory=dict)

    @classmethod
    def build(cls, regions: Sequence[RegionSpec], config: GeoConfig, models: Sequence[str]) -> Router:
        edge = edge_place(config)
        r = config.routing
        replicas = []
        for i, spec in enumerate(regions):
            place = region_place(i, spec)
            km = (
                great_circle_km(edge.latitude, edge.longitude, place.latitude, place.longitude)
                if place.known
                else 0
            )
            urls = spec.urls()
            for n, url in enumerate(urls):
                replicas.append(
                    Replica(
                        id=spec.name if len(urls) == 1 else f"{spec.name}/{n}",
                        region=spec.name,
                        url=url,
                        spec=spec,
                        place=place,
                        health=Health(config.health),
                        latency=Latency(2 * floor_one_way_ms(km), r.path_inflation, r.ewma_alpha),
                        models=frozenset(spec.models or models),
                    )
                )
        table = AffinityTable(r.affinity_entries, r.affinity_block_chars, r.affinity_min_chars)
        return cls(config, replicas, edge, Residency(config.residency), table)

    # --- the decision --------------------------------------------------------------------------------------

    def route(
        self,
        model: str,
        where: Where,
        tenant: str,
        prompt_tokens: int,
        prefix: tuple[int, ...],
        now: float,
    ) -> Route:
        serving = [r for r in self.replicas if model in r.models]
        if not serving:
            raise NoRoute(f"No region serves the model {model!r}.")
        allowed = self.residency.allowed(where.country, where.continent, tenant)
        if allowed.regions is not None:
            serving = [r for r in serving if r.region in allowed.regions]
            if not serving:
                raise NoRoute(
                    f"Data-residency policy {' + '.join(allowed.policies)} allows no region serving "
                    f"{model!r}.",
                    allowed.policies,
                )
        up = [r for r in serving if r.health.routable(now)]
        if not up:
            why = "; ".join(f"{r.id}: {r.health.why_not(now)}" for r in serving)
            scope = (
                f" allowed by data-residency policy {' + '.join(allowed.policies)}"
                if allowed.policies
                else ""
            )
            raise NoRoute(f"Every region{scope} serving {model!r} is unavailable ({why}).", allowed.policies)
        eligible = _prefer(up, lambda r: not r.loading)
        eligible = _prefer(eligible, lambda r: r.inflight < r.spec.capacity)
        holder = self.affinity.lookup(prefix) if prefix else None
        use_affinity = holder is not None and _balanced(eligible, self.config.routing)
        scored = [
            (r, self._terms(r, where, prompt_tokens, holder if use_affinity else None)) for r in eligible
        ]
        # Within a millisecond, replicas are equally good: the catalog's order decides (stable sort).
        scored.sort(key=lambda rt: round(rt[1].total_ms))
        affinity = use_affinity and holder is not None and scored[0][0].id == holder[0]
        held = False
        if not affinity:
            scored, held = self._hold(
                (model, where.country if where.located else "", allowed.policies), scored, now
            )
        if prefix:
            self.affinity.record(prefix, scored[0][0].id)
        return Route([r for r, _ in scored], [t for _, t in scored], allowed.policies, affinity, held)

    def _terms(self, r: Replica, where: Where, prompt_tokens: int, holder: tuple[str, int] | None) -> Terms:
        routing = self.config.routing
        client_ms = 0.0
        if where.located and r.place.known:
            inflation = routing.path_inflation
            p, e = r.place, self.edge
            from_client = great_circle_km(where.latitude, where.longitude, p.latitude, p.longitude)
            from_edge = great_circle_km(e.latitude, e.longitude, p.latitude, p.longitude)
            client_ms = 2 * inflation * (floor_one_way_ms(from_client) - floor_one_way_ms(from_edge))
        capacity = max(1, r.capacity)
        busy = r.busy
        service_ms = r.latency.service_ms(routing.default_service_ms)
        queue_ms = max(0, busy + 1 - capacity) / capacity * service_ms
        prefill_ms = 1000.0 * prompt_tokens / routing.prefill_tokens_per_s
        affinity_ms = 0.0
        if holder is not None and holder[0] == r.id:
            affinity_ms = min(prefill_ms, 1000.0 * (holder[1] / 4) / routing.prefill_tokens_per_s)
        return Terms(
            r.latency.rtt_ms,
            client_ms,
            queue_ms,
            min(busy, capacity) / capacity * LOAD_PENALTY_MS,
            prefill_ms,
            affinity_ms,
        )

    def _hold(
        self, key: tuple[str, str, tuple[str, ...]], scored: list[tuple[Replica, Terms]], now: float
    ) -> tuple[list[tuple[Replica, Terms]], bool]:
        """Hysteresis: keep the group (model, client country, residency) on its region until another wins
        by the margin for hold_s."""
        routing = self.config.routing
        best_by_region: dict[str, float] = {}
        for r, t in scored:
            best_by_region.setdefault(r.region, t.total_ms)
        best = scored[0][0].region
        group = self._groups.get(key)
        if group is None or group.region not in best_by_region:
            if len(self._groups) >= _MAX_GROUPS:
                self._groups.clear()
            self._groups[key] = _Group(best)
            return scored, False
        current = group.region
        if current != best:
            margin = max(routing.switch_margin_ms, routing.switch_margin_ratio * best_by_region[current])
            if best_by_region[best] + margin < best_by_region[current]:
                if group.challenger != best:
                    group.challenger, group.since = best, now
                elif now - group.since >= routing.hold_s:
                    group.region, group.challenger = best, ""
                    return scored, False
            else:
                group.challenger = ""
        else:
            group.challenger = ""
            return scored, False
        # The current region first (its replicas in score order), then the rest as scored.
        first = [rt for rt in scored if rt[0].region == group.region]
        return first + [rt for rt in scored if rt[0].region != group.region], True

    # --- what probes and responses tell it --------------------------------------------------------------

    def probe_passed(self, replica: Replica, rtt_ms: float, load: LoadReport | None) -> bool:
        replica.latency.rtt.add(rtt_ms)
        if load is not None:
            replica.load = load
        return replica.health.probe_passed()

    def probe_failed(self, replica: Replica, why: str) -> bool:
        went_down = replica.health.probe_failed(why)
        if went_down:
            self.affinity.forget(replica.id)
        return went_down

    def answered(self, replica: Replica, ttft_ms: float, load: LoadReport | None) -> None:
        """The replica's answer head arrived (a stream's first byte)."""
        replica.health.request_succeeded()
        replica.latency.ttft.add(ttft_ms)
        if load is not None:
            replica.load = load

    def finished(self, replica: Replica, service_ms: float) -> None:
        replica.latency.service.add(service_ms)

    def failed(self, replica: Replica, why: str, now: float) -> bool:
        """A real request failed at the replica (connect error, 5xx, timeout); True when it was ejected."""
        ejected = sum(1 for r in self.replicas if r.health.ejected(now))
        limit = self.config.health.max_ejected_percent / 100 * len(self.replicas)
        if replica.health.request_failed(why, now, may_eject=ejected + 1 <= limit):
            self.affinity.forget(replica.id)
            return True
        return False


def _prefer(replicas: list[Replica], good) -> list[Replica]:
    """Those that are ``good``, unless none is: then all of them (better late than a refusal)."""
    chosen = [r for r in replicas if good(r)]
    return chosen or replicas


def _balanced(replicas: list[Replica], routing) -> bool:
    """SGLang's cache-aware rule: follow the cache unless loads are far apart (then least-loaded)."""
    loads = [r.busy for r in replicas]
    high, low = max(loads), min(loads)
    return not (high - low > routing.balance_abs and high > routing.balance_rel * low)
