"""One request's record as it moves through the edge's stages (:mod:`edge.pipeline`).

The arrival (who asked, when, with which ids) is fixed when the journey starts; after that each stage owns
one small record that it produces and later stages read (authenticate the key, parse the body, rightsize
its :class:`Sizing`, admit its :class:`Admission` and :class:`Call`, cut its :class:`Cut`, cache its
:class:`CacheUse`, route its :class:`Routed`, gate its :class:`Gated`, forward its :class:`Forwarded`,
continue its :class:`Continued`), and whichever stage ends the request records its :class:`Outcome`. What
reached the client is read from whoever delivered it (:class:`Delivery`: a stream's owner, referenced
from the forward stage on, or the :class:`Relayed` record of a unary answer or a cache hit). The
pipeline's one exit bills from it (:mod:`edge.stages.settle`). Values flow through it as fields, never
through module-level context.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from aiohttp import web

from cache.keys import CacheKey
from edge.cache_lookup import NO_DIRECTIVES, Directives, SemanticLookup
from edge.keys import ApiKey
from edge.limits import Decision
from edge.opened import Opened
from edge.retry import NO_FIRST_BYTE_BUDGET, Deadline, FirstByteBudget
from edge.spend_budget import Hold
from edge.state import EdgeState
from edge.usage_audit import AuditedUsage, Delivered, UsageBounds, audit_usage
from geo.route import Route
from nearshore.protocol.errors import ApiError
from nearshore.protocol.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, Usage
from nearshore.protocol.trace import TraceContext

Kind = Literal["chat", "completions", "embeddings"]
Status = Literal["ok", "error", "aborted"]
Body = ChatCompletionRequest | CompletionRequest | EmbeddingRequest
CLIENT_LEFT = 499  # nginx's code for a client that closed the connection before the answer


class Reply(Protocol):
    """What a stage hands back to end the journey: its ``finish`` sends the answer's last part once the
    request is billed (a unary body, or a stream's usage chunk, error event and ``[DONE]``)."""

    async def finish(self, audited: AuditedUsage | None) -> web.StreamResponse: ...


class Preempting(Reply, Protocol):
    """A reply that raced the region's answer; ``won`` records it on the journey once it wins (answering on
    ``client``, the stream's side the forward stage already started, if any), and says whether it takes the
    region's request in hand (an audit lets it finish in the background), else the request is cancelled."""

    def won(self, upstream: asyncio.Future[Opened], client: web.StreamResponse | None) -> bool: ...


@dataclass(frozen=True, slots=True, eq=False)
class Racing:
    """A reply on its way that may answer before the region does (the response cache's semantic lookup). A
    stage returns it instead of ending the journey; the pipeline hands it to the stage that asks the region,
    which races it: ``start()`` begins the work and returns the task that ends with the reply that answers
    instead, or None (the region answers). The racing stage starts it once the region's request is on its
    way, so that the work (embedding a question takes a core for milliseconds) never delays that request."""

    start: Callable[[], asyncio.Task[Preempting | None]]


class StreamSide(Reply, Protocol):
    """A stream's client side, started by the forward stage before the region answers."""

    @property
    def first_write_at(self) -> float:
        """When content first reached the client (perf_counter; 0: none yet)."""
        ...


class Dialect(Protocol):
    """The API the client speaks over the chat journey: how the chat answer is said to it. Chat itself
    (:data:`AS_IS`) changes nothing; the Responses API (edge/responses_turn.py) recodes every stream byte
    and every unary body, and keeps the response before the stream's end when asked to."""

    @property
    def recode(self) -> Callable[[bytes], bytes] | None:
        """A stream's bytes as the client gets them (None: as they are)."""
        ...

    async def whole(self, body: bytes) -> bytes:
        """A unary chat answer (its usage as billed) as the client gets it."""
        ...

    async def ending(self, audited: AuditedUsage | None) -> None:
        """A stream is about to end (billed: ``audited``), whole or failed."""
        ...


class _AsIs:
    recode = None

    async def whole(self, body: bytes) -> bytes:
        return body

    async def ending(self, audited: AuditedUsage | None) -> None:
        return None


AS_IS: Dialect = _AsIs()


@dataclass(frozen=True, slots=True)
class Sizing:
    """The rightsize stage's choice for a size alias (empty for a model asked by name)."""

    chosen_model: str = ""  # for x-nearshore-model
    other_size: str = ""  # the alias's other model: its fallback when no chain is configured
    alias: str = ""  # the size alias the request named


@dataclass(frozen=True, slots=True)
class PromptCount:
    """A request's prompt in tokens, counted once (rightsize counts a size alias's; admit reuses it)."""

    ceiling: int  # the most tokens it can be
    estimate: int  # the counter's figure: exact where the counter is, else an estimate


@dataclass(frozen=True, slots=True)
class Admission:
    """What admission decided and reserved for a request; from then on it is billed."""

    decision: Decision
    hold: Hold | None
    prompt_ceiling: int  # the most tokens its prompt can be
    prompt_estimate: int  # what its prompt is billed at if no usage comes back
    max_tokens: int  # the completion tokens each choice may produce
    choices: int = 1  # n: the choices asked for, each up to max_tokens

    @property
    def completion_tokens(self) -> int:
        """The most completion tokens the whole answer may have (what was reserved)."""
        return self.max_tokens * self.choices


@dataclass(frozen=True, slots=True)
class Call:
    """What goes to the region, and the headers every answer to the client carries. A later stage that adds
    a client header replaces the journey's call with :meth:`with_client_header`; nothing writes into it."""

    path: str
    body: bytes
    headers: dict[str, str]
    client_headers: dict[str, str]
    echo: bool = False  # /v1/completions with echo: the first streamed text is the prompt
    keep_usage: bool = False  # the client asked for the usage chunk

    def with_client_header(self, name: str, value: str) -> Call:
        return dataclasses.replace(self, client_headers={**self.client_headers, name: value})

    def without_client_header(self, name: str) -> Call:
        headers = {k: v for k, v in self.client_headers.items() if k != name}
        return dataclasses.replace(self, client_headers=headers)


@dataclass(slots=True)
class Cut:
    """The cut stage's decision (edge/stages/cut.py), made once: whether the request's model is cut off
    from its remote regions, and the degraded tier's policy for it. Later stages read it, they do not ask
    the router again; who answered in the remote regions' place is noted here too (edge/degraded.py)."""

    served_remotely: bool = False  # remote regions serve its model (False: no local region, no cut stage)
    remote_out: bool = False  # every remote replica of the model is down or ejected (by the probes)
    share_local: bool = False  # local regions take its traffic as any replica (else only what remote cannot)
    stand_in: str = ""  # the local model that may answer in its place ("": none may)
    by: str = ""  # "cache" | "local" | "none" (refused): the degraded tier's answer, set by who gave it


@dataclass(frozen=True, slots=True)
class CacheUse:
    """What the response cache did for the request (the ledger's ``cache_status``), and what the store
    stage needs to keep its answer: the cache stage's key, the client's directives, the semantic lookup."""

    status: str = "bypass"  # "bypass" (not looked up) | "miss" | "exact" | "semantic"
    lookup_s: float = 0.0  # the lookup that answered (Server-Timing cache;dur)
    key: CacheKey | None = None  # None: the request is not cached
    directives: Directives = NO_DIRECTIVES
    semantic: SemanticLookup | None = None  # the lookup the forward stage races, and the store reuses


@dataclass(frozen=True, slots=True)
class Routed:
    """The route stage's order (no route stage: every routable replica, config order)."""

    route: Route | None = None
    unrouted: str = ""  # why no replica may serve the model asked for (its fallbacks may)
    route_s: float = 0.0  # the route stage's time (Server-Timing route;dur)


@dataclass(frozen=True, slots=True)
class Gated:
    queue_s: float = 0.0  # waited for the key's share and a slot in the pool (Server-Timing edge-queue;dur)


@dataclass(slots=True)
class Forwarded:
    """The forward stage's side: the region that answers (and the continuation, which forwards again)."""

    deadline: Deadline | None = None  # when the whole request must be done (upstream.request_deadline_s)
    first_byte: FirstByteBudget = NO_FIRST_BYTE_BUDGET  # every attempt's first byte, together
    chain: tuple[str, ...] = ()  # the request's fallback models, in order (edge/fallbacks.py)
    opened: Opened | None = None  # the region's answer, once its head arrived
    stream: StreamSide | None = None  # a stream's client side
    region: str = ""
    served_model: str = ""  # the model that answered, when a fallback did (else the body's)
    attempts: int = 0  # requests sent to regions for it (failover, retries, fallbacks, continuations)


@dataclass(frozen=True, slots=True)
class WholeAnswer:
    """The region's answer as it reached the client, whole: what the response cache may store."""

    text: str
    finish_reason: str


class Delivery(Protocol):
    """What reached the client, read from whoever delivered it: a stream's owner
    (:class:`edge.stream_reply.StreamReply`, which holds it as the stream goes), or the :class:`Relayed`
    record of a unary answer or a cache hit. The journey keeps a reference, never a copy."""

    @property
    def events(self) -> int | None:
        """Streams: the content events that reached the client (None: not a stream)."""
        ...

    @property
    def delivered(self) -> Delivered | None:
        """Unary answers: the text that reached the client, in tokens."""
        ...

    @property
    def answer(self) -> WholeAnswer | None:
        """The answer, once it reached the client whole (what the store stage keeps)."""
        ...

    @property
    def usage(self) -> bytes | None:
        """The region's usage JSON, unchecked (the settle stage audits it)."""
        ...

    @property
    def produced(self) -> bool:
        """An answer, or a streamed token, came back."""
        ...

    @property
    def bad_events(self) -> int:
        """Stream events from a region that did not parse (skipped)."""
        ...


@dataclass(frozen=True, slots=True)
class Relayed:
    """A delivery recorded whole, when it happened: a unary answer's, a cache hit's (which delivers too),
    or nothing yet."""

    events: int | None = None
    delivered: Delivered | None = None
    answer: WholeAnswer | None = None
    usage: bytes | None = None
    produced: bool = False
    bad_events: int = 0


NOTHING_RELAYED = Relayed()


@dataclass(frozen=True, slots=True)
class ServedPart:
    """Part of a continued answer: the region and model that served it, and its tokens (content events)."""

    region: str
    model: str
    tokens: int


@dataclass(slots=True)
class Continued:
    """The continue stage's: another region took the stream over."""

    count: int = 0  # how many times another replica took the answer over
    parts: list[ServedPart] = field(default_factory=list)  # served by regions that then died, in order

    @property
    def from_region(self) -> str:
        """Every region that served part of a continued answer before the last (the ledger's
        ``continued_from``: "a,b" when b continued a's answer and e finished it)."""
        return ",".join(p.region for p in self.parts)

    @property
    def served_tokens(self) -> int:
        return sum(p.tokens for p in self.parts)

    stalled_s: float = 0.0  # the silences that cut this stream so far (upstream.stall_budget_s bounds them)


@dataclass(slots=True)
class Outcome:
    """How the request ended, as the stages record it; until then it counts as left by its client."""

    status: Status = "aborted"
    http_status: int = CLIENT_LEFT
    error_code: str = ""
    refused: bool = False  # the region refused the request itself (a 4xx)
    stopped: bool = False  # the edge itself ended it (its key revoked, a shutdown): no region failed it
    recorded: bool = False  # an outcome was recorded


@dataclass(slots=True, eq=False)
class Journey:
    # The arrival (edge/app.py).
    request: web.Request
    state: EdgeState
    kind: Kind
    started: float  # perf_counter at arrival
    request_id: str  # the edge's own, unique
    client_request_id: str = ""
    trace: TraceContext | None = None  # the caller's W3C trace (or one the edge started)
    span_id: str = ""  # the edge's span: the parent id the region receives
    api: str = ""  # "responses": the Responses API over the chat journey (else the kind's own)
    dialect: Dialect = AS_IS  # how the answer is said to the client (the parse stage sets it)
    # One record per stage, in the order they run.
    key: ApiKey | None = None  # authenticate
    body: Body | None = None  # parse (rightsize narrows a size alias to its model)
    sizing: Sizing = Sizing()  # rightsize
    prompt_count: PromptCount | None = None  # rightsize, for a size alias (admit counts the others)
    admission: Admission | None = None  # admit
    call: Call | None = None  # admit
    cut: Cut = field(default_factory=Cut)  # cut (written by the degraded tier's answer too)
    cache: CacheUse = CacheUse()  # cache
    routed: Routed = Routed()  # route
    gated: Gated = Gated()  # gate
    forwarded: Forwarded = field(default_factory=Forwarded)  # forward
    relayed: Delivery = NOTHING_RELAYED  # relay (a stream's owner from the forward stage on)
    continued: Continued = field(default_factory=Continued)  # continue
    outcome: Outcome = field(default_factory=Outcome)  # whichever stage ends it
    billed: Usage | None = None  # settle: the usage as settled (checked), once billed
    settled: AuditedUsage | None = None  # settle: what the answer's finish says of the usage
    # Run at the exit whatever happened (stop a stream's watchdog, release an unread answer).
    cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def answered(self) -> None:
        o = self.outcome
        o.status, o.http_status = "ok", 200
        o.recorded = True

    def failed(self, error: ApiError, *, refused: bool = False) -> None:
        o = self.outcome
        o.status, o.http_status = "error", error.status
        o.error_code = error.kind.code or error.kind.type
        o.refused = refused
        o.recorded = True

    def left(self) -> None:
        o = self.outcome
        o.status, o.http_status, o.error_code = "aborted", CLIENT_LEFT, ""
        o.recorded = True

    @property
    def tenant(self) -> str:
        """Who asked: the key's tenant ("" before the key is known)."""
        return self.key.tenant if self.key is not None else ""

    @property
    def model(self) -> str:
        """The model that serves (or served) the request: a fallback's, else the one asked for."""
        return self.forwarded.served_model or (self.body.model if self.body is not None else "")

    def audited_usage(self) -> AuditedUsage:
        """The usage to bill: the answering region's figure, checked against what the edge saw; or, from a
        provider that reports none, the edge's own count (no anomaly: nothing was claimed)."""
        relayed, opened = self.relayed, self.forwarded.opened
        from_cache = self.cache.status in ("exact", "semantic")
        if opened is not None and not opened.upstream.reports_usage and not from_cache:
            return AuditedUsage(audit_usage(None, self.bounds, relayed.produced).usage)
        return audit_usage(relayed.usage, self.bounds, relayed.produced)

    @property
    def bounds(self) -> UsageBounds:
        a = self.admission
        assert a is not None
        return UsageBounds(
            a.prompt_ceiling,
            a.prompt_estimate,
            a.completion_tokens,
            self.relayed.events,
            self.relayed.delivered,
        )
