"""Usage as a region reports it is a claim, not a fact: check it against what the edge knows, bill what holds.

What the edge knows of one request: the most tokens its prompt can be (the byte ceiling of
:mod:`edge.token_count`), an estimate of them, the ``max_tokens`` it allowed, and what reached the client:
for a stream, how many content events it relayed (each carries at least one token); for a unary answer,
its text counted by the edge's token counter, and the fewest tokens that text can be. A reported figure
outside those bounds is an *anomaly*: it is named, counted in a metric and logged by the caller, and the
defensible figure is billed instead, for the completion what was delivered. Nothing here raises: a lying
region never fails the user's request.
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
class Delivered:
    """A unary answer's text as the client got it, in completion tokens."""

    tokens: int  # as the edge's token counter makes of it: billed when the region's figure is a lie
    floor: int  # the fewest it can be (no token spells more than a tokenizer's longest): fewer is a lie


@dataclass(frozen=True, slots=True)
class UsageBounds:
    prompt_ceiling: int
    prompt_estimate: int
    max_tokens: int
    relayed_events: int | None = None  # content events relayed to the client (streams only)
    delivered: Delivered | None = None  # the text returned to the client (unary answers only)


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
    if raw is None:
        # A stream cut short has no usage; a whole unary answer without one is the region's fault.
        missing = ["missing"] if bounds.delivered is not None else []
        return AuditedUsage(_unreported(bounds, produced), missing)
    try:
        reported = _reported.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return AuditedUsage(_unreported(bounds, produced), ["malformed"])
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


def _unreported(bounds: UsageBounds, produced: bool) -> Usage:
    """The bill without a usable figure: the prompt's estimate (once anything was produced) and what
    was delivered."""
    prompt = min(bounds.prompt_estimate, bounds.prompt_ceiling) if produced or bounds.relayed_events else 0
    return Usage.of(prompt, _delivered(bounds))


def _delivered(bounds: UsageBounds) -> int:
    """The completion tokens the client got, as far as the edge can tell (at most max_tokens)."""
    if bounds.delivered is not None:
        return min(bounds.delivered.tokens, bounds.max_tokens)
    return min(bounds.relayed_events or 0, bounds.max_tokens)


def _prompt(reported: int, bounds: UsageBounds, anomalies: list[str]) -> int:
    if reported < 0:
        anomalies.append("negative_prompt")
        return min(bounds.prompt_estimate, bounds.prompt_ceiling)
    if reported > bounds.prompt_ceiling:
        anomalies.append("prompt_over_ceiling")
        return bounds.prompt_ceiling
    return reported


def _completion(reported: int, bounds: UsageBounds, anomalies: list[str]) -> int:
    relayed, delivered = bounds.relayed_events, bounds.delivered
    cap = bounds.max_tokens + STOP_TOKEN_SLACK
    if reported < 0:
        anomalies.append("negative_completion")
        return _delivered(bounds)
    if reported > cap:
        anomalies.append("completion_over_max_tokens")
        # What reached the user, when the edge knows it; else the answer can have had max_tokens.
        known = relayed is not None or delivered is not None
        return _delivered(bounds) if known else bounds.max_tokens
    if relayed is not None and reported < relayed:
        anomalies.append("completion_under_relayed")
        return _delivered(bounds)
    if delivered is not None and reported < delivered.floor:
        anomalies.append("completion_under_delivered")
        return _delivered(bounds)
    return reported
