"""The admit stage: the budget hold and the RPM/TPM reservation (edge/admission.py); from here the request
is billed. It also fixes what goes to the region (:class:`~edge.journey.Call`: the validated body, the ids,
the trace, the share key) and the headers every answer to the client carries."""

from __future__ import annotations

from edge.admission import admit
from edge.call_body import region_body
from edge.journey import Call, Journey, Reply
from edge.keys import share_key
from edge.limits import rate_limit_headers
from nearshore.protocol import trace
from nearshore.protocol.headers import CLIENT_REQUEST_ID, MODEL, REQUEST_ID, SHARE_KEY
from nearshore.protocol.schemas import CompletionRequest

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}


async def admit_stage(journey: Journey) -> Reply | None:
    state, key, body = journey.state, journey.key, journey.body
    assert key is not None and body is not None
    journey.admission = await admit(state, key, body, journey.prompt_count)
    # Ids go on every answer, also on a stream whose head is sent before the middleware sees it.
    client_headers = {**rate_limit_headers(journey.admission.decision), REQUEST_ID: journey.request_id}
    if journey.client_request_id:
        client_headers[CLIENT_REQUEST_ID] = journey.client_request_id
    if journey.sizing.chosen_model:
        client_headers[MODEL] = journey.sizing.chosen_model
    trace_headers: dict[str, str] = {}
    if journey.trace is not None:  # the region's parent is the edge's span; the client learns the trace
        trace_headers = trace.forward_headers(journey.trace, journey.span_id)
        client_headers[trace.TRACERESPONSE] = trace.traceparent(journey.trace, journey.span_id)
    journey.call = Call(
        path=PATHS[journey.kind],
        body=region_body(body, journey.admission.max_tokens),  # what was validated is what leaves
        headers={
            "Content-Type": "application/json",
            REQUEST_ID: journey.request_id,
            SHARE_KEY: share_key(key.key_id),  # the region shares its queue fairly by it
            **trace_headers,
            **state.pool.headers,
        },
        client_headers=client_headers,
        echo=isinstance(body, CompletionRequest) and body.echo,
        keep_usage=body.wants_usage_chunk(),
    )
    return None
