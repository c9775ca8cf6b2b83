"""A stream that survives its region: when a region dies mid-answer, the next one continues the answer from
the text the client already has, so the client sees one unbroken answer after a short pause.

The edge knows what it relayed (every content event's text). It sends the next replica in the route the
same request plus that text, as an open assistant turn (``continue_final_message``, vLLM's name) for chat
or appended to the prompt for completions, with ``max_tokens`` less what was relayed. The new stream's role
event is not sent again. Usage counts every token once: the relayed tokens (one per content event, as the
first region produced them) are taken out of the second region's prompt and added to its completion.

Bounded: at most ``upstream.max_continuations`` per request, all before the request's deadline, only for a
region that failed (closed, broke or stalled; not a region that answered an error), only while the answer
is under ``upstream.continue_max_tokens``; a key's request opts out with ``x-nearshore-continue: off``;
``upstream.continue_streams = false`` turns it off. A stream that stalled before its first token is not
continued but asked again of another replica (nothing reached the client), whatever those settings say.

The continue stage runs after the relay stage, on the stream the relay reported cut: while the stream may be
continued, it opens the next replica's stream (taken on the journey as the first was, :mod:`edge.asking`)
and the stream's owner relays it to the same client; then it ends the stream as the last region left it.
The model's own local replicas come last in its order, then the local stand-in, if the request may have it
(edge/degraded.py).
"""

from __future__ import annotations

import logging

import msgspec

from edge.asking import ask_regions, take
from edge.attempts import Attempts, Refused, Target
from edge.client_route import route_for
from edge.degraded import stand_ins
from edge.fallbacks import targets
from edge.journey import Journey, Reply, ServedPart
from edge.opened import Opened
from edge.region_answer import with_usage
from edge.retry import stall_window
from edge.sse_relay import StreamOutcome
from edge.stream_reply import CutShort, StreamReply
from edge.upstream import Upstream
from geo.route import NoRoute
from nearshore.protocol.errors import UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE, ApiError
from nearshore.protocol.headers import CONTINUE
from nearshore.protocol.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    StreamOptions,
    Usage,
    json_encoder,
)

log = logging.getLogger("nearshore.edge.resume")
_CONTINUABLE = frozenset({UPSTREAM_UNAVAILABLE.code, UPSTREAM_TIMEOUT.code})


async def continue_stage(journey: Journey) -> Reply | None:
    stream = journey.forwarded.stream
    if not isinstance(stream, StreamReply) or stream.cut_short is None:
        return None  # nothing was cut: the relay stage answered
    cut = stream.cut_short
    return await stream.guarded(lambda: _continue(journey, stream, cut))


async def _continue(journey: Journey, stream: StreamReply, cut: CutShort) -> Reply:
    """Other replicas continue the answer while it may be continued; the stream ends as the last left it."""
    state = journey.state
    opened, outcome, failed = cut.opened, cut.outcome, list(cut.tried)
    _note_stall(journey, outcome)
    while may_continue(journey, outcome):
        resumed = await open_continuation(journey, opened, outcome, failed)
        if resumed is None:
            break
        continued = journey.continued
        continued.count += 1
        died = journey.forwarded.region
        served = outcome.content_events - continued.served_tokens  # what the dead region relayed
        continued.parts.append(ServedPart(died, journey.model, max(0, served)))
        take(journey, resumed)
        opened = resumed
        failed.append(resumed.upstream)
        first_events = outcome.content_events
        outcome = await stream.continue_from(resumed)
        _note_stall(journey, outcome)
        combine_usage(outcome, first_events, journey.bounds.prompt_ceiling)
        state.metrics.continued.labels(died, journey.forwarded.region).inc()
    return stream.end(outcome)


def _note_stall(journey: Journey, outcome: StreamOutcome) -> None:
    """A silence that cut the stream once the client had some of it spends the request's stall budget
    (before its first token, the first-byte budget bounds the wait)."""
    if outcome.stalled_s and outcome.content_events:
        journey.continued.stalled_s += outcome.stalled_s


def may_continue(journey: Journey, outcome: StreamOutcome) -> bool:
    up = journey.state.config.upstream
    body, admission, failure = journey.body, journey.admission, outcome.failure
    if (
        failure is None
        or admission is None
        or outcome.expired
        or journey.continued.count >= up.max_continuations
    ):
        return False
    deadline = journey.forwarded.deadline
    if deadline is not None and deadline.passed():
        return False
    if failure.kind.code not in _CONTINUABLE:
        return False  # the region said no (an error event): another would likely say the same
    if outcome.content_events == 0 and not outcome.text:
        return True  # nothing reached the client: another replica answers the request afresh
    if outcome.called or admission.choices > 1:
        return False  # tool calls, or several choices' texts: the relayed text is not one answer to extend
    if not up.continue_streams or journey.request.headers.get(CONTINUE, "").strip().lower() == "off":
        return False
    if outcome.content_events >= min(up.continue_max_tokens, admission.max_tokens):
        return False
    if isinstance(body, CompletionRequest):
        return not body.echo  # an echoed prompt was relayed as content: the text is not all the answer's
    return isinstance(body, ChatCompletionRequest)


def continuation_body(journey: Journey, text: str, remaining: int, model: str = "") -> bytes:
    """The request that continues ``text`` with at most ``remaining`` more tokens (of ``model``, else of the
    model serving)."""
    body = journey.body
    assert body is not None
    if model or journey.forwarded.served_model:
        body = msgspec.structs.replace(body, model=model or journey.forwarded.served_model)
    usage = StreamOptions(include_usage=True)
    if isinstance(body, ChatCompletionRequest):
        messages = list(body.messages)
        if body.continue_final_message:  # the client's own open turn: the relayed text extends it
            last = messages[-1]
            messages[-1] = ChatMessage(role=last.role, content=last.text() + text, name=last.name)
        else:
            messages.append(ChatMessage(role="assistant", content=text))
        continued = msgspec.structs.replace(
            body,
            messages=messages,
            continue_final_message=True,
            max_tokens=remaining,
            max_completion_tokens=None,
            stream_options=usage,
        )
    else:
        assert isinstance(body, CompletionRequest)
        continued = msgspec.structs.replace(
            body, prompt=body.prompt_text() + text, max_tokens=remaining, stream_options=usage
        )
    return json_encoder.encode(continued)


