"""The cache stage (after admission, before routing): answer repeated questions at the edge.

An exact hit (a SQLite read) answers at once. Otherwise the stage returns the semantic lookup (embedding
off the event loop, then the verifier) as a :class:`~edge.journey.Racing` reply, which the forward stage
races against the region's first byte: a hit that comes first answers and the region's request is
cancelled (never billed as served, its slot freed); a miss costs the request nothing. A complete,
successful answer (the relay's :class:`~edge.journey.WholeAnswer`) is stored afterwards, off the request's
path.

Policy: only temperature-0 requests are cached (``cache.any_temperature_tenants`` widen it), each scope's
answers for its own requests (``cache.scope``: the tenant, the key, or the key's end user);
``Cache-Control: no-cache`` skips the lookup and its fresh answer replaces the stored one, ``no-store``
skips the write, ``max-age=N`` accepts only entries younger than N seconds and keeps a new one at most N
seconds. Errors, filtered and cut-short answers are never stored, nor one another model gave (a fallback,
the degraded tier's stand-in); answers cut at max_tokens only with ``cache.store_truncated``. A question the
verifier does not compare (code, or longer than it reads) gets exact hits only: no embedding, no semantic
search. Where a region embeds (``cache.embed = "region"``), the question goes only to a region the
request's data-residency policy allows.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from aiohttp import web

from cache.audit import Mode
from cache.keys import CacheKey, cache_key
from cache.response_cache import Hit, Lookup, ResponseCache
from cache.store import Entry
from cache.verify import semantic_allowed
from edge.cache_audit import Audited
from edge.cache_reply import CachedReply
from edge.degraded import cut_now
from edge.journey import CacheUse, Journey, Preempting, Racing, Reply
from edge.keys import ApiKey
from edge.opened import Opened
from edge.routing import client_where
from edge.usage_audit import audit_usage
from nearshore.protocol.headers import CACHE
from nearshore.protocol.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
)

SHARED_SCOPE = "shared"


@dataclass(frozen=True, slots=True)
class Directives:
    read: bool = True
    write: bool = True
    max_age_s: float | None = None


def cache_control(header: str) -> Directives:
    """The request's ``Cache-Control`` as the cache obeys it (unknown directives are ignored)."""
    read = write = True
    max_age: float | None = None
    for part in header.lower().split(","):
        name, _, value = part.strip().partition("=")
        if name == "no-cache":
            read = False
        elif name == "no-store":
            write = False
        elif name == "max-age":
            try:
                max_age = max(0.0, float(value.strip().strip('"')))
            except ValueError:
                continue
    return Directives(read, write, max_age)


def _key(journey: Journey) -> CacheKey | None:
    state, body, key = journey.state, journey.body, journey.key
    assert body is not None and key is not None
    settings = state.config.cache
    if isinstance(body, EmbeddingRequest):
        return None  # a vector is cheap to make again and is not an answer to reuse
    if body.temperature != 0 and key.tenant not in settings.any_temperature_tenants:
        return None
    return cache_key(body, scope_of(settings.scope, key.tenant in settings.shared_tenants, key, body.user))


def scope_of(scope: str, shared: bool, key: ApiKey, user: str | None) -> str:
    """Whose entries a request may be answered from (``cache.scope``; a shared tenant shares them all)."""
    if shared:
        return SHARED_SCOPE
    if scope == "key" or (scope == "user" and not user):
        return f"key:{key.key_id}"
    if scope == "user":
        return f"user:{key.key_id}:{user}"
    return f"tenant:{key.tenant}"


async def cache_stage(journey: Journey) -> Reply | Racing | None:
    cache = journey.state.cache
    if cache is None:
        return None
    directives = cache_control(journey.request.headers.get("Cache-Control", ""))
    key = _key(journey) if directives.read or directives.write else None
    if key is None:
        return None
    assert journey.call is not None
    journey.cache = CacheUse("miss")
    journey.call = journey.call.with_client_header(CACHE, "MISS")
    metrics = journey.state.metrics
    racing: Racing | None = None
    settings = journey.state.config.cache
    started = time.perf_counter()
    semantic = _SemanticLookup(journey, cache, key, directives, started)
    if directives.read:
        hit = cache.exact(key)
        if hit is not None and _fresh(hit.entry, directives):
            reply = CachedReply(journey, hit)
            reply.taken(time.perf_counter() - started)
            metrics.cache_lookups.labels("exact").inc()
            return reply
        if settings.semantic and semantic_allowed(key.query):
            racing = Racing(semantic.start)
        else:
            metrics.cache_lookups.labels("miss").inc()
    if directives.write:
        journey.cleanups.append(_store_later(journey, cache, key, semantic, directives))
    return racing  # the forward stage starts it once the region's request is on its way, and races them


def _audited(journey: Journey, key: CacheKey, regions: frozenset[str] | None) -> Audited:
    body, admission = journey.body, journey.admission
    assert body is not None and admission is not None and not isinstance(body, EmbeddingRequest)
    kind = "chat" if journey.kind == "chat" else "completions"
    return Audited(key.partition, key.query, kind, body.stream, body.model, admission.max_tokens, regions)


def _embedding_scope(journey: Journey) -> frozenset[str] | None:
    """The regions the request's data-residency policy lets its question go to (None: any)."""
    state, key = journey.state, journey.key
    assert key is not None
    where = client_where(journey, state.locator)
    return state.pool.router.residency.allowed(where.country, where.continent, key.tenant).regions


