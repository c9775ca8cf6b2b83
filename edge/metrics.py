"""Prometheus metrics of an edge proxy (``nearshore_edge:*``).

Every label value is bounded: drawn from the edge's config or code, or mapped to a fixed set by
:mod:`edge.metric_labels` when it comes from outside (a region's error code, a client's model name).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from nearshore.protocol.schemas import Usage

P = "nearshore_edge:"
_LATENCY = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class EdgeMetrics:
    def __init__(self, tenant_labels: bool = False) -> None:
        r = self.registry = CollectorRegistry()
        # Tenant names are customer data: a label only when the operator asks for it.
        self.tenant_labels = tenant_labels
        self._children: dict[tuple[str, str, str, str], tuple] = {}
        self.requests = Counter(P + "requests", "Requests by outcome.", ["status", "region"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens billed.", ["model"], registry=r)
        self.cached_tokens = Counter(
            P + "cached_prompt_tokens", "Prompt tokens from cache.", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            P + "generation_tokens", "Completion tokens billed.", ["model"], registry=r
        )
        cost_labels = ["model", "tenant"] if tenant_labels else ["model"]
        self.cost = Counter(P + "cost_usd", "Cost billed, USD.", cost_labels, registry=r)
        self.rate_limited = Counter(P + "rate_limited", "Requests refused by a limit.", ["limit"], registry=r)
        self.failovers = Counter(
            P + "upstream_failovers", "Regions skipped before the first byte.", ["region"], registry=r
        )
        self.retries = Counter(
            P + "upstream_retries",
            "Replicas asked again after a wait (Retry-After, backoff).",
            ["region"],
            registry=r,
        )
        self.retries_denied = Counter(
            P + "upstream_retries_denied",
            "Retries not made: the replica's retry budget was spent.",
            ["region"],
            registry=r,
        )
        self.fallbacks = Counter(
            P + "model_fallbacks",
            "Requests a fallback model answered, by the model asked for and the one that served.",
            ["model", "served_by"],
            registry=r,
        )
        self.bad_events = Counter(
            P + "upstream_bad_events",
            "Stream events from a region that did not parse (skipped).",
            ["region"],
            registry=r,
        )
        self.pool_queue = Histogram(
            P + "pool_queue_seconds",
            "Time waited for a slot in the pool at the edge.",
            ["pool"],
            registry=r,
            buckets=_LATENCY,
        )
        self.cache_lookups = Counter(
            P + "cache_lookups",
            "Response cache lookups by result (exact, semantic, miss).",
            ["result"],
            registry=r,
        )
        self.cache_rejections = Counter(
            P + "cache_verifier_rejections", "Semantic candidates the verifier turned down.", registry=r
        )
        self.cache_lookup_seconds = Histogram(
            P + "cache_lookup_seconds",
            "Semantic lookup time (embedding included).",
            registry=r,
            buckets=_LATENCY,
        )
        self.cache_entries = Gauge(P + "cache_entries", "Entries in the response cache.", registry=r)
        self.cache_bytes = Gauge(
            P + "cache_bytes", "Bytes the cache takes on disk (entries, index files).", registry=r
        )
        self.cache_partitions = Gauge(
            P + "cache_partitions", "Partitions with index files in the cache folder.", registry=r
        )
        self.cache_open_maps = Gauge(
            P + "cache_open_maps",
            "Index files this process holds mapped (an open file each).",
            registry=r,
        )
        self.cache_up = Gauge(P + "cache_up", "1 while the response cache works (0: bypassed).", registry=r)
        self.cache_failures = Gauge(
            P + "cache_failures",
            "Response cache operations that failed since start (the request went on without the cache).",
            ["operation"],
            registry=r,
        )
        self.cache_audits = Counter(
            P + "cache_audits",
            "Semantic hits the live audit judged, by how (sampled: the region's answer let finish; "
            "raced: the region answered first; shadow: in a partition serving exact hits only) and "
            "verdict (agree, disagree, unsure; failed or skipped: not judged).",
            ["mode", "verdict"],
            registry=r,
        )
        self.cache_false_hit_rate = Gauge(
            P + "cache_false_hit_rate",
            "The share of audited semantic hits that answered another question, with its 95% interval.",
            ["bound"],
            registry=r,
        )
        self.cache_partitions_off = Gauge(
            P + "cache_semantic_partitions_off",
            "Partitions serving exact hits only: their measured false-hit rate is above the target.",
            registry=r,
        )
        self.cache_judge_partitions = Gauge(
            P + "cache_judge_partitions",
            "Partitions whose pair-judge threshold the live audit moved from the calibrated one, by state "
            "(opened: lower, proved by their own right verdicts; closed: higher, above a wrong one).",
            ["state"],
            registry=r,
        )
        self.cache_audit_evictions = Counter(
            P + "cache_audit_evictions", "Entries the live audit found wrong and evicted.", registry=r
        )
        self.cache_audit_tokens = Counter(
            P + "cache_audit_tokens",
            "Tokens of the region answers the audit let finish (never billed to a tenant).",
            ["type"],
            registry=r,
        )
        self.cache_audit_cost = Counter(
            P + "cache_audit_cost_usd",
            "What the region answers the audit let finish cost at the price table "
            "(never billed to a tenant).",
            registry=r,
        )
        self.continued = Counter(
            P + "streams_continued",
            "Streams whose region died mid-answer, finished by another.",
            ["from_region", "region"],
            registry=r,
        )
        self.degraded = Counter(
            P + "degraded_answers",
            "Requests the degraded tier took while every remote region of their model was unreachable, by "
            "reason (cable-cut) and by who answered (cache, local) or none (refused with 503).",
            ["reason", "by"],
            registry=r,
        )
        self.limiter_up = Gauge(
            P + "ratelimit_backend_up", "1 while the shared limit store answers.", registry=r
        )
        self.region_rtt = Gauge(
            P + "region_rtt_seconds",
            "The router's round trip to the replica (measured, floored).",
            ["region"],
            registry=r,
        )
        self.region_inflight = Gauge(
            P + "region_inflight", "Requests this edge has in flight at the replica.", ["region"], registry=r
        )
        self.routed = Counter(
            P + "routed", "Requests by the replica the router put first.", ["region"], registry=r
        )
        self.region_up = Gauge(
            P + "region_up", "1 while the region's health check passes.", ["region"], registry=r
        )
        self.region_cooling = Gauge(
            P + "region_cooling_seconds",
            "Seconds before the replica may be asked again: it refused with Retry-After (counted at most "
            "upstream.max_retry_after_s); 0 when it may be asked now.",
            ["region"],
            registry=r,
        )
        self.overhead = Histogram(
            P + "edge_processing_seconds", "Edge time before forwarding.", registry=r, buckets=_LATENCY
        )
        self.ttft = Histogram(
            P + "time_to_first_token_seconds", "Arrival to first byte sent.", registry=r, buckets=_LATENCY
        )
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds", "Arrival to last byte sent.", registry=r, buckets=_LATENCY
        )
        self.ledger_errors = Counter(
            P + "ledger_write_errors", "Usage records that failed to commit.", registry=r
        )
        self.ledger_waiting = Gauge(
            P + "ledger_waiting_rows",
            "Usage rows not yet in the ledger file: in its spool, or held while the spool cannot be written.",
            registry=r,
        )
        self.ledger_accepting = Gauge(
            P + "ledger_accepting", "1 while the ledger (or its spool) can record new requests.", registry=r
        )
        self.usage_anomalies = Counter(
            P + "usage_anomalies",
            "Usage figures from a region that failed the edge's checks (the checked figure was billed).",
            ["kind", "region"],
            registry=r,
        )
        self.upstream_errors = Counter(
            P + "upstream_errors",
            "Requests a region failed, by the error the client got (a code the edge does not know: other).",
            ["code", "region"],
            registry=r,
        )
        self.key_share_wait = Histogram(
            P + "key_share_wait_seconds",
            "Time a request waited at the edge for its API key's share of the pool (edge/key_share.py).",
            ["pool"],
            registry=r,
            buckets=_LATENCY,
        )

    def count_request(
        self, status: str, region: str, model: str, tenant: str, usage: Usage, cost_usd: float
    ) -> None:
        """One billed request in every series it moves; label lookups cached (they cost more than the inc)."""
        key = (status, region, model, tenant if self.tenant_labels else "")
        children = self._children.get(key)
        if children is None:
            cost_labels = (model, tenant) if self.tenant_labels else (model,)
            children = self._children[key] = (
                self.requests.labels(status, region),
                self.prompt_tokens.labels(model),
                self.cached_tokens.labels(model),
                self.generation_tokens.labels(model),
                self.cost.labels(*cost_labels),
            )
        requests, prompt, cached, generation, cost = children
        requests.inc()
        prompt.inc(usage.prompt_tokens)
        cached.inc(usage.prompt_tokens_details.cached_tokens)
        generation.inc(usage.completion_tokens)
        cost.inc(cost_usd)

    def render(self) -> bytes:
        return generate_latest(self.registry)
