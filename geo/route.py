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

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from geo.affinity import AffinityTable
from geo.catalog import GeoConfig, Place, RegionSpec, edge_place, region_place
from geo.health import Health
from geo.latency import Latency
from geo.places import EARTH_RADIUS_KM, FIBRE_KM_PER_MS, floor_one_way_ms, great_circle_km
from geo.residency import Allowed, Residency
from nearshore.protocol.load import LoadReport

LOAD_PENALTY_MS = 20.0
_MAX_GROUPS = 4096
_MAX_CACHED = 4096  # client places (and model + residency keys) whose per-replica work is kept
_sort_key = itemgetter(0)
_ROUTABLE_STATES = frozenset(("ready", "unloaded"))  # LoadReport.routable, read without the call


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


@dataclass(frozen=True, slots=True)
class Route:
    ranked: list[Replica]  # failover order, the chosen one first
    rows: list[_Row]  # each one's score terms, the same order (as Terms: ``terms``)
    policies: tuple[str, ...] = ()  # residency policies that applied
    affinity: bool = False  # a shared prefix decided
    held: bool = False  # hysteresis kept the current region over a better-scoring one

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
        if len(self.ranked) > 1:
            parts.append("runner-up " + one(self.ranked[1], Terms(*self.rows[1])))
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


# One eligible replica in a decision: (sort key, score, replica, terms). The key is the score rounded to
# the millisecond, then the catalog position (within a millisecond replicas are equally good and the
# catalog's order decides), packed in one integer so that the sort compares plain ints.
_Scored = tuple[int, float, Replica, _Row]
_POSITION_BITS = 20