async def open_continuation(
    journey: Journey, failed: Opened, outcome: StreamOutcome, tried: list[Upstream]
) -> Opened | None:
    """Another replica's stream of the rest of the answer, or None when none could take it; ``tried`` are
    the replicas that already failed this stream. When nothing was relayed yet, the request is asked
    afresh (edge/asking.py): the model's other replicas, then its fallbacks."""
    state, call, admission = journey.state, journey.call, journey.admission
    assert call is not None and admission is not None and journey.forwarded.deadline is not None
    up = state.config.upstream
    why = outcome.failure.message if outcome.failure is not None else "?"
    state.pool.failed(failed.upstream, f"mid-stream: {why}", failed.model)
    try:
        if outcome.content_events == 0 and not outcome.text:
            opened: Opened | None = await ask_regions(journey, up.ttft_timeout_s, tried)
        else:
            opened = await _continued(journey, outcome, tried)
    except Refused as refused:
        refused.release()
        log.warning("request %s: the stream's continuation was refused: %s", journey.request_id, refused)
        return None
    except ApiError as exc:
        log.warning("request %s: no region could continue the stream: %s", journey.request_id, exc)
        return None
    if opened is None:
        return None
    if opened.response.content_type != "text/event-stream":
        opened.release()
        return None
    log.warning(
        "request %s: %s failed after %d tokens (%s); %s continues the answer",
        journey.request_id,
        failed.upstream.name,
        outcome.content_events,
        why,
        opened.upstream.name,
    )
    return opened


async def _continued(journey: Journey, outcome: StreamOutcome, tried: list[Upstream]) -> Opened | None:
    """The serving model's next replica, asked to continue the relayed text; after two of its replicas
    failed this stream (the same fault, likely, waits on the next), the later models of the fallback chain
    first; then the local stand-in, when the request may have it (edge/degraded.py: the cable took the
    model's remote regions away). Its head, as its first token, within the stall window: the client is
    mid-answer and waiting."""
    state, admission, deadline = journey.state, journey.admission, journey.forwarded.deadline
    assert journey.call is not None and admission is not None and deadline is not None
    up = state.config.upstream
    serving = journey.forwarded.served_model or journey.model
    remaining = admission.max_tokens - outcome.content_events
    text = "".join(outcome.text)
    chat = isinstance(journey.body, ChatCompletionRequest)  # (a completion's prompt takes the text anywhere)

    def able(u: Upstream) -> bool:
        return u not in tried and (u.continues_answers or not chat)

    def untried(found: list[Target]) -> list[Target]:
        return [
            Target(t.model, kept, continuation_body(journey, text, remaining, t.model), t.why_none)
            for t in found
            if (kept := [u for u in t.upstreams if able(u)]) or t.why_none
        ]

    later = untried(targets(journey, _later_models(journey, serving)))
    local = untried(stand_ins(journey, [journey.model]))
    order = _order(journey)
    own = [u for u in order if able(u)]
    if later and sum(u in order for u in tried) >= 2:
        own = []  # two of the model's replicas failed this stream: its fallbacks take the rest
    if not own and not later and not local:
        return None
    body = continuation_body(journey, text, remaining)
    attempts = Attempts(
        state.pool,
        up,
        state.metrics,
        deadline,
        admission.prompt_estimate,
        choices=admission.choices,
        request_id=journey.request_id,
        rescuing=True,
        tenant=journey.tenant,
    )
    window_s = stall_window(up.stall_timeout_s, up.stall_budget_s, journey.continued.stalled_s)
    try:
        first = Target(serving, own, body, "" if own else "two of its replicas failed this stream")
        return await attempts.open(
            first, lambda: later + local, list, journey.call.path, journey.call.headers, window_s
        )
    finally:
        journey.forwarded.attempts += attempts.made


def _later_models(journey: Journey, serving: str) -> list[str]:
    """The fallback chain's models after the one serving (all of it, while the model asked for serves)."""
    chain = journey.forwarded.chain
    return list(chain[chain.index(serving) + 1 :]) if serving in chain else list(chain)


def _order(journey: Journey) -> list[Upstream]:
    """The serving model's replicas in the router's order (a fallback's own, when one serves)."""
    routed, served = journey.routed, journey.forwarded.served_model
    if not served:
        return journey.state.pool.ordered(routed.route) if not routed.unrouted else []
    try:
        return journey.state.pool.ordered(route_for(journey, served))
    except NoRoute:
        return []


def combine_usage(outcome: StreamOutcome, first_events: int, prompt_ceiling: int) -> None:
    """The second region's usage counts the relayed text as prompt: move it back to the completion."""
    if outcome.usage is None:
        return
    try:
        usage = msgspec.json.decode(outcome.usage, type=Usage)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return  # the audit bills the estimate and what was relayed
    prompt = min(max(0, usage.prompt_tokens - first_events), prompt_ceiling)
    cached = min(usage.prompt_tokens_details.cached_tokens, prompt)
    combined = Usage.of(prompt, max(0, usage.completion_tokens) + first_events, cached)
    outcome.usage = json_encoder.encode(combined)
    if outcome.usage_event is not None:
        outcome.usage_event = with_usage(outcome.usage_event, combined)
