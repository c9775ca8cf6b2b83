"""A cached answer, sent as the region would have sent it: the same JSON for a unary request, the same SSE
framing for a stream (a role event, the text in word-sized chunks, the finish, the usage if asked,
``[DONE]``), so the official ``openai`` client parses a hit exactly like a miss."""

from __future__ import annotations

import dataclasses
import re
import time

from aiohttp import web

from cache.response_cache import Hit
from edge.degraded import answered_by
from edge.journey import Journey, Relayed
from edge.usage_audit import AuditedUsage
from nearshore.httpkit import close_unframed
from nearshore.protocol import sse
from nearshore.protocol.answers import answer_for, stream_chunks
from nearshore.protocol.headers import CACHE, CACHE_SIMILARITY, SERVER_TIMING
from nearshore.protocol.schemas import Usage, json_encoder

_PIECE = re.compile(r"\s*\S+|\s+$")  # a word with the spaces before it: about a token or two
_CHUNKS_PER_WRITE = 16


def _as_is(data: bytes) -> bytes:
    return data


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text) or [text]


class CachedReply:
    """The reply a hit answers with; :meth:`taken` records it on the journey once it wins."""

    def __init__(self, journey: Journey, hit: Hit) -> None:
        self.journey = journey
        self.hit = hit
        # A stream's client side that the forward stage started (handed over when a semantic hit wins the
        # race: a heartbeat may have committed it); None: the hit answers on a response of its own.
        self.client: web.StreamResponse | None = None

    def taken(self, lookup_s: float) -> None:
        journey, entry = self.journey, self.hit.entry
        admission = journey.admission
        assert admission is not None
        usage = Usage.of(admission.prompt_estimate, entry.completion_tokens)
        journey.answered()
        journey.cache = dataclasses.replace(journey.cache, status=self.hit.kind, lookup_s=lookup_s)
        if journey.cut.remote_out:  # the remote regions are out: the cache answers in their place
            answered_by(journey, "cache", entry.model)
        streamed = journey.body is not None and journey.body.stream
        journey.relayed = Relayed(
            events=entry.completion_tokens if streamed else None,
            usage=json_encoder.encode(usage),
            produced=True,
        )

    def _headers(self, audited: AuditedUsage | None) -> dict[str, str]:
        journey = self.journey
        assert journey.call is not None
        headers = dict(journey.call.client_headers)
        headers[CACHE] = "HIT" if self.hit.kind == "exact" else "SEMANTIC"
        headers[CACHE_SIMILARITY] = f"{self.hit.similarity:.4f}"
        edge_ms = (time.perf_counter() - journey.started) * 1000
        headers[SERVER_TIMING] = f"edge;dur={edge_ms:.2f}, cache;dur={journey.cache.lookup_s * 1000:.2f}"
        return headers

    def _usage(self, audited: AuditedUsage | None) -> Usage:
        if audited is not None:
            return audited.usage
        admission = self.journey.admission
        assert admission is not None
        return Usage.of(admission.prompt_estimate, self.hit.entry.completion_tokens)

    async def finish(self, audited: AuditedUsage | None) -> web.StreamResponse:
        journey, entry = self.journey, self.hit.entry
        body = journey.body
        assert body is not None
        answer = answer_for(journey.kind == "chat", journey.request_id, body.model)
        usage = self._usage(audited)
        finish = entry.finish_reason if entry.finish_reason in ("stop", "length") else "stop"
        dialect = journey.dialect
        if not body.stream:
            return web.Response(
                body=await dialect.whole(json_encoder.encode(answer.whole(entry.text, finish, usage))),
                content_type="application/json",
                headers=self._headers(audited),
            )
        chunks = stream_chunks(
            answer, pieces(entry.text), finish, usage if body.wants_usage_chunk() else None
        )
        events = [sse.event(chunk) for chunk in chunks]
        client = self.client
        if client is None:
            client = close_unframed(journey.request, web.StreamResponse(headers=sse.HEADERS))
        if not client.prepared:
            client.headers.update(self._headers(audited))
            await client.prepare(journey.request)
        recode = dialect.recode or _as_is
        for i in range(0, len(events), _CHUNKS_PER_WRITE):
            await client.write(recode(b"".join(events[i : i + _CHUNKS_PER_WRITE])))
        await dialect.ending(audited)
        await client.write_eof(recode(sse.DONE))  # the end in the same write
        return client
