"""The settle stage, the journey's last: its one bill. Audit the usage, settle the reservation and the budget
hold, write the ledger row, count the metrics; once per admitted request, at the pipeline's exit
(:mod:`edge.pipeline`), whatever ended it. The answer's last bytes go after it (``journey.settled``).
"""

from __future__ import annotations

import logging
import time

from edge.admission import count_refused
from edge.degraded_policy import REASON
from edge.journey import CLIENT_LEFT, Journey
from edge.ledger import UsageRecord
from edge.metric_labels import error_code_label, model_label
from edge.usage_audit import AuditedUsage
from nearshore.protocol.schemas import ChatCompletionRequest, CompletionRequest, Usage

log = logging.getLogger("nearshore.edge")


async def settle_stage(journey: Journey) -> None:
    journey.settled = await settle_journey(journey)


async def settle_journey(journey: Journey) -> AuditedUsage | None:
    """Bill the request once; a request refused before admission reserved nothing and has no row (one
    refused as the client's mistake still counts against its key's RPM)."""
    admission, outcome = journey.admission, journey.outcome
    if journey.billed is not None or journey.key is None:
        return None
    if admission is None:
        if _clients_mistake(outcome.http_status) and outcome.recorded:
            counting = count_refused(journey.state, journey.key)
            if journey.state.limiter.settles_in_memory:
                await counting  # never suspends
            else:
                journey.state.in_background(counting)  # a round trip to Redis: not before the answer
        return None
    state, key, forwarded = journey.state, journey.key, journey.forwarded
    model = journey.model  # priced as the model that served (a fallback's price, when one did)
    audited = journey.audited_usage()
    usage = journey.billed = audited.usage  # (before any wait: the request is billed once)
    if audited.anomalies:
        _report_anomalies(journey, audited)
    cached = usage.prompt_tokens_details.cached_tokens
    body = journey.body
    cost = _cost(journey, usage)
    if journey.cache.status in ("exact", "semantic"):
        cost *= state.config.cache.price_factor  # an answer that never crossed the ocean
    # A prompt the region refused (too long, ...) still cost it work: it keeps its share of the TPM window.
    tpm_tokens = admission.prompt_estimate if outcome.refused else usage.total_tokens
    if admission.decision.reservation is not None:
        settling = _settle_limit(journey, admission.decision.reservation, tpm_tokens)
        if state.limiter.settles_in_memory:
            await settling  # never suspends: a task of its own would cost more than the refund
        else:
            state.in_background(settling)  # a round trip to Redis: not before the answer's end
    await state.budget.settle(admission.hold, key.key_id, cost)
    record = UsageRecord(
        request_id=journey.request_id,
        ts=time.time(),
        key_id=key.key_id,
        tenant=key.tenant,
        model=model,
        region=forwarded.region,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=cached,
        completion_tokens=usage.completion_tokens,
        cache_status=journey.cache.status,
        cost_usd=cost,
        status=outcome.status,
        http_status=outcome.http_status,
        client_request_id=journey.client_request_id,
        error_code=outcome.error_code,
        continued_from=journey.continued.from_region,
        served_by=_served_by(journey, usage.completion_tokens),
        fallback_from=journey.body.model if forwarded.served_model and journey.body is not None else "",
        attempts=forwarded.attempts,
        bad_events=journey.relayed.bad_events,
        output=body.output_shape() if isinstance(body, ChatCompletionRequest | CompletionRequest) else "",
        choices=body.n if isinstance(body, ChatCompletionRequest | CompletionRequest) else 1,
        degraded=REASON if journey.cut.by else "",
    )
    try:
        await state.ledger.record(record)
    except Exception:
        state.metrics.ledger_errors.inc()
        log.exception("usage record %s could not be written", journey.request_id)
    m = state.metrics
    region = forwarded.region or "none"
    # A region's error code and (defensively) the model name come from outside: a fixed set of labels.
    m.count_request(outcome.status, region, model_label(model, state.config.models), key.tenant, usage, cost)
    if outcome.error_code and outcome.status == "error" and not (outcome.refused or outcome.stopped):
        m.upstream_errors.labels(error_code_label(outcome.error_code), region).inc()
    if journey.cut.by:
        m.degraded.labels(REASON, journey.cut.by).inc()
    return audited


def _report_anomalies(journey: Journey, audited: AuditedUsage) -> None:
    region = journey.forwarded.region or "none"
    for kind in audited.anomalies:
        journey.state.metrics.usage_anomalies.labels(kind, region).inc()
    reported = (journey.relayed.usage or b"")[:300]
    log.warning(
        "request %s: region %s reported usage %r (%s); billed prompt=%d completion=%d",
        journey.request_id,
        region,
        reported,
        ", ".join(audited.anomalies),
        audited.usage.prompt_tokens,
        audited.usage.completion_tokens,
    )


def _clients_mistake(http_status: int) -> bool:
    """A refusal the client caused (a bad body, an unknown model, a key not allowed it): not a missing
    key (401), not a rate limit (429: counting it would push the retry it was told further off), not the
    edge's own trouble (5xx)."""
    return 400 <= http_status < 500 and http_status not in (401, 429, CLIENT_LEFT)


def _cost(journey: Journey, usage: Usage) -> float:
    """USD for the request: at its region's price; a continued answer's prompt at the first region's, and
    each part of its completion at the price of the region (and model) that served it."""
    prices, forwarded, parts = journey.state.prices, journey.forwarded, journey.continued.parts
    cached = usage.prompt_tokens_details.cached_tokens
    if not parts:
        return prices.cost(
            journey.model, usage.prompt_tokens, cached, usage.completion_tokens, forwarded.region
        )
    cost = prices.cost(parts[0].model, usage.prompt_tokens, cached, 0, parts[0].region)
    for part, tokens in zip(parts, _part_tokens(journey, usage.completion_tokens), strict=False):
        cost += prices.cost(part.model, 0, 0, tokens, part.region)
    last = max(0, usage.completion_tokens - journey.continued.served_tokens)
    return cost + prices.cost(journey.model, 0, 0, last, forwarded.region)


def _part_tokens(journey: Journey, completion_tokens: int) -> list[int]:
    """Each dead region's part, as many of the billed completion tokens as there are (never more)."""
    left, tokens = completion_tokens, []
    for part in journey.continued.parts:
        tokens.append(min(part.tokens, left))
        left -= tokens[-1]
    return tokens


def _served_by(journey: Journey, completion_tokens: int) -> str:
    """ "a:6,b:14": who served which part of a continued answer (the last its remaining tokens); ""."""
    parts = journey.continued.parts
    if not parts:
        return ""
    counts = _part_tokens(journey, completion_tokens)
    served = [f"{p.region}:{n}" for p, n in zip(parts, counts, strict=True)]
    return ",".join([*served, f"{journey.forwarded.region}:{completion_tokens - sum(counts)}"])


async def _settle_limit(journey: Journey, reservation: str, tokens: int) -> None:
    try:
        assert journey.key is not None
        await journey.state.limiter.settle(journey.key.key_id, reservation, tokens)
    except Exception:  # a failed refund only makes the limit stricter for a minute
        log.warning("could not settle the reservation of %s", journey.request_id, exc_info=True)