@dataclass
class Router:
    config: GeoConfig
    replicas: list[Replica]
    edge: Place
    residency: Residency
    affinity: AffinityTable
    _groups: dict[tuple[str, str, tuple[str, ...]], _Group] = field(default_factory=dict)
    # What depends only on the catalog: the replicas serving a model within a residency scope, and the
    # client term of every replica for a client's place (GeoIP places repeat: cities, not addresses).
    _serving: dict[tuple[str, frozenset[str] | None], list[Replica]] = field(default_factory=dict)
    _client_ms: dict[tuple[float, float], list[float]] = field(default_factory=dict)

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
                        index=len(replicas),
                        edge_one_way_ms=floor_one_way_ms(km),
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
        allowed = self.residency.allowed(where.country, where.continent, tenant)
        serving = self._serving_now(model, allowed)
        up = [r for r in serving if r.health.probed_up and now >= r.health.ejected_until]
        if not up:
            why = "; ".join(f"{r.id}: {r.health.why_not(now)}" for r in serving)
            scope = (
                f" allowed by data-residency policy {' + '.join(allowed.policies)}"
                if allowed.policies
                else ""
            )
            raise NoRoute(f"Every region{scope} serving {model!r} is unavailable ({why}).", allowed.policies)
        # Not loading, then not over capacity, unless none is (better late than a refusal).
        eligible = [r for r in up if r.load is None or r.load.state in _ROUTABLE_STATES] or up
        eligible = [r for r in eligible if r.inflight < r.spec.capacity] or eligible
        holder = self.affinity.lookup(prefix) if prefix else None
        use_affinity = holder is not None and _balanced(eligible, self.config.routing)
        scored = self._score(eligible, where, prompt_tokens, holder if use_affinity else None)
        scored.sort(key=_sort_key)
        affinity = use_affinity and holder is not None and scored[0][2].id == holder[0]
        held = False
        if not affinity:
            scored, held = self._hold(
                (model, where.country if where.located else "", allowed.policies), scored, now
            )
        if prefix:
            self.affinity.record(prefix, scored[0][2].id)
        return Route([s[2] for s in scored], [s[3] for s in scored], allowed.policies, affinity, held)

    def _serving_now(self, model: str, allowed: Allowed) -> list[Replica]:
        """The replicas that serve ``model`` within the residency scope (the catalog's order)."""
        key = (model, allowed.regions)
        serving = self._serving.get(key)
        if serving is None:
            serving = [r for r in self.replicas if model in r.models]
            if serving and allowed.regions is not None:
                serving = [r for r in serving if r.region in allowed.regions]
            if len(self._serving) >= _MAX_CACHED:
                self._serving.clear()
            self._serving[key] = serving
        if not serving:
            if not any(model in r.models for r in self.replicas):
                raise NoRoute(f"No region serves the model {model!r}.")
            raise NoRoute(
                f"Data-residency policy {' + '.join(allowed.policies)} allows no region serving {model!r}.",
                allowed.policies,
            )
        return serving

    def _score(
        self,
        eligible: list[Replica],
        where: Where,
        prompt_tokens: int,
        holder: tuple[str, int] | None,
    ) -> list[_Scored]:
        """Every eligible replica's expected TTFT and its terms (see the module's docstring). The hot loop:
        Replica.capacity, .busy and Latency.rtt_ms are read inline (the same rules), without calls."""
        routing = self.config.routing
        default_service_ms = routing.default_service_ms
        prefill_ms = 1000.0 * prompt_tokens / routing.prefill_tokens_per_s
        client = self._client_terms(where) if where.located else None
        holder_id = holder[0] if holder is not None else None
        scored: list[_Scored] = []
        for r in eligible:
            latency = r.latency
            rtt, floor_ms = latency.rtt, latency.floor_rtt_ms
            if rtt.samples:
                rtt_ms = rtt.value if rtt.value > floor_ms else floor_ms
            else:
                rtt_ms = floor_ms * latency.inflation
            client_ms = client[r.index] if client is not None else 0.0
            load, capacity, busy = r.load, r.spec.capacity, r.inflight
            if load is not None:
                if 0 < load.capacity < capacity:
                    capacity = load.capacity
                if load.running + load.waiting > busy:
                    busy = load.running + load.waiting
            if capacity < 1:  # a spec made in code, unvalidated
                capacity = 1
            service = latency.service
            service_ms = service.value if service.samples else default_service_ms
            over = busy + 1 - capacity
            queue_ms = over / capacity * service_ms if over > 0 else 0.0
            load_ms = (busy if busy < capacity else capacity) / capacity * LOAD_PENALTY_MS
            affinity_ms = 0.0
            if r.id == holder_id:
                assert holder is not None
                affinity_ms = min(prefill_ms, 1000.0 * (holder[1] / 4) / routing.prefill_tokens_per_s)
            near_ms = rtt_ms + client_ms
            total_ms = (near_ms if near_ms > 0.0 else 0.0) + queue_ms + load_ms + prefill_ms - affinity_ms
            row = (rtt_ms, client_ms, queue_ms, load_ms, prefill_ms, affinity_ms)
            scored.append(((round(total_ms) << _POSITION_BITS) + r.index, total_ms, r, row))
        return scored

    def _client_terms(self, where: Where) -> list[float]:
        """Per replica, how much farther the client is from it than the edge is (floors x inflation, both
        ways): computed once per client place, as great_circle_km does (same operations, same result)."""
        key = (where.latitude, where.longitude)
        terms = self._client_ms.get(key)
        if terms is not None:
            return terms
        double_inflation = 2 * self.config.routing.path_inflation
        lat1 = math.radians(where.latitude)
        cos_lat1 = math.cos(lat1)
        terms = []
        for r in self.replicas:
            p = r.place
            if not p.known:
                terms.append(0.0)
                continue
            lat2 = math.radians(p.latitude)
            h = (
                math.sin((lat2 - lat1) / 2) ** 2
                + cos_lat1 * math.cos(lat2) * math.sin(math.radians(p.longitude - where.longitude) / 2) ** 2
            )
            from_client_km = 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))
            terms.append(double_inflation * (from_client_km / FIBRE_KM_PER_MS - r.edge_one_way_ms))
        if len(self._client_ms) >= _MAX_CACHED:
            self._client_ms.clear()
        self._client_ms[key] = terms
        return terms

    def _hold(
        self, key: tuple[str, str, tuple[str, ...]], scored: list[_Scored], now: float
    ) -> tuple[list[_Scored], bool]:
        """Hysteresis: keep the group (model, client country, residency) on its region until another wins
        by the margin for hold_s."""
        routing = self.config.routing
        _, best_ms, best, _ = scored[0]
        group = self._groups.get(key)
        # The current region's best (first in score order) replica, if it is still eligible.
        current = next((s for s in scored if s[2].region == group.region), None) if group else None
        if group is None or current is None:
            if len(self._groups) >= _MAX_GROUPS:
                self._groups.clear()
            self._groups[key] = _Group(best.region)
            return scored, False
        if group.region == best.region:
            group.challenger = ""
            return scored, False
        current_ms = current[1]
        margin = max(routing.switch_margin_ms, routing.switch_margin_ratio * current_ms)
        if best_ms + margin < current_ms:
            if group.challenger != best.region:
                group.challenger, group.since = best.region, now
            elif now - group.since >= routing.hold_s:
                group.region, group.challenger = best.region, ""
                return scored, False
        else:
            group.challenger = ""
        # The current region first (its replicas in score order), then the rest as scored.
        first = [s for s in scored if s[2].region == group.region]
        return first + [s for s in scored if s[2].region != group.region], True

    # --- what probes and responses tell it --------------------------------------------------------------

    def probe_passed(self, replica: Replica, rtt_ms: float | None, load: LoadReport | None) -> bool:
        """``rtt_ms`` None: the probe timed no round trip worth a sample (it opened its connection)."""
        if rtt_ms is not None:
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


def _balanced(replicas: list[Replica], routing) -> bool:
    """SGLang's cache-aware rule: follow the cache unless loads are far apart (then least-loaded)."""
    loads = [
        r.inflight if r.load is None else max(r.load.running + r.load.waiting, r.inflight) for r in replicas
    ]
    high, low = max(loads), min(loads)
    return not (high - low > routing.balance_abs and high > routing.balance_rel * low)
