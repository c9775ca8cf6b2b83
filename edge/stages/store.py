"""The store stage (at the journey's exit, before it is billed): keep the region's answer for the next
request that asks the same, off the request's path.

What is kept: a complete, successful answer that reached the client whole (the relay's
:class:`~edge.journey.WholeAnswer`) to a request the cache stage looked up and missed, unless the client
said ``no-store``. Errors, filtered and cut-short answers are never stored, nor one another model gave (a
fallback, the degraded tier's stand-in); answers cut at max_tokens only with ``cache.store_truncated``; a
structured answer only when it is complete and parses. ``no-cache`` asked for a fresh answer: it replaces
the stored one. The semantic lookup's embedding is reused; a hit the client was not served (it lost the
race, or its partition serves exact hits only) and the candidate the judge turned down are judged against
the answer the client got, as free evidence for the live audit.
"""

from __future__ import annotations

import json
import time

from cache.audit import Mode
from cache.keys import CacheKey
from cache.response_cache import ResponseCache
from cache.store import Entry
from edge.cache_lookup import Directives, SemanticLookup
from edge.journey import Journey
from nearshore.protocol.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
)


async def store_stage(journey: Journey) -> None:
    cache, use = journey.state.cache, journey.cache
    if cache is None or use.key is None or use.semantic is None or not use.directives.write:
        return
    entry = _entry(journey, use.key, use.directives)
    if entry is None:
        use.semantic.drop()
        return
    journey.state.in_background(_save(journey, cache, use.key, entry, use.semantic, use.directives))


def _entry(journey: Journey, key: CacheKey, directives: Directives) -> Entry | None:
    """The entry to keep, or None when the answer may not be kept."""
    settings, body = journey.state.config.cache, journey.body
    answer = journey.relayed.answer  # the region's answer, if it reached the client whole
    allowed = ("stop", "length") if settings.store_truncated else ("stop",)
    if (
        journey.outcome.status != "ok"
        or journey.cache.status != "miss"
        or answer is None
        or not answer.text
        or answer.finish_reason not in allowed
        or body is None
        or journey.model != body.model  # a fallback's or the local stand-in's: not this model's
        or not _complete(body, answer.text, answer.finish_reason)
    ):
        return None
    ttl = settings.ttl_s if directives.max_age_s is None else min(settings.ttl_s, directives.max_age_s)
    now = time.time()
    return Entry(
        partition=key.partition,
        query=key.query,
        kind=journey.kind,
        text=answer.text,
        finish_reason=answer.finish_reason,
        completion_tokens=journey.relayed.events or _billed_completion_tokens(journey),
        model=body.model,
        created_s=now,
        expires_s=now + ttl,
    )


async def _save(
    journey: Journey,
    cache: ResponseCache,
    key: CacheKey,
    entry: Entry,
    semantic: SemanticLookup,
    directives: Directives,
) -> None:
    audited = semantic.audited
    result = await semantic.task if semantic.task is not None else None  # None: embedded in save
    vector = result.vector if result is not None else None
    # no-cache asked for a fresh answer: it replaces the stored one (for everyone in the scope)
    await cache.save(key, entry, vector, audited.regions, replace=not directives.read)
    auditor = journey.state.auditor
    if result is None or auditor is None:
        return
    # A hit the client was not served (it lost the race, or its partition serves exact hits only) is judged
    # against the answer the client got: a verdict that costs nothing.
    other = result.held or result.hit
    if other and other.kind == "semantic":
        mode: Mode = "shadow" if result.held else "raced"
        await auditor.judge(audited, other, entry.text, mode)
    # The candidate the judge turned down: evidence for the partition's own judge threshold.
    if result.explored:
        await auditor.judge(audited, result.explored, entry.text, "explored")


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
    return journey.audited_usage().usage.completion_tokens
