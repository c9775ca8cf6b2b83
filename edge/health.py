"""What the edge's ``/health`` says: to anyone, up or degraded and why in one word; to the operator, details.

The public listener's answer is what a load balancer probes, so it names no file, region, error text or
setting: ``{"status": "ok" | "degraded", "reason": "<one word>"}``. The operator's listener (loopback by
default) keeps everything an operator reads there: each region's state, the limiter, the cache and its
audit, the ledger, and every reason at once.

Degraded means one of :func:`readiness`'s reasons holds. Some refuse requests (the limiter is down in
fail-closed mode, the ledger takes no new rows, the key store out of reach past keys.offline_grace_s): the
edge answers them with 503, so its public health does too and a load balancer sends the traffic to another
edge. Others leave the edge serving (the key store out of reach within its grace: known keys still served;
the ledger spooling to its side file, no region routable: the cache still answers; only local regions
routable: a cable cut, edge/degraded.py; every routable replica cooling after a Retry-After): health says
so, with 200. A cache that is off or bypassed is not degraded for serving (the edge still answers every
request) and shows in the details only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from cache.audit_judge import NEVER
from edge.state import EdgeState

# What load balancers take for "send me no traffic" (AWS ALB, GCP, Envoy, HAProxy, Kubernetes readiness):
# anything outside 2xx; 503 says the cause is temporary.
DEGRADED_REFUSING_STATUS = 503


@dataclass(frozen=True, slots=True)
class Readiness:
    """Why the edge is degraded, one word a reason, those that refuse requests first; empty when ok."""

    reasons: tuple[str, ...] = ()
    refusing: bool = False  # the edge answers (nearly) every request with 503

    @property
    def status(self) -> Literal["ok", "degraded"]:
        return "degraded" if self.reasons else "ok"

    @property
    def http_status(self) -> int:
        return DEGRADED_REFUSING_STATUS if self.refusing else 200


def readiness(state: EdgeState, now: float) -> Readiness:
    """Every reason the edge is degraded now, in one place."""
    refusing: list[str] = []
    serving: list[str] = []
    if not state.limiter.backend_up() and state.config.limits.fail_mode == "closed":
        refusing.append("limits")  # every limited request gets 503 until Redis answers again
    if not state.keys.trusted():
        refusing.append("keys")  # the key store has been out of reach past keys.offline_grace_s: all 503
    elif state.keys.out_of_reach():
        serving.append("keys")  # known keys served from the copy, unknown ones 503
    ledger = state.ledger.health()  # "" when every row is in the ledger, else one word
    if not state.ledger.accepting():
        refusing.append(ledger or "ledger")
    elif ledger:
        serving.append(ledger)
    replicas = [u.replica for u in state.pool.upstreams]
    routable = [r for r in replicas if r.health.routable(now)]
    if not routable:
        # Degraded but not refusing: the cache still answers, a region's first probe may not have run yet
        # (an edge starting), and edges that all lost their regions at once must not all leave the pool.
        serving.append("regions")
    elif all(r.local for r in routable) and any(not r.local for r in replicas):
        serving.append("cut")  # every remote region is out (a cable cut): the cache and the local ones answer
    elif all(u.cooling_left(now) for u in state.pool.upstreams if u.replica.health.routable(now)):
        serving.append("cooling")  # every routable replica asked (Retry-After) not to be asked yet
    return Readiness(tuple(refusing + serving), bool(refusing))


def public_health(state: EdgeState) -> tuple[dict[str, str], int]:
    """The public answer and its HTTP status: one word of why, nothing an outsider could learn from."""
    ready = readiness(state, time.monotonic())
    return {"status": ready.status, "reason": ready.reasons[0] if ready.reasons else ""}, ready.http_status


def operator_health(state: EdgeState) -> dict:
    """The operator's details. Always answered with 200: a liveness probe reads this listener, and
    restarting the edge would not bring Redis or a region back."""
    now = time.monotonic()
    ready = readiness(state, now)
    limits = state.config.limits
    return {
        "status": ready.status,
        "reasons": list(ready.reasons),
        "refusing": ready.refusing,
        "limits_backend": limits.backend,
        "limits": "up" if state.limiter.backend_up() else f"down ({limits.fail_mode})",
        "ledger": state.ledger.health() or "up",
        "ledger_fleet": _fleet_ledger(state),
        "keys": {
            "backend": state.config.keys.backend,
            "store": state.keys.status(),
            "active": state.keys.active_keys(),
        },
        "regions": {u.name: u.status(now) for u in state.pool.upstreams},
        "cache": cache_health(state),
        "cache_share": state.cache.share.health() if state.cache and state.cache.share else None,
        "cache_audit": audit_health(state),
    }


def _fleet_ledger(state: EdgeState) -> dict | None:
    """The city's one bill (PostgreSQL): whether it answers and how many rows wait to be shipped there."""
    fleet = state.fleet_ledger
    if fleet is None:
        return None
    state_word = "up" if fleet.reachable else "out of reach (rows wait in the ledger)"
    return {"state": state_word, "behind": fleet.behind, "shipped": fleet.shipped_rows}


def audit_health(state: EdgeState) -> dict | None:
    """The live audit's measured false-hit rate (every verdict since start) and its 95% interval."""
    book = state.cache.audit if state.cache is not None else None
    if book is None:
        return None
    rate = book.rate()
    return {
        "audited": rate.audited,
        "wrong": rate.wrong,
        "false_hit_rate": round(rate.measured, 4),
        "ci95": [round(rate.lower, 4), round(rate.upper, 4)],
        "target": book.target,
        "partitions_off": book.partitions_off,
        "judge": _judge_health(state),
    }


def _judge_health(state: EdgeState) -> dict:
    """The pair judge's calibrated threshold and how many partitions the audit has moved from it."""
    assert state.cache is not None and state.cache.audit is not None
    check = state.cache.check
    calibrated = check.threshold
    opened, closed = state.cache.audit.judged.counts(calibrated)
    return {
        "loaded": check.judge_loaded,
        "calibrated_threshold": calibrated if calibrated < NEVER else None,
        "partitions_opened": opened,
        "partitions_closed": closed,
        **({"failure": check.failure} if check.failure else {}),
    }


def cache_health(state: EdgeState) -> str:
    cache = state.cache
    if cache is None:
        return f"off ({state.cache_off})"
    if cache.failure:
        return f"bypassed ({cache.failure})"
    if cache.semantic_off:
        return f"exact only ({cache.semantic_off})"
    return "up"
