"""Warm, pooled connections from the edge to every region replica, the probes that keep them warm, and the
router (geo/) that orders the replicas for each request.

A user's request should cross the ocean once: the TCP and TLS handshakes to every replica are done before
it arrives, and kept alive by periodic probes of ``/health``. The probes also time the round trip on a warm
connection and read the replica's load report, which, with what real requests see (first-token time, load
headers, failures), is what the router decides on. None of that I/O is on a request's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec

from edge.config import UpstreamConfig
from edge.h1 import MalformedResponse, Response
from edge.h1_pool import H1Pool
from edge.provider import CredentialUnavailable, Outgoing, Provider
from edge.region_answer import UpstreamFault, read_bounded
from edge.retry import RetryBudget
from geo.catalog import GeoConfig, RegionSpec
from geo.route import Replica, Route, Router
from nearshore.protocol.headers import EDGE_SECRET, LOAD
from nearshore.protocol.load import LoadReport, parse_load
from nearshore.tls import client_context

log = logging.getLogger("nearshore.edge.upstream")
_HEALTH_BYTES = 64 * 1024
# A provider's model list (its probe) can list hundreds of models.
_PROVIDER_PROBE_BYTES = 4 * 1024 * 1024
_RETRY_BURST = 10.0  # retries a replica's budget can hold


class Slot:
    """One request's place in its replica's in-flight count (what the router and ``region_inflight`` read):
    taken when the request is sent, given back once by :meth:`release`, however many paths call it."""

    __slots__ = ("_held", "replica")

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        replica.inflight += 1
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.replica.inflight -= 1


@dataclass(slots=True)
class Cooling:
    """Until when a server asked (Retry-After on a 429 or 503, at most upstream.max_retry_after_s) not to
    be asked again, and with which status, per model: a provider's rate limits are per model, and two region
    entries that name one URL share one (they are one server)."""

    until: dict[str, tuple[float, int]] = field(default_factory=dict)


@dataclass(eq=False)
class Upstream:
    """One replica: the router's view of it and the edge's connections to it."""

    replica: Replica
    pool: H1Pool
    budget: RetryBudget
    cooling: Cooling = field(default_factory=Cooling)
    provider: Provider | None = None  # an OpenAI-compatible provider, not a Nearshore regional node

    @property
    def continues_answers(self) -> bool:
        """Whether it may continue an answer another cut short (a provider must say it honours
        ``continue_final_message``, else it would answer the half-answer as a new turn)."""
        return self.provider is None or self.provider.continues_answers

    @property
    def reports_usage(self) -> bool:
        """Whether its answers carry usage figures to check (a provider may not: the edge counts)."""
        return self.provider is None or self.provider.reports_usage

    def outgoing(self, path: str, headers: dict[str, str], body: bytes, model: str) -> Outgoing:
        """The request for ``model`` as this upstream takes it."""
        if self.provider is None:
            return Outgoing(path, headers, body)
        return self.provider.outgoing(path, headers, body, model)

    @property
    def name(self) -> str:
        return self.replica.id

    @property
    def url(self) -> str:
        return self.replica.url

    def take_slot(self) -> Slot:
        """A place in the replica's in-flight count, held until the slot is released."""
        return Slot(self.replica)

    def cool(self, until: float, status: int, now: float, model: str) -> bool:
        """Ask it nothing for ``model`` before ``until`` (it said so with ``status``); True when this starts
        its cooling (it was not cooling before)."""
        before, _ = self.cooling.until.get(model, (0.0, 0))
        if until > before:
            self.cooling.until[model] = (until, status)
        return before <= now < until

    def cooling_left(self, now: float, model: str | None = None) -> float:
        """Seconds before it may be asked again for ``model`` (without one: for the model it waits on
        longest; 0: it may be now)."""
        if model is not None:
            until, _ = self.cooling.until.get(model, (0.0, 0))
            return max(0.0, until - now)
        return max([0.0, *(until - now for until, _ in self.cooling.until.values())])

    def cooling_status(self, model: str) -> int:
        return self.cooling.until.get(model, (0.0, 0))[1]

    def status(self, now: float) -> str:
        health = self.replica.health
        if health.routable(now):
            cooling = [
                f"{model} {until - now:.1f}s (HTTP {status})"
                for model, (until, status) in self.cooling.until.items()
                if until > now
            ]
            if cooling:
                return f"cooling after a Retry-After: {', '.join(cooling)}"
            return "loading" if self.replica.loading else "up"
        return health.why_not(now)


