"""One request's record as it moves through the edge's stages (:mod:`edge.pipeline`).

Stages fill it in (who asked, what, what was reserved, which region answered) and record the outcome on it;
the pipeline's one exit bills from it (:mod:`edge.settle`). Values flow through it as fields, never through
module-level context.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from aiohttp import web

from edge.budget import Hold
from edge.keys import ApiKey
from edge.limits import Decision
from edge.relay import Opened
from edge.retry import Deadline
from edge.state import EdgeState
from edge.usage_audit import AuditedUsage, Delivered, UsageBounds
from geo.route import Route
from nearshore.protocol.errors import ApiError
from nearshore.protocol.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, Usage
from nearshore.protocol.trace import TraceContext

Kind = Literal["chat", "completions", "embeddings"]
Status = Literal["ok", "error", "aborted"]
Body = ChatCompletionRequest | CompletionRequest | EmbeddingRequest
CLIENT_LEFT = 499  # nginx's code for a client that closed the connection before the answer


@dataclass(frozen=True, slots=True)
class Admission:
    """What admission decided and reserved for a request; from then on it is billed."""

    decision: Decision
    hold: Hold | None
    prompt_ceiling: int  # the most tokens its prompt can be
    prompt_estimate: int  # what its prompt is billed at if no usage comes back
    max_tokens: int  # the completion tokens it may produce (and reserved)


@dataclass(frozen=True, slots=True)
class Call:
    """What goes to the region, and the headers every answer to the client carries."""

    path: str
    body: bytes
    headers: dict[str, str]
    client_headers: dict[str, str]
    echo: bool = False  # /v1/completions with echo: the first streamed text is the prompt
    keep_usage: bool = False  # the client asked for the usage chunk


class Reply(Protocol):
    """What a stage hands back to end the journey: its ``finish`` sends the answer's last part once the
    request is billed (a unary body, or a stream's usage chunk, error event and ``[DONE]``)."""

    async def finish(self, audited: AuditedUsage | None) -> web.StreamResponse: ...


class Preempting(Reply, Protocol):
    """A reply that raced the region's answer; ``won`` records it on the journey once it wins, and says
    whether it takes the region's request in hand (an audit lets it finish in the background), else the
    request is cancelled."""

    def won(self, upstream: asyncio.Future[Opened]) -> bool: ...


@dataclass(slots=True, eq=False)
class Journey:
    request: web.Request
    state: EdgeState
    kind: Kind
    started: float  # perf_counter at arrival
    request_id: str  # the edge's own, unique
    client_request_id: str = ""
    trace: TraceContext | None = None  # the caller's W3C trace (or one the edge started)
    span_id: str = ""  # the edge's span: the parent id the region receives
    key: ApiKey | None = None
    body: Body | None = None
    admission: Admission | None = None
    call: Call | None = None
    route: Route | None = None  # the router's order (no route stage: every routable replica, config order)
    unrouted: str = ""  # why no replica may serve the model asked for (its fallbacks may)
    route_s: float = 0.0  # the route stage's time (Server-Timing route;dur)
    queue_s: float = 0.0  # waited for a slot in the pool (Server-Timing edge-queue;dur)
    opened: Opened | None = None  # the region's answer, once its head arrived
    stream: Reply | None = None  # a stream's client side, from the forward stage on
    region: str = ""
    chosen_model: str = ""  # a size alias's choice, for x-nearshore-model
    other_size: str = ""  # the alias's other model: its fallback when no chain is configured
    # A stage may race the region: if this task ends first with a reply, the region's request is cancelled
    # and that reply answers (the response cache's semantic lookup).
    preempt: asyncio.Task[Preempting | None] | None = None
    cache_status: str = "bypass"  # "miss" | "exact" | "semantic" | "bypass" (the ledger's cache_status)
    cache_s: float = 0.0  # the cache lookup's time (Server-Timing cache;dur)
    # The answer as the region gave it (its text and how it ended), for the response cache.
    answer_text: str = ""
    finish_reason: str = ""
    continued_from: str = ""  # the region that died mid-answer, when another finished the stream
    continuations: int = 0  # streams: how many times another replica took the answer over
    deadline: Deadline | None = None  # when the whole request must be done (upstream.request_deadline_s)
    served_model: str = ""  # the model that answered, when a fallback did (else the body's)
    attempts: int = 0  # requests sent to regions for it (failover, retries, fallbacks, continuations)
    bad_events: int = 0  # stream events from a region that did not parse (skipped)
    # The outcome, as the stages record it; until then the request counts as left by its client.
    status: Status = "aborted"
    http_status: int = CLIENT_LEFT
    error_code: str = ""
    usage: bytes | None = None  # the region's usage JSON, unchecked
    billed: Usage | None = None  # the usage as settled (checked), for the request's log line
    produced: bool = False  # an answer, or a streamed token, came back
    relayed_events: int | None = None  # streams: content events that reached the client
    delivered: Delivered | None = None  # unary answers: the text that reached the client, in tokens
    refused: bool = False  # the region refused the request itself (a 4xx)
    recorded: bool = False  # an outcome was recorded
    settled: bool = False
    # Run at the exit whatever happened (stop a stream's watchdog, release an unread answer).
    cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def answered(self, usage: bytes | None) -> None:
        self.status, self.http_status, self.usage, self.produced = "ok", 200, usage, True
        self.recorded = True

    def failed(self, error: ApiError, *, refused: bool = False) -> None:
        self.status, self.http_status = "error", error.status
        self.error_code = error.kind.code or error.kind.type
        self.refused = refused
        self.recorded = True

    def left(self) -> None:
        self.status, self.http_status, self.error_code = "aborted", CLIENT_LEFT, ""
        self.recorded = True

    @property
    def model(self) -> str:
        """The model that serves (or served) the request: a fallback's, else the one asked for."""
        return self.served_model or (self.body.model if self.body is not None else "")

    @property
    def bounds(self) -> UsageBounds:
        a = self.admission
        assert a is not None
        return UsageBounds(
            a.prompt_ceiling, a.prompt_estimate, a.max_tokens, self.relayed_events, self.delivered
        )
