"""A stream that survives its region: when a region dies mid-answer, the next one continues the answer from
the text the client already has, so the client sees one unbroken answer after a short pause.

The edge knows what it relayed (every content event's text). It sends the next replica in the route the
same request plus that text, as an open assistant turn (``continue_final_message``, vLLM's name) for chat
or appended to the prompt for completions, with ``max_tokens`` less what was relayed. The new stream's role
event is not sent again. Usage counts every token once: the relayed tokens (one per content event, as the
first region produced them) are taken out of the second region's prompt and added to its completion.

Bounded: one continuation per request, only for a region that failed (closed, broke or stalled; not a
region that answered an error), only while the answer is under ``upstream.continue_max_tokens``; a key's
request opts out with ``x-nearshore-continue: off``; ``upstream.continue_streams = false`` turns it off.
"""

from __future__ import annotations

import logging

import msgspec

from edge.answer import with_usage
from edge.journey import Journey
from edge.relay import Opened, StreamOutcome, open_upstream
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


def may_continue(journey: Journey, outcome: StreamOutcome) -> bool:
    up = journey.state.config.upstream
    body, admission, failure = journey.body, journey.admission, outcome.failure
    if not up.continue_streams or journey.continued_from or failure is None or admission is None:
        return False
    if failure.kind.code not in _CONTINUABLE:
        return False  # the region said no (an error event): another would likely say the same
    if journey.request.headers.get(CONTINUE, "").strip().lower() == "off":
        return False
    if outcome.content_events >= min(up.continue_max_tokens, admission.max_tokens):
        return False
    if isinstance(body, CompletionRequest):
        return not body.echo  # an echoed prompt was relayed as content: the text is not all the answer's
    return isinstance(body, ChatCompletionRequest)


def continuation_body(journey: Journey, text: str, remaining: int) -> bytes:
    """The request that continues ``text`` with at most ``remaining`` more tokens."""
    body = journey.body
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
    journey: Journey, failed: Opened, outcome: StreamOutcome, first_byte_timeout_s: float
) -> Opened | None:
    """The next replica's stream of the rest of the answer, or None when none could take it."""
    state, call, admission = journey.state, journey.call, journey.admission
    assert call is not None and admission is not None
    why = outcome.failure.message if outcome.failure is not None else "?"
    state.pool.failed(failed.upstream, f"mid-stream: {why}")
    order = [u for u in state.pool.ordered(journey.route) if u is not failed.upstream]
    if not order:
        return None
    remaining = admission.max_tokens - outcome.content_events
    body = continuation_body(journey, "".join(outcome.text), remaining)
    try:
        opened = await open_upstream(
            state.pool, order, call.path, body, call.headers, state.metrics, first_byte_timeout_s
        )
    except ApiError as exc:
        log.warning("request %s: no region could continue the stream: %s", journey.request_id, exc)
        return None
    if opened.response.status != 200 or opened.response.content_type != "text/event-stream":
        opened.response.close()
        opened.upstream.replica.inflight -= 1
        return None
    log.warning(
        "request %s: %s died after %d tokens (%s); %s continues the answer",
        journey.request_id,
        failed.upstream.name,
        outcome.content_events,
        why,
        opened.upstream.name,
    )
    return opened


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