# What a request to a region can fail with before it is answered.
UPSTREAM_ERRORS = (OSError, MalformedResponse, ssl.SSLError)


class _HealthBody(msgspec.Struct):
    load: LoadReport | None = None


_health_decoder = msgspec.json.Decoder(_HealthBody)


def load_of(response: Response) -> LoadReport | None:
    return parse_load(response.headers.get(LOAD))


class UpstreamPool:
    def __init__(
        self,
        regions: Sequence[RegionSpec],
        config: UpstreamConfig,
        geo: GeoConfig | None = None,
        models: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.router = Router.build(regions, geo or GeoConfig(), models)
        self.upstreams: list[Upstream] = []
        self._by_id: dict[str, Upstream] = {}
        self._health_task: asyncio.Task | None = None
        self.headers: dict[str, str] = {}
        if config.shared_secret:
            self.headers[EDGE_SECRET] = config.shared_secret

    def _ssl(self, scheme: str, provider: bool) -> ssl.SSLContext | None:
        if scheme != "https":
            return None
        if provider:  # a provider's certificate is a public one: the system's trust store, no client cert
            return client_context()
        c = self.config
        return client_context(ca=c.ca or None, cert=c.client_cert or None, key=c.client_key or None)

    async def start(self) -> None:
        coolings: dict[str, Cooling] = {}
        names: dict[str, list[str]] = {}
        for replica in self.router.replicas:
            names.setdefault(replica.url, []).append(replica.id)
        for url, same in names.items():
            if len(same) > 1:
                log.warning(
                    "regions %s name one upstream (%s): they share its health, circuits and cooling, "
                    "and a retry never goes from one to the other as if it were another server",
                    " and ".join(same),
                    url,
                )
        for replica in self.router.replicas:
            url = urlsplit(replica.url)
            spec = replica.spec.provider
            pool = H1Pool(
                url.hostname or "127.0.0.1",
                url.port or (443 if url.scheme == "https" else 80),
                self._ssl(url.scheme, spec is not None),
                max_idle=self.config.pool_size,
                keepalive_s=max(60.0, 3 * self.config.health_interval_s),
                connect_timeout_s=self.config.connect_timeout_s,
                keep_warm=self.config.warm_connections,
            )
            c = self.config
            budget = RetryBudget(c.retry_budget_share, c.retry_budget_floor_per_s, burst=_RETRY_BURST)
            provider = Provider(spec, replica.url) if spec is not None else None
            upstream = Upstream(replica, pool, budget, coolings.setdefault(replica.url, Cooling()), provider)
            self.upstreams.append(upstream)
            self._by_id[replica.id] = upstream
        await self.warm()
        self._health_task = asyncio.create_task(self._health_loop())

    async def warm(self) -> None:
        """Open ``warm_connections`` connections to every replica at once (each one a probe)."""
        n = self.config.warm_connections
        await asyncio.gather(*(self.probe(u) for u in self.upstreams for _ in range(max(1, n))))
        # Those probes timed their handshakes too; one on a warm connection times the round trip alone.
        await asyncio.gather(*(self.probe(u) for u in self.upstreams))

    async def probe(self, upstream: Upstream) -> bool:
        """GET /health on a warm connection: its round trip, its load, whether it serves (True: it passed).
        A provider has no /health: its probe path (``/v1/models``), with its credential, answering 200 is
        its health."""
        timeout_s = self.config.health_timeout_s
        why = ""
        load: LoadReport | None = None
        provider = upstream.provider
        path, limit = (provider.probe_path, _PROVIDER_PROBE_BYTES) if provider else ("/health", _HEALTH_BYTES)
        started = time.perf_counter()
        try:
            headers = provider.probe_headers() if provider is not None else self.headers
            async with asyncio.timeout(timeout_s):
                response = await upstream.pool.request("GET", path, headers)
                rtt_ms = (time.perf_counter() - started) * 1000
                try:
                    load = load_of(response) if provider is None else None
                    body = await read_bounded(response, limit, timeout_s)  # pooled again when read
                finally:
                    response.close()
            if response.status != 200:
                why = f"{path} answered {response.status}"
            elif load is None and provider is None:
                with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                    load = _health_decoder.decode(body).load
        except CredentialUnavailable as exc:
            why = f"its credential is unavailable: {exc}"
        except TimeoutError:
            why = f"no answer to {path} within {timeout_s:g}s"
        except (UpstreamFault, *UPSTREAM_ERRORS) as exc:
            why = f"{path} failed: {type(exc).__name__}"
        router = self.router
        if why:
            if router.probe_failed(upstream.replica, why):
                log.warning("region %s is DOWN: %s", upstream.name, why)
            return False
        # A probe that opened its connection timed the handshakes too: its round trip is no sample.
        if router.probe_passed(upstream.replica, None if response.connect_s else rtt_ms, load):
            log.warning("region %s is up again", upstream.name)
        return True

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await asyncio.gather(*(self._probe_and_refill(u) for u in self.upstreams))

    async def _probe_and_refill(self, upstream: Upstream) -> None:
        """A region that passed its probe gets back the spare connections it lost (it restarted, or its
        keep-alive or a middlebox closed them) now, not from its next users' requests: a restarted region's
        first answers each paid one to three round trips of handshakes, and the router, measuring them,
        sent its traffic away again."""
        if await self.probe(upstream):
            upstream.pool.refill()

    async def replenish(self, upstream: Upstream) -> None:
        """Open a connection to replace one that a cut-short stream took down with it, so the next
        user does not pay the handshakes: the pool's own refill (bounded by ``warm_connections``; no
        extra request to the region)."""
        upstream.pool.refill()

    def ordered(self, route: Route | None) -> list[Upstream]:
        """The failover order: the route's, or (no route stage) every routable replica in config order."""
        if route is not None:
            return [self._by_id[r.id] for r in route.ranked]
        now = time.monotonic()
        return sorted(self.upstreams, key=lambda u: not u.replica.health.routable(now))

    # --- what real requests tell the router ------------------------------------------------------------

    def failed(self, upstream: Upstream, why: str, model: str, refused: bool = False) -> None:
        if self.router.failed(upstream.replica, why, time.monotonic(), model, refused):
            log.warning("region %s ejected for %s after failed requests: %s", upstream.name, model, why)

    def answered(
        self,
        upstream: Upstream,
        response: Response,
        first_byte_s: float,
        model: str,
        prompt_tokens: int = 0,
        tenant: str = "",
    ) -> None:
        """The answer head arrived ``first_byte_s`` after the replica began on the request
        (``UpstreamTiming.replica_first_byte_s``): a stream's is its first token; a unary one's is the whole
        answer, which bounds the first token from above."""
        streamed = response.content_type.startswith("text/event-stream")
        ttft_ms, load = first_byte_s * 1000, load_of(response)
        self.router.answered(
            upstream.replica,
            ttft_ms,
            load,
            prompt_tokens,
            upper_bound=not streamed,
            model=model,
            source=tenant,  # one tenant's slow request alone does not make the replica slow for all
        )

    def refused(self, upstream: Upstream, response: Response) -> None:
        load = load_of(response)
        if load is not None:
            upstream.replica.load = load

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        for upstream in self.upstreams:
            upstream.pool.close()
