"""The edge's stages in order, and the pipeline they make (see ARCHITECTURE.md, "The journey of one request").

authenticate -> parse (schema, size, model) -> rightsize (a size alias's model) -> admit (budget hold,
RPM/TPM reservation; from here the request is billed) -> cut (whether the model's remote regions are all
out, and the degraded tier's policy for it) -> cache (an exact hit answers; a semantic lookup is handed on
to race the region) -> route (geo: the replicas in failover order) -> gate (a slot in the pool,
by tier) -> forward (choose and open the upstream, failover before the first byte, racing the lookup) ->
relay (the answer to the client; a stream its region cut is reported) -> continue (another region
continues a cut stream). The pipeline's exit then settles the bill (:mod:`edge.settle`).
"""

from __future__ import annotations

from edge.admission import admit, authenticate, check_request, read_body
from edge.cache_stage import cache_stage
from edge.call_body import region_body
from edge.degraded import cut_stage
from edge.forward import forward
from edge.gate_stage import gate_stage
from edge.journey import Call, Journey, Reply
from edge.keys import share_key
from edge.limits import rate_limit_headers
from edge.pipeline import Pipeline, Stage
from edge.relay import relay
from edge.resume import continue_stage
from edge.rightsize_stage import rightsize_stage
from edge.routing import route_stage
from nearshore.protocol import trace
from nearshore.protocol.headers import CLIENT_REQUEST_ID, MODEL, REQUEST_ID, SHARE_KEY
from nearshore.protocol.schemas import (
    CompletionRequest,
    chat_request_decoder,
    completion_request_decoder,
    embedding_request_decoder,
)

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}
DECODERS = {
    "chat": chat_request_decoder,
    "completions": completion_request_decoder,
    "embeddings": embedding_request_decoder,
}


async def authenticate_stage(journey: Journey) -> Reply | None:
    journey.key = authenticate(journey.request, journey.state)
    return None


async def parse_stage(journey: Journey) -> Reply | None:
    assert journey.key is not None
    journey.body = await read_body(journey.request, journey.state, DECODERS[journey.kind])
    check_request(journey.state, journey.key, journey.body)
    return None


async def admit_stage(journey: Journey) -> Reply | None:
    state, key, body = journey.state, journey.key, journey.body
    assert key is not None and body is not None
    journey.admission = await admit(state, key, body)
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


def default_pipeline() -> Pipeline:
    return Pipeline(
        [
            Stage("authenticate", authenticate_stage),
            Stage("parse", parse_stage),
            Stage("rightsize", rightsize_stage),
            Stage("admit", admit_stage),
            Stage("cut", cut_stage),
            Stage("cache", cache_stage),
            Stage("route", route_stage),
            Stage("gate", gate_stage),
            Stage("forward", forward, races=True),
            Stage("relay", relay),
            Stage("continue", continue_stage),
        ]
    )
