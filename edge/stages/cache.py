"""The cache stage (after the cut, before routing): answer repeated questions at the edge.

An exact hit (a SQLite read) answers at once. Otherwise the stage returns the semantic lookup (embedding
off the event loop, then the verifier) as a :class:`~edge.journey.Racing` reply, which the forward stage
races against the region's first byte: a hit that comes first answers and the region's request is
cancelled (never billed as served, its slot freed); a miss costs the request nothing. What the store stage
needs to keep the answer afterwards (the key, the directives, the lookup's embedding) is recorded on
``journey.cache``.

Policy: only temperature-0 requests are cached (``cache.any_temperature_tenants`` widen it), each scope's
answers for its own requests (``cache.scope``; :mod:`edge.cache_lookup`), as the client's
``Cache-Control`` allows. A question the verifier does not compare (code, or longer than it reads) gets
exact hits only: no embedding, no semantic search. Where a region embeds (``cache.embed = "region"``), the
question goes only to a region the request's data-residency policy allows. In a cut (the cut stage's
record) a semantic hit is not audited: the answer to judge it by would be the local tier's.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from cache.keys import CacheKey, cache_key
from cache.response_cache import Hit
from cache.verify import semantic_allowed
from edge.cache_audit import Audited
from edge.cache_lookup import SemanticLookup, cache_control, scope_of
from edge.cache_reply import CachedReply
from edge.client_route import client_where
from edge.journey import CacheUse, Journey, Preempting, Racing, Reply
from edge.opened import Opened
from nearshore.protocol.headers import CACHE
from nearshore.protocol.schemas import EmbeddingRequest


async def cache_stage(journey: Journey) -> Reply | Racing | None:
    cache = journey.state.cache
    if cache is None:
        return None
    directives = cache_control(journey.request.headers.get("Cache-Control", ""))
    key = _key(journey) if directives.read or directives.write else None
    if key is None:
        return None
    assert journey.call is not None
    started = time.perf_counter()
    semantic = SemanticLookup(cache, key, started, lambda: _audited(journey, key))
    journey.cache = CacheUse("miss", key=key, directives=directives, semantic=semantic)
    journey.call = journey.call.with_client_header(CACHE, "MISS")
    metrics, settings = journey.state.metrics, journey.state.config.cache
    if not directives.read:
        return None
    hit = cache.exact(key)
    if hit is not None and directives.fresh(hit.entry):
        reply = CachedReply(journey, hit)
        reply.taken(time.perf_counter() - started)
        metrics.cache_lookups.labels("exact").inc()
        return reply
    if settings.semantic and semantic_allowed(key.query):
        # the forward stage starts it once the region's request is on its way, and races them
        return Racing(lambda: asyncio.create_task(_semantic(journey, semantic)))
    metrics.cache_lookups.labels("miss").inc()
    return None


def _key(journey: Journey) -> CacheKey | None:
    state, body, key = journey.state, journey.body, journey.key
    assert body is not None and key is not None
    settings = state.config.cache
    if isinstance(body, EmbeddingRequest):
        return None  # a vector is cheap to make again and is not an answer to reuse
    if body.temperature != 0 and key.tenant not in settings.any_temperature_tenants:
        return None
    return cache_key(
        body, scope_of(settings.scope, key.tenant in settings.shared_tenants, key, body.end_user())
    )


def _audited(journey: Journey, key: CacheKey) -> Audited:
    body, admission, state = journey.body, journey.admission, journey.state
    assert body is not None and admission is not None and not isinstance(body, EmbeddingRequest)
    regions: frozenset[str] | None = None
    if state.config.cache.embed == "region":  # the regions the request's residency policy allows
        assert journey.key is not None
        where = client_where(journey, state.locator)
        regions = state.pool.router.residency.allowed(
            where.country, where.continent, journey.key.tenant
        ).regions
    kind = "chat" if journey.kind == "chat" else "completions"
    return Audited(key.partition, key.query, kind, body.stream, body.model, admission.max_tokens, regions)


async def _semantic(journey: Journey, semantic: SemanticLookup) -> Preempting | None:
    result = await semantic.start()
    metrics = journey.state.metrics
    metrics.cache_lookup_seconds.observe(time.perf_counter() - semantic.started)
    if result.rejected:
        metrics.cache_rejections.inc(result.rejected)
    if result.hit is None or not journey.cache.directives.fresh(result.hit.entry):
        metrics.cache_lookups.labels("miss").inc()
        return None
    metrics.cache_lookups.labels(result.hit.kind).inc()
    return _Preempting(journey, result.hit, time.perf_counter() - semantic.started, semantic.audited)


class _Preempting(CachedReply):
    """A semantic hit: recorded on the journey only if it wins the race (forward calls ``won``, with the
    stream's client side it started); an audited one keeps the region's request, to judge its answer in
    the background."""

    def __init__(self, journey: Journey, hit: Hit, lookup_s: float, audited: Audited) -> None:
        super().__init__(journey, hit)
        self.lookup_s = lookup_s
        self.audited = audited

    def won(self, upstream: asyncio.Future[Opened], client: web.StreamResponse | None) -> bool:
        self.client = client
        self.taken(self.lookup_s)
        state = self.journey.state
        book = state.cache.audit if state.cache is not None else None
        if (
            self.hit.kind != "semantic"
            or book is None
            or state.auditor is None
            or self.journey.cut.remote_out
        ):
            return False
        if not book.should_audit(self.audited.partition):
            return False
        return state.auditor.take(self.audited, self.hit, upstream)
