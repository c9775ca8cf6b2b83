"""The routing decision: which replicas may serve a request, in which order (ARCHITECTURE.md, "route").

Filter: serves the model, allowed by residency, probed up and not ejected, not loading (while another can
serve), not over its in-flight capacity (while another is not). Score, in milliseconds of expected time to
first token:

    rtt      the edge's measured round trip to the replica (until measured: the fibre floor x inflation)
    client   how much farther the client is from the replica than the edge is (a client located elsewhere,
             behind a trusted proxy), as floors x inflation
    queue    what real requests there waited beyond the round trip and their prompt's expected prefill (the
             edge's own observations, geo/latency.py's Observed), or the requests beyond the replica's
             capacity times its recent service time per slot, whichever is larger: a replica's own load
             report refines the estimate, it never makes one measured slow look fast
    load     a small penalty for a busy batch (utilisation x load_penalty_ms): equal replicas share work
    prefill  the prompt's tokens at the pool's prefill speed
    affinity minus the prefill of the prompt's prefix that the replica already holds (while balanced)

The best region keeps a client group's traffic until another beats it by a margin for ``hold_s`` (no
flapping), except from a region whose replica real requests found slower than the challenger's whole score
(a hold there would make every request pay it). Within a region the best-scoring replica goes first. The
ranked list is the failover order.

Observations go stale on a replica that lost its traffic to them; one request every ``explore_after_s`` goes
to such a replica while probes alone would make it about as good as the best (geo/hold.py says why not a
time decay), and its sample after the silence replaces the stale estimate, so a recovered replica wins its
traffic back.

Local regions (``local = true``: this side of the ocean) are the degraded tier. By default (standby) they are
left out of the ranking while any remote replica of the model is routable, and put last in its failover
order; when none is, they are the route, marked ``cut``. With ``share_local`` they are ranked as any other
replica (the nearest, they usually take their pool's traffic); its groups are kept apart from standby's.

Everything here is pure and in memory: probes and responses update it off the request path.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from geo import scan_bounds
from geo.affinity import AffinityTable
from geo.catalog import GeoConfig, Place, RegionSpec, edge_place, region_place
from geo.client_terms import ClientTerms
from geo.decision import NoRoute, Replica, Route, Scored, Where
from geo.health import Health
from geo.hold import Group, GroupKey, explore, hold
from geo.latency import Latency
from geo.orders import Order, Scope
from geo.places import floor_one_way_ms, great_circle_km
from geo.residency import Allowed, Residency
from geo.terms import LOAD_PENALTY_MS, queue_and_load
from geo.terms import balanced as loads_balanced
from nearshore.protocol.load import LoadReport

__all__ = ["LOAD_PENALTY_MS", "NoRoute", "Replica", "Route", "Router", "Where"]

_MAX_CACHED = 4096  # model + residency keys whose per-replica work is kept
_sort_key = itemgetter(0)
_ROUTABLE_STATES = frozenset(("ready", "unloaded"))  # LoadReport.routable, read without the call
_SLACK_MS = 1.0  # scores within a millisecond tie (the catalog's order decides): scan those too
_SHORT_PROMPT_TOKENS = 256  # a prompt's first tokens: at the configured speed (_expected_prefill_ms)


# A Scored's sort key is the score rounded to the millisecond, then the catalog position (within a
# millisecond replicas are equally good and the catalog's order decides), packed in one integer so that the
# sort compares plain ints.
_POSITION_BITS = 20


@dataclass
class Router:
    config: GeoConfig
    replicas: list[Replica]
    edge: Place
    residency: Residency
    affinity: AffinityTable
    _groups: dict[GroupKey, Group] = field(default_factory=dict)
    # What depends only on the catalog: the replicas serving a model within a residency scope, and the
    # client term of every replica for a client's place (geo/client_terms.py).
    _serving: dict[tuple[str, frozenset[str] | None], Scope] = field(default_factory=dict)
    _clients: ClientTerms = None  # type: ignore[assignment]
    # The routable replicas in bound order, per (serving list, client place); valid while _epoch stands
    # (every probe sample, health change and ejection moves it) and until the next ejection ends.
    _static: dict[tuple, Order] = field(default_factory=dict)
    _epoch: int = 0
    # Each replica's observed queue (Latency.observed), by its place in ``replicas``: part of the scan's
    # bound (the queue term is at least it), kept as it is answered.
    _observed_ms: np.ndarray = None  # type: ignore[assignment]
    # The same, infinite until a replica is measured: the least of a scope is its baseline (geo.terms).
    _measured_ms: np.ndarray = None  # type: ignore[assignment]
    # When each was last observed: a stale observation leaves the bound, so that the replica is scanned
    # and may be explored (geo.hold) rather than never looked at again.
    _observed_at: np.ndarray = None  # type: ignore[assignment]
    has_local: bool = False  # some region is local (the degraded tier): set from the replicas

    def __post_init__(self) -> None:
        self.has_local = any(r.local for r in self.replicas)
        self._clients = ClientTerms(self.replicas, self.config.routing.path_inflation)
        self._observed_ms = np.array([r.latency.observed.value for r in self.replicas], dtype=np.float64)
        self._measured_ms = np.array(
            [r.latency.observed.value if r.latency.observed.samples else math.inf for r in self.replicas],
            dtype=np.float64,
        )
        self._observed_at = np.array([r.latency.observed.at for r in self.replicas], dtype=np.float64)

    @classmethod
    def build(cls, regions: Sequence[RegionSpec], config: GeoConfig, models: Sequence[str]) -> Router:
        edge = edge_place(config)
        r = config.routing
        replicas = []
        # Entries that name one URL are one server: they share its probes and its circuits.
        healths: dict[str, Health] = {}
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
                        health=healths.setdefault(url, Health(config.health)),
                        latency=Latency(
                            2 * floor_one_way_ms(km), r.path_inflation, r.ewma_alpha, r.explore_after_s
                        ),
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
        share_local: bool = False,
    ) -> Route:
        allowed = self.residency.allowed(where.country, where.continent, tenant)
        scope = self._serving_now(model, allowed)
        static, tail, cut = self._tiers(scope, model, share_local, now)
        if not static.replicas:
            why = "; ".join(f"{r.id}: {r.health.why_not(now, model)}" for r in scope.every)
            policy = (
                f" allowed by data-residency policy {' + '.join(allowed.policies)}"
                if allowed.policies
                else ""
            )
            message = f"Every region{policy} serving {model!r} is unavailable ({why})."
            raise NoRoute(message, allowed.policies, cut)
        holder = self.affinity.lookup(prefix) if prefix else None
        group_key = (model, where.country if where.located else "", allowed.policies, share_local)
        group = self._groups.get(group_key)
        baseline = min(
            scan_bounds.least_measured(static, self._measured_ms), self.config.routing.baseline_first_token_ms
        )
        scored, rest, balanced = self._scan(
            static, where, prompt_tokens, holder, group.region if group is not None else "", baseline, now
        )
        use_affinity = holder is not None and balanced
        scored.sort(key=_sort_key)
        affinity = use_affinity and holder is not None and scored[0][2].id == holder[0]
        held = explored = False
        if not affinity:
            scored, held = hold(self._groups, self.config.routing, group_key, scored, now, baseline)
            j = explore(self.config.routing, scored, now) if len(scored) > 1 else 0
            if j:
                scored = [scored[j], *scored[:j], *scored[j + 1 :]]
                held, explored = False, True
        if prefix:
            self.affinity.record(prefix, scored[0][2].id)
        ranked = [s[2] for s in scored] + rest + tail
        return Route(ranked, [s[3] for s in scored], allowed.policies, affinity, held, explored, cut)

    def cut_off(self, model: str, where: Where, tenant: str, now: float) -> bool:
        """Whether every remote replica serving ``model`` for this client is down or ejected while the edge
        has local regions: the degraded tier's case (a cable cut)."""
        if not self.has_local:
            return False
        allowed = self.residency.allowed(where.country, where.continent, tenant)
        try:
            scope = self._serving_now(model, allowed)
        except NoRoute:
            return False
        return bool(scope.remote) and not self._static_order(scope.remote, model, now).replicas

    def _tiers(
        self, scope: Scope, model: str, share_local: bool, now: float
    ) -> tuple[Order, list[Replica], bool]:
        """The replicas to rank, the local ones after them in the failover order (standby), and whether
        every remote one is out (then the ranked are local only)."""
        if not scope.local:  # every replica is remote: out, it is a cut only where the edge has local ones
            every = self._static_order(scope.every, model, now)
            return every, [], self.has_local and not every.replicas
        remote = self._static_order(scope.remote, model, now) if scope.remote else None
        cut = bool(scope.remote) and not (remote is not None and remote.replicas)
        if share_local:
            return self._static_order(scope.every, model, now), [], cut
        local = self._static_order(scope.local, model, now)
        if remote is not None and remote.replicas:
            return remote, list(local.replicas), cut
        return local, [], cut

    def _static_order(self, serving: list[Replica], model: str, now: float) -> Order:
        """The routable replicas of a scope and their round trips: rebuilt when a probe moved a round trip
        by a millisecond, a replica went down or came back, or an ejection ended."""
        key = id(serving)
        cached = self._static.get(key)
        if cached is not None and cached.epoch == self._epoch and now < cached.valid_until:
            return cached
        replicas: list[Replica] = []
        rtts: list[float] = []
        valid_until = math.inf
        for r in serving:
            health = r.health
            ejected_until = health.ejected_until(model)
            if ejected_until > now:
                valid_until = min(valid_until, ejected_until)
            if not health.probed_up or now < ejected_until:
                continue
            replicas.append(r)
            rtts.append(r.latency.rtt_ms)
        by_region: dict[str, list[int]] = {}
        for i, r in enumerate(replicas):
            by_region.setdefault(r.region, []).append(i)
        built = Order(
            self._epoch,
            valid_until,
            replicas,
            np.array(rtts, dtype=np.float64),
            np.array([r.index for r in replicas], dtype=np.intp),
            {r.id: i for i, r in enumerate(replicas)},
            by_region,
        )
        if len(self._static) >= _MAX_CACHED:
            self._static.clear()
        self._static[key] = built
        return built

    def _scan(
        self,
        static: Order,
        where: Where,
        prompt_tokens: int,
        holder: tuple[str, int] | None,
        current_region: str,
        baseline_ms: float,
        now: float,
    ) -> tuple[list[Scored], list[Replica], bool]:
        """Score the replicas that can win, best bound first: a replica's score is at least its round trip
        and client term, its observed queue and the prefill (the rest only adds), so the scan stops once
        that bound passes the runner-up's score. Always scored too: the affinity holder (its credit can beat
        any bound) and the hysteresis group's current region. Loading or full replicas count only if no
        other can serve. Returns the scored, the rest in bound order (the tail of the failover order), and
        whether the holder's load is in balance with the best others (SGLang's rule)."""
        prefill_ms = 1000.0 * prompt_tokens / self.config.routing.prefill_tokens_per_s
        replicas = static.replicas
        # Within a millisecond, the catalog's order decides (``replicas`` is in it): a stable sort.
        client_ms = self._clients.of(where) if where.located else None
        explore_s = self.config.routing.explore_after_s
        near, bounds, ranked = scan_bounds.bounds(
            static, client_ms, self._observed_ms, self._observed_at, baseline_ms, now, explore_s
        )
        good: list[int] = []
        deferred: list[int] = []
        best = runner_up = math.inf
        scanned = len(ranked)
        for j, i in enumerate(ranked):
            if float(bounds[i]) + prefill_ms >= runner_up + _SLACK_MS:
                scanned = j
                break
            r = replicas[i]
            load = r.load
            if (load is not None and load.state not in _ROUTABLE_STATES) or r.inflight >= r.spec.capacity:
                deferred.append(i)
                continue
            good.append(i)
            total = self._quick_total(r, float(near[i]), prefill_ms, baseline_ms)
            if total < best:
                best, runner_up = total, best
            elif total < runner_up:
                runner_up = total
        seen = set(ranked[:scanned])
        must: list[int] = []
        if holder is not None:
            i = static.position.get(holder[0], -1)
            if i >= 0 and i not in seen:
                must.append(i)
        if current_region:
            must += [i for i in static.by_region.get(current_region, ()) if i not in seen and i not in must]
        picked = (good or deferred) + must
        chosen = [replicas[i] for i in picked]
        taken = set(picked)
        # The failover tail: the unscanned in bound order (not checked for loading or capacity: a failover
        # that reaches them finds out); loading or full ones seen in the scan stay out while others serve.
        rest = [replicas[i] for i in ranked[scanned:] if i not in taken]
        balanced = True
        if holder is not None:
            balanced = loads_balanced(chosen, self.config.routing, holder[0])
        scored = self._score(chosen, where, prompt_tokens, holder if balanced else None, baseline_ms)
        return scored, rest, balanced

    def _quick_total(self, r: Replica, near: float, prefill_ms: float, baseline_ms: float) -> float:
        """The score without affinity, for the scan's bound (the same terms as _score)."""
        queue_ms, load_ms = queue_and_load(r, self.config.routing.default_service_ms, baseline_ms)
        return near + queue_ms + load_ms + prefill_ms

    def _serving_now(self, model: str, allowed: Allowed) -> Scope:
        """The replicas that serve ``model`` within the residency scope (the catalog's order)."""
        key = (model, allowed.regions)
        scope = self._serving.get(key)
        if scope is None:
            serving = [r for r in self.replicas if model in r.models]
            if serving and allowed.regions is not None:
                serving = [r for r in serving if r.region in allowed.regions]
            local = [r for r in serving if r.local]
            remote = [r for r in serving if not r.local] if local else serving
            if len(self._serving) >= _MAX_CACHED:
                self._serving.clear()
            scope = self._serving[key] = Scope(serving, remote, local)
        if not scope.every:
            if not any(model in r.models for r in self.replicas):
                raise NoRoute(f"No region serves the model {model!r}.")
            raise NoRoute(
                f"Data-residency policy {' + '.join(allowed.policies)} allows no region serving {model!r}.",
                allowed.policies,
            )
        return scope

    def _score(
        self,
        eligible: list[Replica],
        where: Where,
        prompt_tokens: int,
        holder: tuple[str, int] | None,
        baseline_ms: float = 0.0,
    ) -> list[Scored]:
        """Every eligible replica's expected TTFT and its terms (see the module's docstring); Latency.rtt_ms
        is read inline (the same rule), without the call."""
        routing = self.config.routing
        default_service_ms = routing.default_service_ms
        prefill_ms = 1000.0 * prompt_tokens / routing.prefill_tokens_per_s
        client = self._clients.of(where) if where.located else None
        holder_id = holder[0] if holder is not None else None
        scored: list[Scored] = []
        for r in eligible:
            latency = r.latency
            rtt, floor_ms = latency.rtt, latency.floor_rtt_ms
            if rtt.samples:
                rtt_ms = rtt.value if rtt.value > floor_ms else floor_ms
            else:
                rtt_ms = floor_ms * latency.inflation
            client_ms = float(client[r.index]) if client is not None else 0.0
            queue_ms, load_ms = queue_and_load(r, default_service_ms, baseline_ms)
            affinity_ms = 0.0
            if r.id == holder_id:
                assert holder is not None
                affinity_ms = min(prefill_ms, 1000.0 * (holder[1] / 4) / routing.prefill_tokens_per_s)
            near_ms = rtt_ms + client_ms
            total_ms = (near_ms if near_ms > 0.0 else 0.0) + queue_ms + load_ms + prefill_ms - affinity_ms
            row = (rtt_ms, client_ms, queue_ms, load_ms, prefill_ms, affinity_ms)
            scored.append(((round(total_ms) << _POSITION_BITS) + r.index, total_ms, r, row))
        return scored

    # --- what probes and responses tell it --------------------------------------------------------------

    def probe_passed(self, replica: Replica, rtt_ms: float | None, load: LoadReport | None) -> bool:
        """``rtt_ms`` None: the probe timed no round trip worth a sample (it opened its connection)."""
        latency = replica.latency
        before = round(latency.rtt_ms)
        if rtt_ms is not None:
            latency.probe_round_trip(rtt_ms)
        if load is not None:
            replica.load = load
        back = replica.health.probe_passed()
        if back or round(latency.rtt_ms) != before:  # the bound order may change: rebuild it when next asked
            self._epoch += 1
        return back

    def _expected_prefill_ms(self, replica: Replica, prompt_tokens: int) -> float:
        """The prefill a first token's time there has to explain: a short prompt's at the configured speed
        (the same for every replica: for a chat's few tokens, the fits' noise would be all the difference),
        the tokens beyond at what a prompt token costs there as its load report says (``pft``: what its node
        measured; scores keep the configured speed, since alike nodes' fits, tens of percent apart on a busy
        machine, outweighed the round trips between regions for a short prompt)."""
        default_ms = 1000.0 / self.config.routing.prefill_tokens_per_s
        own_ms = replica.load.prefill_ms_per_token if replica.load is not None else 0.0
        own_ms = own_ms if own_ms > 0.0 else default_ms
        short = min(prompt_tokens, _SHORT_PROMPT_TOKENS)
        return short * default_ms + (prompt_tokens - short) * own_ms

    def probe_failed(self, replica: Replica, why: str) -> bool:
        went_down = replica.health.probe_failed(why)
        if went_down:
            self._epoch += 1
            self.affinity.forget(replica.id)
        return went_down

    def answered(
        self,
        replica: Replica,
        ttft_ms: float,
        load: LoadReport | None,
        prompt_tokens: int = 0,
        upper_bound: bool = False,
        now: float | None = None,
        model: str = "",
        source: str = "",
    ) -> None:
        """The replica's answer head arrived ``ttft_ms`` after the request left: a stream's first token, or
        (``upper_bound``) a whole non-streamed answer, which bounds the first token from above. The expected
        prefill of the request's ``prompt_tokens`` is subtracted: a long prompt is not the replica's fault.
        ``source``: who asked (the tenant); a slower sample counts as far as another's corroborates it."""
        replica.health.request_succeeded(model)
        if load is not None:  # (made as the head left: after this prompt's prefill)
            replica.load = load
        prefill_ms = self._expected_prefill_ms(replica, prompt_tokens)
        now = time.monotonic() if now is None else now
        replica.latency.first_token(ttft_ms, prefill_ms, now, upper_bound, source)
        self._observed_ms[replica.index] = self._measured_ms[replica.index] = replica.latency.observed.value
        self._observed_at[replica.index] = replica.latency.observed.at

    def finished(
        self,
        replica: Replica,
        service_ms: float,
        tokens: int = 0,
        first_token_ms: float | None = None,
        prompt_tokens: int = 0,
        now: float | None = None,
        source: str = "",
    ) -> None:
        """An answer of ``tokens`` ended ``service_ms`` after it was asked: a stream's (its first token at
        ``first_token_ms``) teaches the replica's decode speed; a unary answer's, its queue (unary answers
        teach the router as streams do)."""
        latency = replica.latency
        latency.service.add(service_ms)
        if first_token_ms is not None:
            latency.stream_ended(service_ms, first_token_ms, tokens)
            return
        if tokens <= 0:
            return  # (an embedding, or an answer whose size is unknown)
        routing = self.config.routing
        prefill_ms = self._expected_prefill_ms(replica, prompt_tokens)
        now = time.monotonic() if now is None else now
        latency.unary_answer(service_ms, prefill_ms, tokens, routing.default_decode_ms_per_token, now, source)
        self._observed_ms[replica.index] = self._measured_ms[replica.index] = latency.observed.value
        self._observed_at[replica.index] = latency.observed.at

    def failed(self, replica: Replica, why: str, now: float, model: str, refused: bool = False) -> bool:
        """A real request for ``model`` failed at the replica (connect error, 5xx, timeout); True when it
        was ejected for that model. ``refused``: it answered in HTTP that it will not serve (429, 503): the
        edge's network is fine, so the max_ejected_percent guard (against the edge's own faults) does not
        hold it in."""
        serving = [r for r in self.replicas if model in r.models]
        ejected = sum(1 for r in serving if r.health.ejected(now, model))
        limit = self.config.health.max_ejected_percent / 100 * len(serving)
        if replica.health.request_failed(why, now, may_eject=refused or ejected + 1 <= limit, model=model):
            self._epoch += 1
            self.affinity.forget(replica.id)
            return True
        return False
