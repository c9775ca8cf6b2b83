"""One admitted request's record as it moves through the edge, and its one exit: settle, bill, count.

Whatever happens to a request after admission (answered, refused by the region, failed by a region that broke
a rule, left by its client), the handler records the outcome on its :class:`Journey` and calls
:func:`close_journey` exactly once: the usage is audited, the TPM reservation and the budget hold are settled
to it, one ledger row is committed and the metrics are counted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

from edge.budget import Hold
from edge.keys import ApiKey
from edge.ledger import UsageRecord
from edge.limits import Decision
from edge.state import EdgeState
from edge.usage_audit import AuditedUsage, UsageBounds, audit_usage
from nearshore.protocol.errors import ApiError

log = logging.getLogger("nearshore.edge")

Status = Literal["ok", "error", "aborted"]
CLIENT_LEFT = 499  # nginx's code for a client that closed the connection before the answer


@dataclass(frozen=True, slots=True)
class Admission:
    """What admission decided and reserved for a request."""

    decision: Decision
    hold: Hold | None
    prompt_ceiling: int  # the most tokens its prompt can be
    prompt_estimate: int  # what its prompt is billed at if no usage comes back
    max_tokens: int  # the completion tokens it may produce (and reserved)


@dataclass(slots=True)
class Journey:
    kind: Literal["chat", "completions"]
    request_id: str
    client_request_id: str
    key: ApiKey
    model: str
    started: float
    admission: Admission
    region: str = ""
    # The outcome, as the handler records it; until then the request counts as left by its client.
    status: Status = "aborted"
    http_status: int = CLIENT_LEFT
    error_code: str = ""
    usage: bytes | None = None  # the region's usage JSON, unchecked
    produced: bool = False  # an answer, or a streamed token, came back
    relayed_events: int | None = None  # streams: content events that reached the client
    refused: bool = False  # the region refused the request itself (a 4xx)
    recorded: bool = False  # an outcome was recorded
    closed: bool = False

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
    def bounds(self) -> UsageBounds:
        a = self.admission
        return UsageBounds(a.prompt_ceiling, a.prompt_estimate, a.max_tokens, self.relayed_events)


async def close_journey(state: EdgeState, journey: Journey) -> AuditedUsage | None:
    """Settle and bill the request once; later calls do nothing (and return None)."""
    if journey.closed:
        return None
    journey.closed = True
    audited = audit_usage(journey.usage, journey.bounds, journey.produced)
    usage = audited.usage
    if audited.anomalies:
        _report_anomalies(state, journey, audited)
    cached = usage.prompt_tokens_details.cached_tokens
    cost = state.prices.cost(journey.model, usage.prompt_tokens, cached, usage.completion_tokens)
    # A prompt the region refused (too long, ...) still cost it work: it keeps its share of the TPM window.
    tpm_tokens = journey.admission.prompt_estimate if journey.refused else usage.total_tokens
    reservation = journey.admission.decision.reservation
    if reservation is not None:
        state.in_background(_settle_limit(state, journey, reservation, tpm_tokens))
    state.budget.settle(journey.admission.hold, journey.key.key_id, cost)
    record = UsageRecord(
        request_id=journey.request_id,
        ts=time.time(),
        key_id=journey.key.key_id,
        tenant=journey.key.tenant,
        model=journey.model,
        region=journey.region,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=cached,
        completion_tokens=usage.completion_tokens,
        cache_status="bypass",
        cost_usd=cost,
        status=journey.status,
        http_status=journey.http_status,
        client_request_id=journey.client_request_id,
        error_code=journey.error_code,
    )
    try:
        await state.ledger.record(record)
    except Exception:
        state.metrics.ledger_errors.inc()
        log.exception("usage record %s could not be written", journey.request_id)
    m = state.metrics
    m.requests.labels(journey.status, journey.region or "none").inc()
    if journey.error_code and journey.status == "error" and not journey.refused:
        m.upstream_errors.labels(journey.error_code, journey.region or "none").inc()
    m.prompt_tokens.labels(journey.model).inc(usage.prompt_tokens)
    m.cached_tokens.labels(journey.model).inc(cached)
    m.generation_tokens.labels(journey.model).inc(usage.completion_tokens)
    m.add_cost(journey.model, journey.key.tenant, cost)
    return audited


def _report_anomalies(state: EdgeState, journey: Journey, audited: AuditedUsage) -> None:
    region = journey.region or "none"
    for kind in audited.anomalies:
        state.metrics.usage_anomalies.labels(kind, region).inc()
    reported = (journey.usage or b"")[:300]
    log.warning(
        "request %s: region %s reported usage %r (%s); billed prompt=%d completion=%d",
        journey.request_id,
        region,
        reported,
        ", ".join(audited.anomalies),
        audited.usage.prompt_tokens,
        audited.usage.completion_tokens,
    )


async def _settle_limit(state: EdgeState, journey: Journey, reservation: str, tokens: int) -> None:
    try:
        await state.limiter.settle(journey.key.key_id, reservation, tokens)
    except Exception:  # a failed refund only makes the limit stricter for a minute
        log.warning("could not settle the reservation of %s", journey.request_id, exc_info=True)