def _fresh(entry: Entry, directives: Directives) -> bool:
    return directives.max_age_s is None or time.time() - entry.created_s <= directives.max_age_s


class _SemanticLookup:
    """The semantic lookup of one request: started by the forward stage (``start``) once the region's
    request is on its way, or never (the journey ended before it asked a region); the store after the
    answer reuses its embedding. What only the lookup, the store and the audit need is worked out when
    they first need it, after the region's request has gone."""

    def __init__(
        self, journey: Journey, cache: ResponseCache, key: CacheKey, directives: Directives, started: float
    ) -> None:
        self.journey, self.cache, self.key, self.directives = journey, cache, key, directives
        self.started = started  # (perf_counter) the lookup's time counts from the exact lookup
        self.lookup: asyncio.Task[Lookup] | None = None
        self._audited: Audited | None = None

    @property
    def audited(self) -> Audited:
        if self._audited is None:
            journey = self.journey
            embed_where = journey.state.config.cache.embed == "region"
            self._audited = _audited(journey, self.key, _embedding_scope(journey) if embed_where else None)
        return self._audited

    def start(self) -> asyncio.Task[Preempting | None]:
        assert self.lookup is None, "a request's semantic lookup starts once"
        audited = self.audited
        self.lookup = asyncio.create_task(self.cache.semantic(self.key, audited.regions))
        reply = _semantic(self.journey, self.lookup, self.directives, self.started, audited)
        return asyncio.create_task(reply)


async def _semantic(
    journey: Journey, lookup: asyncio.Task[Lookup], directives: Directives, started: float, audited: Audited
) -> Preempting | None:
    result = await lookup
    metrics = journey.state.metrics
    metrics.cache_lookup_seconds.observe(time.perf_counter() - started)
    if result.rejected:
        metrics.cache_rejections.inc(result.rejected)
    if result.hit is None or not _fresh(result.hit.entry, directives):
        metrics.cache_lookups.labels("miss").inc()
        return None
    metrics.cache_lookups.labels(result.hit.kind).inc()
    return _Preempting(journey, result.hit, time.perf_counter() - started, audited)


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
        if self.hit.kind != "semantic" or book is None or state.auditor is None or cut_now(self.journey):
            return False  # (in a cut, the answer to judge it by would be the local tier's, not the model's)
        if not book.should_audit(self.audited.partition):
            return False
        return state.auditor.take(self.audited, self.hit, upstream)


def _store_later(
    journey: Journey,
    cache: ResponseCache,
    key: CacheKey,
    semantic: _SemanticLookup,
    d: Directives,
):
    async def store() -> None:
        lookup = semantic.lookup  # None: never started (its embedding is made here, if the answer is kept)
        settings = journey.state.config.cache
        answer = journey.relayed.answer  # the region's answer, if it reached the client whole
        ok = journey.outcome.status == "ok" and journey.cache.status == "miss" and answer and answer.text
        allowed = ("stop", "length") if settings.store_truncated else ("stop",)
        if (
            not ok
            or answer is None
            or answer.finish_reason not in allowed
            or journey.body is None
            or journey.model != journey.body.model  # a fallback's or the local stand-in's: not this model's
            or not _complete(journey.body, answer.text, answer.finish_reason)
        ):
            if lookup is not None and not lookup.done():
                lookup.cancel()
            return
        ttl = settings.ttl_s if d.max_age_s is None else min(settings.ttl_s, d.max_age_s)
        now = time.time()
        entry = Entry(
            partition=key.partition,
            query=key.query,
            kind=journey.kind,
            text=answer.text,
            finish_reason=answer.finish_reason,
            completion_tokens=journey.relayed.events or _billed_completion_tokens(journey),
            model=journey.body.model,
            created_s=now,
            expires_s=now + ttl,
        )

        audited = semantic.audited

        async def save() -> None:
            result = await lookup if lookup is not None else None
            vector = result.vector if result is not None else None
            # no-cache asked for a fresh answer: it replaces the stored one (for everyone in the scope)
            await cache.save(key, entry, vector, audited.regions, replace=not d.read)
            # A hit the client was not served (it lost the race, or its partition serves exact hits only)
            # is judged against the answer the client got: a verdict that costs nothing.
            other = result and (result.held or result.hit)
            auditor = journey.state.auditor
            if other and other.kind == "semantic" and auditor is not None:
                mode: Mode = "shadow" if result.held else "raced"
                await auditor.judge(audited, other, entry.text, mode)
            # The candidate the judge turned down: evidence for the partition's own judge threshold.
            if result and result.explored and auditor is not None:
                await auditor.judge(audited, result.explored, entry.text, "explored")

        journey.state.in_background(save())

    return store


def _complete(body: object, text: str, finish: str | None) -> bool:
    """A structured answer (response_format, guided JSON) is stored only complete and parsing: the
    region's grammar ended it (``stop``) and it is JSON; any other answer as the settings allow."""
    if not isinstance(body, ChatCompletionRequest | CompletionRequest):
        return True
    asks_json = isinstance(body.response_format, JsonObjectFormat | JsonSchemaResponseFormat)
    if not asks_json and body.guided_json is None:
        return True
    if finish != "stop":
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _billed_completion_tokens(journey: Journey) -> int:
    """The completion as it is billed (the region's figure, checked against what was delivered): a region
    that lied about its usage must not have its lie stored and billed again on every hit."""
    outcome = journey.outcome
    return audit_usage(outcome.usage, journey.bounds, outcome.produced).usage.completion_tokens
