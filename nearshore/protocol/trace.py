"""W3C Trace Context (https://www.w3.org/TR/trace-context/): the ``traceparent`` and ``tracestate`` headers.

The edge joins a caller's trace when its ``traceparent`` is well formed, or starts a new trace when there is
none or it is malformed (a malformed one is never forwarded as it came, and its ``tracestate`` is dropped
with it, as the specification says). The edge is one span: it forwards ``traceparent`` to the region with
its own span id as the parent id, so a user's tracing system can join the edge's and the region's log lines.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# W3C Trace Context Level 2's response header: the trace (and the edge's span) a response belongs to.
TRACERESPONSE = "traceresponse"

# version "-" trace-id "-" parent-id "-" flags, lowercase hex. A future version may append fields after
# a "-"; version 00 must be exactly 55 characters.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
MAX_TRACESTATE_CHARS = 512  # the specification's limit for a vendor list a proxy must pass on
# tracestate list members: printable ASCII without "=" in keys, "," between members; be strict about
# anything else (no control characters, nothing that could split a header or a log line).
_TRACESTATE = re.compile(r"^[\x20-\x7e]*$")
SAMPLED = "01"


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: str  # 32 hex: the whole trace
    parent_id: str  # 16 hex: the caller's span ("" when this process started the trace)
    flags: str  # 2 hex: bit 0 is "sampled"
    state: str = ""  # the vendors' tracestate, passed on unchanged
    joined: bool = False  # the caller's traceparent was valid (else a new trace was started)


def new_span_id() -> str:
    return os.urandom(8).hex()


def parse_traceparent(value: str) -> TraceContext | None:
    """The context a well-formed ``traceparent`` carries, or None (malformed, version ff, zero ids)."""
    match = _TRACEPARENT.match(value.strip())
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    if version == "00" and rest is not None:  # version 00 has exactly four fields
        return None
    return TraceContext(trace_id, parent_id, flags, joined=True)


def _tracestate(value: str) -> str:
    value = value.strip()
    if len(value) > MAX_TRACESTATE_CHARS or not _TRACESTATE.match(value):
        return ""
    return value


def incoming(headers: Mapping[str, str]) -> TraceContext:
    """The caller's trace when its ``traceparent`` is valid, else a new one (sampled, no state)."""
    given = headers.get(TRACEPARENT)
    context = parse_traceparent(given) if given else None
    if context is None:
        return TraceContext(os.urandom(16).hex(), "", SAMPLED)
    state = _tracestate(headers.get(TRACESTATE, ""))
    return TraceContext(context.trace_id, context.parent_id, context.flags, state, joined=True)


def traceparent(context: TraceContext, span_id: str) -> str:
    """The header a child of span ``span_id`` receives (always version 00: the one this code speaks)."""
    return f"00-{context.trace_id}-{span_id}-{context.flags}"


def forward_headers(context: TraceContext, span_id: str) -> dict[str, str]:
    headers = {TRACEPARENT: traceparent(context, span_id)}
    if context.state:
        headers[TRACESTATE] = context.state
    return headers
