"""The response cache's live audit at the edge: the region's answer to an audited semantic hit, let finish
in the background and judged against the cached answer (the bookkeeping is :mod:`cache.audit`, the judge
:mod:`cache.answer_compare`).

An audited hit answers the client from the cache as any hit does; the region's request, which the lookup
raced, is not cancelled but read to its end here: never sent to the client, never billed to the tenant (its
tokens and price go to ``cache_audit_tokens`` and ``cache_audit_cost_usd``), bounded in time and bytes, and
at most ``cache.audit_max_concurrent`` at once (a hit beyond that is not audited and the region's request
is cancelled as usual). Free verdicts (a hit that lost the race, a would-be hit in a partition serving exact
hits only) are judged against the answer the client got, from the cache stage's store step.

A wrong verdict evicts the entry, raises its question's threshold, and may switch its partition to exact
hits only; the log says which, with the judge's strongest signals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec

from cache.answer_compare import judge
from cache.audit import Mode
from cache.embedder_pool import OutOfScope
from cache.response_cache import Hit, ResponseCache
from edge.attempts import Refused
from edge.billing import PriceTable
from edge.config import EdgeConfig
from edge.metrics import EdgeMetrics
from edge.opened import Opened
from edge.region_answer import MAX_TOKEN_TEXT_BYTES, UpstreamFault, read_bounded
from edge.upstream import UPSTREAM_ERRORS
from nearshore.protocol import sse
from nearshore.protocol.errors import ApiError

log = logging.getLogger("nearshore.edge.cache")


@dataclass(frozen=True, slots=True)
class Audited:
    """What an audit needs of its request, taken before the request ends."""

    partition: str
    question: str
    kind: str  # "chat" | "completions"
    stream: bool
    model: str
    max_tokens: int
    regions: frozenset[str] | None  # where the answers may be embedded (the request's residency scope)


class Auditor:
    def __init__(
        self,
        cache: ResponseCache,
        config: EdgeConfig,
        metrics: EdgeMetrics,
        prices: PriceTable,
        in_background: Callable[[Coroutine[Any, Any, Any]], object],
    ) -> None:
        self.cache = cache
        self.config = config
        self.metrics = metrics
        self.prices = prices
        self.in_background = in_background
        self.running = 0

    def take(self, request: Audited, hit: Hit, upstream: asyncio.Future[Opened]) -> bool:
        """Audit ``hit`` with the region's answer in flight; False when the audits in flight are at their
        limit (the caller cancels the region's request)."""
        if self.running >= self.config.cache.audit_max_concurrent:
            self.metrics.cache_audits.labels("sampled", "skipped").inc()
            return False
        self.running += 1
        self.in_background(self._sampled(request, hit, upstream))
        return True

    async def _sampled(self, request: Audited, hit: Hit, upstream: asyncio.Future[Opened]) -> None:
        settings = self.config.cache
        try:
            async with asyncio.timeout(settings.audit_timeout_s):
                opened = await upstream
                try:
                    text, usage = await self._read(opened, request, settings.audit_timeout_s)
                finally:
                    opened.release()  # pooled again if read to its end
        except Refused as refused:  # the region refused the question: nothing to judge the entry by
            refused.release()
            self.metrics.cache_audits.labels("sampled", "failed").inc()
            return
        except (
            TimeoutError,
            UpstreamFault,
            ApiError,
            msgspec.DecodeError,
            AttributeError,  # an answer that is JSON but not an object
            TypeError,
            *UPSTREAM_ERRORS,
        ) as exc:
            log.info("cache audit of %s not judged: %s", hit.exact, f"{type(exc).__name__}: {exc}"[:200])
            self.metrics.cache_audits.labels("sampled", "failed").inc()
            return
        finally:
            self.running -= 1
        self._count_cost(request.model, usage)
        await self.judge(request, hit, text, "sampled")

    async def _read(self, opened: Opened, request: Audited, timeout_s: float) -> tuple[str, dict]:
        """The region's whole answer: its text and usage (a stream's events joined)."""
        response = opened.response
        if response.status != 200:
            raise UpstreamFault.bad(f"the region answered HTTP {response.status}")
        up = self.config.upstream
        max_bytes = up.response_base_bytes + up.response_bytes_per_token * request.max_tokens
        body = await read_bounded(response, max_bytes, timeout_s)
        if not request.stream:
            answer = msgspec.json.decode(body)
            choice = (answer.get("choices") or [{}])[0]
            text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
            return text[: request.max_tokens * MAX_TOKEN_TEXT_BYTES], answer.get("usage") or {}
        parts: list[str] = []
        usage: dict = {}
        for data in sse.parse(body):
            if data == b"[DONE]":
                break
            chunk = msgspec.json.decode(data)
            if not isinstance(chunk, dict):
                continue
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                parts.append(delta.get("content") or choice.get("text") or "")
        return "".join(parts), usage

    async def judge(self, request: Audited, hit: Hit, fresh: str, mode: Mode) -> None:
        """Judge the cached answer against ``fresh`` and act on the verdict (evict, switch the partition)."""
        book = self.cache.audit
        if book is None or not fresh.strip():
            return
        cached = hit.entry.text
        try:
            texts = [request.question, cached, fresh]
            vectors = await self.cache.embedder.embed_background(texts, request.regions)
        except OutOfScope:
            return
        except Exception as exc:  # an embedder that fails fails the lookups too, which say so
            log.info("cache audit of %s not judged: embedding failed (%s)", hit.exact, exc)
            self.metrics.cache_audits.labels(mode, "failed").inc()
            return
        verdict = judge(request.question, cached, fresh, vectors)
        recorded = self.cache.audited(hit, request.partition, verdict.judgement, mode)
        self.metrics.cache_audits.labels(mode, verdict.judgement).inc()
        if recorded.evict:
            await self.cache.evict(hit.exact)
            self.metrics.cache_audit_evictions.inc()
            log.warning(
                "cache audit: a semantic hit answered another question (similarity %.3f, judged %s: %s): "
                "entry %s evicted, its question now needs %.3f",
                hit.similarity, verdict.p_same, verdict.reason, hit.exact, book.threshold_for(hit.exact),
            )  # fmt: skip
        if recorded.switched:
            rate = book.rate(request.partition)
            log.warning(
                "cache audit: partition %s %s semantic hits (%d wrong of %d, 95%% CI %.3f-%.3f, target %g)",
                request.partition, "stops serving" if recorded.switched == "off" else "serves again",
                rate.wrong, rate.audited, rate.lower, rate.upper, book.target,
            )  # fmt: skip

    def _count_cost(self, model: str, usage: dict) -> None:
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        cached = _count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
        self.metrics.cache_audit_tokens.labels("prompt").inc(prompt)
        self.metrics.cache_audit_tokens.labels("completion").inc(completion)
        self.metrics.cache_audit_cost.inc(self.prices.cost(model, prompt, cached, completion))


def _count(value: object) -> int:
    """A token count from a region's usage, never negative, never a non-number."""
    return value if isinstance(value, int) and value > 0 else 0
