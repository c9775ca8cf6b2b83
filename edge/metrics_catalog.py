"""Every metric family an edge exposes on ``/metrics``, declared once: the attribute it is on
:class:`edge.metrics.EdgeMetrics` (which makes the families from this list), its name, type, labels, meaning
(the HELP text) and a histogram's buckets. A new family is one entry here.

Tests hold a live edge's ``/metrics`` and the Grafana dashboard (``configs/grafana/nearshore.json``) to
this list.
"""

from __future__ import annotations

from nearshore.metrics_catalog import MetricSpec

P = "nearshore_edge:"
LATENCY = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

EDGE_FAMILIES: dict[str, MetricSpec] = {
    # Requests, tokens, cost (settled once per admitted request)
    "requests": MetricSpec(P + "requests", "counter", ("status", "region"), "Requests by outcome."),
    "prompt_tokens": MetricSpec(P + "prompt_tokens", "counter", ("model",), "Prompt tokens billed."),
    "cached_tokens": MetricSpec(
        P + "cached_prompt_tokens", "counter", ("model",), "Prompt tokens from cache."
    ),
    "generation_tokens": MetricSpec(
        P + "generation_tokens", "counter", ("model",), "Completion tokens billed."
    ),
    "cost": MetricSpec(
        P + "cost_usd", "counter", ("model",), "Cost billed, USD.", optional_labels=("tenant",)
    ),
    "usage_anomalies": MetricSpec(
        P + "usage_anomalies",
        "counter",
        ("kind", "region"),
        "Usage figures from a region that failed the edge's checks (the checked figure was billed).",
    ),
    "ledger_errors": MetricSpec(
        P + "ledger_write_errors", "counter", (), "Usage records that failed to commit."
    ),
    "ledger_waiting": MetricSpec(
        P + "ledger_waiting_rows",
        "gauge",
        (),
        "Usage rows not yet in the ledger file: in its spool, or held while the spool cannot be written.",
    ),
    "ledger_accepting": MetricSpec(
        P + "ledger_accepting", "gauge", (), "1 while the ledger (or its spool) can record new requests."
    ),
    # Refusals and failures
    "rate_limited": MetricSpec(P + "rate_limited", "counter", ("limit",), "Requests refused by a limit."),
    "limiter_up": MetricSpec(
        P + "ratelimit_backend_up", "gauge", (), "1 while the shared limit store answers."
    ),
    "limiter_resets": MetricSpec(
        P + "ratelimit_store_resets",
        "gauge",
        (),
        "Times since start the shared limit store was found to have lost its state (restarted empty, "
        "flushed); each time, this process put its part of every key's window back.",
    ),
    "log_lines_dropped": MetricSpec(
        P + "log_lines_dropped",
        "gauge",
        (),
        "Log lines dropped since start because their reader fell behind (the log says how many when it "
        "is read again; the event loop never waits for it).",
    ),
    "ledger_fleet_behind": MetricSpec(
        P + "ledger_fleet_behind",
        "gauge",
        (),
        "Ledger rows not yet in the city's PostgreSQL bill (ledger.postgres_url); 0 without one.",
    ),
    "keys_store_up": MetricSpec(
        P + "keys_store_up", "gauge", (), "1 while the key store answers (always, for a local SQLite file)."
    ),
    "keys_active": MetricSpec(P + "keys_active", "gauge", (), "Keys in the edge's copy that may be used."),
    "upstream_errors": MetricSpec(
        P + "upstream_errors",
        "counter",
        ("code", "region"),
        "Requests a region failed, by the error the client got (a code the edge does not know: other).",
    ),
    "failovers": MetricSpec(
        P + "upstream_failovers", "counter", ("region",), "Regions skipped before the first byte."
    ),
    "retries": MetricSpec(
        P + "upstream_retries",
        "counter",
        ("region",),
        "Replicas asked again after a wait (Retry-After, backoff).",
    ),
    "retries_denied": MetricSpec(
        P + "upstream_retries_denied",
        "counter",
        ("region",),
        "Retries not made: the replica's retry budget was spent.",
    ),
    "fallbacks": MetricSpec(
        P + "model_fallbacks",
        "counter",
        ("model", "served_by"),
        "Requests a fallback model answered, by the model asked for and the one that served.",
    ),
    "bad_events": MetricSpec(
        P + "upstream_bad_events",
        "counter",
        ("region",),
        "Stream events from a region that did not parse (skipped).",
    ),
    "continued": MetricSpec(
        P + "streams_continued",
        "counter",
        ("from_region", "region"),
        "Streams whose region died mid-answer, finished by another.",
    ),
    "degraded": MetricSpec(
        P + "degraded_answers",
        "counter",
        ("reason", "by"),
        "Requests the degraded tier took while every remote region of their model was unreachable, by reason "
        "(cable-cut) and by who answered (cache, local) or none (refused with 503).",
    ),
    # Latency as the client sees it
    "ttft": MetricSpec(
        P + "time_to_first_token_seconds", "histogram", (), "Arrival to first byte sent.", buckets=LATENCY
    ),
    "e2e": MetricSpec(
        P + "e2e_request_latency_seconds", "histogram", (), "Arrival to last byte sent.", buckets=LATENCY
    ),
    "overhead": MetricSpec(
        P + "edge_processing_seconds", "histogram", (), "Edge time before forwarding.", buckets=LATENCY
    ),
    "pool_queue": MetricSpec(
        P + "pool_queue_seconds",
        "histogram",
        ("pool",),
        "Time waited for a slot in the pool at the edge.",
        buckets=LATENCY,
    ),
    # Regions as the router sees them
    "region_rtt": MetricSpec(
        P + "region_rtt_seconds",
        "gauge",
        ("region",),
        "The router's round trip to the replica (measured, floored).",
    ),
    "region_inflight": MetricSpec(
        P + "region_inflight", "gauge", ("region",), "Requests this edge has in flight at the replica."
    ),
    "region_up": MetricSpec(
        P + "region_up", "gauge", ("region",), "1 while the region's health check passes."
    ),
    "region_cooling": MetricSpec(
        P + "region_cooling_seconds",
        "gauge",
        ("region",),
        "Seconds before the replica may be asked again: it refused with Retry-After (counted at most "
        "upstream.max_retry_after_s); 0 when it may be asked now.",
    ),
    "routed": MetricSpec(
        P + "routed", "counter", ("region",), "Requests by the replica the router put first."
    ),
    # The response cache
    "cache_lookups": MetricSpec(
        P + "cache_lookups",
        "counter",
        ("result",),
        "Response cache lookups by result (exact, semantic, miss).",
    ),
    "cache_rejections": MetricSpec(
        P + "cache_verifier_rejections", "counter", (), "Semantic candidates the verifier turned down."
    ),
    "cache_lookup_seconds": MetricSpec(
        P + "cache_lookup_seconds",
        "histogram",
        (),
        "Semantic lookup time (embedding included).",
        buckets=LATENCY,
    ),
    "cache_entries": MetricSpec(P + "cache_entries", "gauge", (), "Entries in the response cache."),
    "cache_bytes": MetricSpec(
        P + "cache_bytes", "gauge", (), "Bytes the cache takes on disk (entries, index files)."
    ),
    "cache_partitions": MetricSpec(
        P + "cache_partitions", "gauge", (), "Partitions with index files in the cache folder."
    ),
    "cache_open_maps": MetricSpec(
        P + "cache_open_maps",
        "gauge",
        (),
        "Index files this process holds mapped (an open file each).",
    ),
    "cache_up": MetricSpec(P + "cache_up", "gauge", (), "1 while the response cache works (0: bypassed)."),
    "cache_failures": MetricSpec(
        P + "cache_failures",
        "gauge",
        ("operation",),
        "Response cache operations that failed since start (the request went on without the cache).",
    ),
    "cache_over_share": MetricSpec(
        P + "cache_stores_over_share",
        "gauge",
        (),
        "Answers not stored since start because the cache was full and their scope (tenant) had stored "
        "its fair part of it lately: one tenant's new answers may not evict every other tenant's.",
    ),
    # The cache's live audit
    "cache_audits": MetricSpec(
        P + "cache_audits",
        "counter",
        ("mode", "verdict"),
        "Semantic hits the live audit judged, by how (sampled: the region's answer let finish; raced: the "
        "region answered first; shadow: in a partition serving exact hits only) and verdict (agree, "
        "disagree, unsure; failed or skipped: not judged).",
    ),
    "cache_false_hit_rate": MetricSpec(
        P + "cache_false_hit_rate",
        "gauge",
        ("bound",),
        "The share of audited semantic hits that answered another question, with its 95% interval.",
    ),
    "cache_partitions_off": MetricSpec(
        P + "cache_semantic_partitions_off",
        "gauge",
        (),
        "Partitions serving exact hits only: their measured false-hit rate is above the target.",
    ),
    "cache_judge_partitions": MetricSpec(
        P + "cache_judge_partitions",
        "gauge",
        ("state",),
        "Partitions whose pair-judge threshold the live audit moved from the calibrated one, by state "
        "(opened: lower, proved by their own right verdicts; closed: higher, above a wrong one).",
    ),
    "cache_audit_evictions": MetricSpec(
        P + "cache_audit_evictions", "counter", (), "Entries the live audit found wrong and evicted."
    ),
    "cache_audit_tokens": MetricSpec(
        P + "cache_audit_tokens",
        "counter",
        ("type",),
        "Tokens of the region answers the audit let finish (never billed to a tenant).",
    ),
    "cache_audit_cost": MetricSpec(
        P + "cache_audit_cost_usd",
        "counter",
        (),
        "What the region answers the audit let finish cost at the price table (never billed to a tenant).",
    ),
    "key_share_wait": MetricSpec(
        P + "key_share_wait_seconds",
        "histogram",
        ("pool",),
        "Time a request waited at the edge for its API key's share of the pool (edge/key_share.py).",
        buckets=LATENCY,
    ),
}

EDGE_METRICS: tuple[MetricSpec, ...] = tuple(EDGE_FAMILIES.values())
