"""Usage as a region reports it is a claim, not a fact: check it against what the edge knows, bill what holds.

What the edge knows of one request: the most tokens its prompt can be (the byte ceiling of
:mod:`edge.token_count`), an estimate of them, the ``max_tokens`` it allowed, and, for a stream, how many
content events it relayed (each carries at least one token). A reported figure outside those bounds is an
*anomaly*: it is named, counted in a metric and logged by the caller, and the defensible figure is billed
instead. Nothing here raises: a lying region never fails the user's request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from nearshore.protocol.schemas import Usage

# The stop token counts as a completion token in some servers' usage but never reaches the text.
STOP_TOKEN_SLACK = 1


class _Details(msgspec.Struct):
    cached_tokens: int = 0


class _ReportedUsage(msgspec.Struct):
    # Plain ints: msgspec accepts any size and sign here, so every lie is seen and judged below.
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


_reported = msgspec.json.Decoder(_ReportedUsage)


@dataclass(frozen=True, slots=True)
class UsageBounds:
    prompt_ceiling: int
    prompt_estimate: int
    max_tokens: int
    relayed_events: int | None = None  # content events relayed to the client (streams only)


@dataclass(slots=True)
class AuditedUsage:
    usage: Usage
    anomalies: list[str] = field(default_factory=list)
    reported: bool = False  # the region sent a usage figure (possibly wrong)


def audit_usage(raw: bytes | None, bounds: UsageBounds, produced: bool) -> AuditedUsage:
    """The usage to bill for ``raw`` (the region's ``usage`` JSON, or None when none came).

    ``produced``: whether the request got as far as generating (a stream relayed a token, or a unary
    answer arrived); with no usage reported, the prompt is billed only then.
    """
    relayed = bounds.relayed_events or 0
    if raw is None:
        prompt = min(bounds.prompt_estimate, bounds.prompt_ceiling) if produced or relayed else 0
        return AuditedUsage(Usage.of(prompt, min(relayed, bounds.max_tokens)))
    try:
        reported = _reported.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        audited = audit_usage(None, bounds, produced)
        audited.anomalies.append("malformed")
        return audited
    anomalies: list[str] = []
    prompt = _prompt(reported.prompt_tokens, bounds, anomalies)
    completion = _completion(reported.completion_tokens, bounds, anomalies)
    cached = reported.prompt_tokens_details.cached_tokens if reported.prompt_tokens_details else 0
    if cached < 0 or cached > prompt:
        anomalies.append("cached_out_of_range")
        cached = min(max(cached, 0), prompt)
    total = reported.total_tokens
    if total is not None and total != reported.prompt_tokens + reported.completion_tokens:
        anomalies.append("total_mismatch")
    return AuditedUsage(Usage.of(prompt, completion, cached), anomalies, reported=True)


def _prompt(reported: int, bounds: UsageBounds, anomalies: list[str]) -> int:
    if reported < 0:
        anomalies.append("negative_prompt")
        return min(bounds.prompt_estimate, bounds.prompt_ceiling)
    if reported > bounds.prompt_ceiling:
        anomalies.append("prompt_over_ceiling")
        return bounds.prompt_ceiling
    return reported


def _completion(reported: int, bounds: UsageBounds, anomalies: list[str]) -> int:
    relayed = bounds.relayed_events
    cap = bounds.max_tokens + STOP_TOKEN_SLACK
    if reported < 0:
        anomalies.append("negative_completion")
        return min(relayed or 0, bounds.max_tokens)
    if reported > cap:
        anomalies.append("completion_over_max_tokens")
        # A stream's relayed events are what the user provably got; a unary answer can have had max_tokens.
        return min(relayed, bounds.max_tokens) if relayed is not None else bounds.max_tokens
    if relayed is not None and reported < relayed:
        anomalies.append("completion_under_relayed")
        return min(relayed, bounds.max_tokens)
    return reported
