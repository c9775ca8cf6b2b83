"""Every metric family an edge exposes on ``/metrics`` (:mod:`edge.metrics`): name, type, labels, meaning.

Tests hold a live edge's ``/metrics`` and the Grafana dashboard (``configs/grafana/nearshore.json``) to
this list: a family added to the edge's metrics is added here, with its HELP text.
"""

from __future__ import annotations

from nearshore.metrics_catalog import MetricSpec

P = "nearshore_edge:"

EDGE_METRICS: tuple[MetricSpec, ...] = (
    # Requests, tokens, cost (settled once per admitted request)
    MetricSpec(P + "requests", "counter", ("status", "region"), "Requests by outcome."),
    MetricSpec(P + "prompt_tokens", "counter", ("model",), "Prompt tokens billed."),
    MetricSpec(P + "cached_prompt_tokens", "counter", ("model",), "Prompt tokens from cache."),
    MetricSpec(P + "generation_tokens", "counter", ("model",), "Completion tokens billed."),
    MetricSpec(P + "cost_usd", "counter", ("model",), "Cost billed, USD.", optional_labels=("tenant",)),
    MetricSpec(
        P + "usage_anomalies",
        "counter",
        ("kind", "region"),
        "Usage figures from a region that failed the edge's checks (the checked figure was billed).",
    ),
    MetricSpec(P + "ledger_write_errors", "counter", (), "Usage records that failed to commit."),
    MetricSpec(
        P + "ledger_waiting_rows",
        "gauge",
        (),
        "Usage rows not yet in the ledger file: in its spool, or held while the spool cannot be written.",
    ),
    MetricSpec(
        P + "ledger_accepting", "gauge", (), "1 while the ledger (or its spool) can record new requests."
    ),
    # Refusals and failures
    MetricSpec(P + "rate_limited", "counter", ("limit",), "Requests refused by a limit."),
    MetricSpec(P + "ratelimit_backend_up", "gauge", (), "1 while the shared limit store answers."),
    MetricSpec(
        P + "upstream_errors",
        "counter",
        ("code", "region"),
        "Requests a region failed, by the error the client got (a code the edge does not know: other).",
    ),
    MetricSpec(P + "upstream_failovers", "counter", ("region",), "Regions skipped before the first byte."),
    MetricSpec(
        P + "upstream_retries",
        "counter",
        ("region",),
        "Replicas asked again after a wait (Retry-After, backoff).",
    ),
    MetricSpec(
        P + "upstream_retries_denied",
        "counter",
        ("region",),
        "Retries not made: the replica's retry budget was spent.",
    ),
    MetricSpec(
        P + "model_fallbacks",
        "counter",
        ("model", "served_by"),
        "Requests a fallback model answered, by the model asked for and the one that served.",
    ),
    MetricSpec(
        P + "upstream_bad_events",
        "counter",
        ("region",),
        "Stream events from a region that did not parse (skipped).",
    ),
    MetricSpec(
        P + "streams_continued",
        "counter",
        ("from_region", "region"),
        "Streams whose region died mid-answer, finished by another.",
    ),
    MetricSpec(
        P + "degraded_answers",
        "counter",
        ("reason", "by"),
        "Requests the degraded tier took while every remote region of their model was unreachable, by reason "
        "(cable-cut) and by who answered (cache, local) or none (refused with 503).",
    ),
    # Latency as the client sees it
    MetricSpec(P + "time_to_first_token_seconds", "histogram", (), "Arrival to first byte sent."),
    MetricSpec(P + "e2e_request_latency_seconds", "histogram", (), "Arrival to last byte sent."),
    MetricSpec(P + "edge_processing_seconds", "histogram", (), "Edge time before forwarding."),
    MetricSpec(
        P + "pool_queue_seconds", "histogram", ("pool",), "Time waited for a slot in the pool at the edge."
    ),
    # Regions as the router sees them
    MetricSpec(
        P + "region_rtt_seconds",
        "gauge",
        ("region",),
        "The router's round trip to the replica (measured, floored).",
    ),
    MetricSpec(
        P + "region_inflight", "gauge", ("region",), "Requests this edge has in flight at the replica."
    ),
    MetricSpec(P + "region_up", "gauge", ("region",), "1 while the region's health check passes."),
    MetricSpec(
        P + "region_cooling_seconds",
        "gauge",
        ("region",),
        "Seconds before the replica may be asked again: it refused with Retry-After (counted at most "
        "upstream.max_retry_after_s); 0 when it may be asked now.",
    ),
    MetricSpec(P + "routed", "counter", ("region",), "Requests by the replica the router put first."),
    # The response cache
    MetricSpec(
        P + "cache_lookups",
        "counter",
        ("result",),
        "Response cache lookups by result (exact, semantic, miss).",
    ),
    MetricSpec(
        P + "cache_verifier_rejections", "counter", (), "Semantic candidates the verifier turned down."
    ),
    MetricSpec(P + "cache_lookup_seconds", "histogram", (), "Semantic lookup time (embedding included)."),
    MetricSpec(P + "cache_entries", "gauge", (), "Entries in the response cache."),
    MetricSpec(P + "cache_bytes", "gauge", (), "Bytes the cache takes on disk (entries, index files)."),
    MetricSpec(P + "cache_partitions", "gauge", (), "Partitions with index files in the cache folder."),
    MetricSpec(
        P + "cache_open_maps",
        "gauge",
        (),
        "Index files this process holds mapped (an open file each).",
    ),
    MetricSpec(P + "cache_up", "gauge", (), "1 while the response cache works (0: bypassed)."),
    MetricSpec(
        P + "cache_failures",
        "gauge",
        ("operation",),
        "Response cache operations that failed since start (the request went on without the cache).",
    ),
    # The cache's live audit
    MetricSpec(
        P + "cache_audits",
        "counter",
        ("mode", "verdict"),
        "Semantic hits the live audit judged, by how (sampled: the region's answer let finish; raced: the "
        "region answered first; shadow: in a partition serving exact hits only) and verdict (agree, "
        "disagree, unsure; failed or skipped: not judged).",
    ),
    MetricSpec(
        P + "cache_false_hit_rate",
        "gauge",
        ("bound",),
        "The share of audited semantic hits that answered another question, with its 95% interval.",
    ),
    MetricSpec(
        P + "cache_semantic_partitions_off",
        "gauge",
        (),
        "Partitions serving exact hits only: their measured false-hit rate is above the target.",
    ),
    MetricSpec(
        P + "cache_judge_partitions",
        "gauge",
        ("state",),
        "Partitions whose pair-judge threshold the live audit moved from the calibrated one, by state "
        "(opened: lower, proved by their own right verdicts; closed: higher, above a wrong one).",
    ),
    MetricSpec(P + "cache_audit_evictions", "counter", (), "Entries the live audit found wrong and evicted."),
    MetricSpec(
        P + "cache_audit_tokens",
        "counter",
        ("type",),
        "Tokens of the region answers the audit let finish (never billed to a tenant).",
    ),
    MetricSpec(
        P + "cache_audit_cost_usd",
        "counter",
        (),
        "What the region answers the audit let finish cost at the price table (never billed to a tenant).",
    ),
    MetricSpec(
        P + "key_share_wait_seconds",
        "histogram",
        ("pool",),
        "Time a request waited at the edge for its API key's share of the pool (edge/key_share.py).",
    ),
)
