"""Every metric family a regional node exposes on ``/metrics`` (:mod:`regional.metrics`): name, type,
labels, meaning. Named after vLLM's (``vllm:x`` is ``nearshore:x``).

Tests hold a live node's ``/metrics`` and the Grafana dashboard (``configs/grafana/nearshore.json``) to
this list: a family added to the node's metrics is added here, with its HELP text.
"""

from __future__ import annotations

from nearshore.metrics_catalog import MetricSpec

P = "nearshore:"
M = ("model_name",)
STEP_SECONDS = "Seconds the engine's steps ran: model, sampling and grammars."
GRAMMAR_SECONDS = (
    "Seconds computing grammar masks (on their own thread, while the model runs) and advancing grammars."
)
GRAMMAR_TOKENS = "Tokens drawn under a grammar (response_format, guided_*, a tool call)."

REGION_METRICS: tuple[MetricSpec, ...] = (
    # Per request, observed by the request service
    MetricSpec(P + "time_to_first_token_seconds", "histogram", M, "Time to first token."),
    MetricSpec(P + "inter_token_latency_seconds", "histogram", M, "Time between tokens."),
    MetricSpec(P + "e2e_request_latency_seconds", "histogram", M, "Request latency."),
    MetricSpec(P + "request_queue_time_seconds", "histogram", M, "Time waiting for a batch slot."),
    MetricSpec(P + "request_prefill_time_seconds", "histogram", M, "Prefill time."),
    MetricSpec(P + "request_prompt_tokens", "histogram", M, "Prompt tokens per request."),
    MetricSpec(P + "request_generation_tokens", "histogram", M, "Generated tokens per request."),
    MetricSpec(P + "prompt_tokens", "counter", M, "Prompt tokens processed."),
    MetricSpec(P + "generation_tokens", "counter", M, "Tokens generated."),
    MetricSpec(
        P + "request_success", "counter", (*M, "finished_reason"), "Finished requests by finish reason."
    ),
    MetricSpec(P + "request_errors", "counter", ("status",), "Requests refused or failed, by HTTP status."),
    # The engine, read from Engine.stats() at scrape time
    MetricSpec(P + "num_requests_running", "gauge", M, "Requests in the running batch."),
    MetricSpec(P + "num_requests_waiting", "gauge", M, "Requests waiting for a batch slot."),
    MetricSpec(P + "kv_cache_usage_perc", "gauge", M, "Share of the KV pool reserved."),
    MetricSpec(P + "model_load_time_seconds", "gauge", M, "Seconds the last model load took."),
    MetricSpec(P + "model_loaded", "gauge", M, "1 when the model is in memory."),
    MetricSpec(P + "prefix_cache_queries", "counter", M, "Prompt tokens looked up in the prefix cache."),
    MetricSpec(P + "prefix_cache_hits", "counter", M, "Prompt tokens found in the prefix cache."),
    MetricSpec(P + "engine_steps", "counter", M, "Batched decode steps run."),
    MetricSpec(P + "num_preemptions", "counter", M, "Sequences whose KV was freed for others'."),
    MetricSpec(
        P + "prefill_tokens", "counter", M, "Prompt tokens computed by the engine's steps, as they ran."
    ),
    MetricSpec(P + "engine_step_seconds", "counter", M, STEP_SECONDS),
    MetricSpec(P + "grammar_seconds", "counter", M, GRAMMAR_SECONDS),
    MetricSpec(P + "grammar_tokens", "counter", M, GRAMMAR_TOKENS),
)
