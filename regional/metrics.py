"""Prometheus metrics of a regional node, named after vLLM's (``vllm:x`` becomes ``nearshore:x``).

Per-request histograms are observed by the request service (``regional.service``); engine gauges and
counters are read from ``Engine.stats()`` at scrape time, so the engine itself knows nothing of Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from regional.engine import Engine
from regional.metrics_catalog import GRAMMAR_SECONDS, GRAMMAR_TOKENS, STEP_SECONDS

P = "nearshore:"
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)


class RegionMetrics:
    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.ttft = Histogram(
            P + "time_to_first_token_seconds",
            "Time to first token.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.itl = Histogram(
            P + "inter_token_latency_seconds",
            "Time between tokens.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds",
            "Request latency.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.queue = Histogram(
            P + "request_queue_time_seconds",
            "Time waiting for a batch slot.",
            labels,
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.prefill = Histogram(
            P + "request_prefill_time_seconds", "Prefill time.", labels, registry=r, buckets=_LATENCY_BUCKETS
        )
        self.request_prompt_tokens = Histogram(
            P + "request_prompt_tokens",
            "Prompt tokens per request.",
            labels,
            registry=r,
            buckets=_TOKEN_BUCKETS,
        )
        self.request_generation_tokens = Histogram(
            P + "request_generation_tokens",
            "Generated tokens per request.",
            labels,
            registry=r,
            buckets=_TOKEN_BUCKETS,
        )
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens processed.", labels, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Tokens generated.", labels, registry=r)
        self.request_success = Counter(
            P + "request_success",
            "Finished requests by finish reason.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.request_errors = Counter(
            P + "request_errors", "Requests refused or failed, by HTTP status.", ["status"], registry=r
        )
        r.register(_EngineCollector(engine))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats()
        model = [self.engine.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(P + name, doc, labels=["model_name"])
            g.add_metric(model, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(P + name, doc, labels=["model_name"])
            c.add_metric(model, value)
            return c

        yield gauge("num_requests_running", "Requests in the running batch.", s.running)
        yield gauge("num_requests_waiting", "Requests waiting for a batch slot.", s.waiting)
        yield gauge(
            "kv_cache_usage_perc", "Share of the KV pool reserved.", s.kv_tokens_used / s.kv_tokens_total
        )
        yield gauge("model_load_time_seconds", "Seconds the last model load took.", s.model_load_s)
        yield gauge("model_loaded", "1 when the model is in memory.", 1.0 if s.state == "ready" else 0.0)
        yield counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries
        )
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_cache_hits)
        yield counter("engine_steps", "Batched decode steps run.", s.steps)
        yield counter("num_preemptions", "Sequences whose KV was freed for others'.", s.num_preemptions)
        yield counter(
            "prefill_tokens", "Prompt tokens computed by the engine's steps, as they ran.", s.prefill_tokens
        )
        yield counter("engine_step_seconds", STEP_SECONDS, s.step_s)
        yield counter("grammar_seconds", GRAMMAR_SECONDS, s.grammar_s)
        yield counter("grammar_tokens", GRAMMAR_TOKENS, s.grammar_tokens)
