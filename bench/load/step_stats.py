"""What ``bench load`` reports for one endpoint at one step (a rate, or a concurrency).

Latencies, from each request's due time (so a client that falls behind shows up as latency, not as a lower
rate): TTFT, inter-token latency (every gap between content events, all requests pooled, as vLLM does),
time per output token ((e2e - TTFT) / (tokens - 1) per request) and end-to-end latency; each as mean, p50,
p90, p95, p99. Throughput over the step's wall time: answered requests and output tokens per second.

Goodput: answered requests per second that met every objective given (``--slo ttft=500ms,itl=100ms``). A
request's ITL is the p95 of its own gaps, its TPOT and e2e as above. Refusals (429, 503) are counted apart
from errors; errors are counted by type. Cost: each answer priced with the edge's price table (prompt
tokens served from the prefix cache at the cached-input price), an answer from the response cache at the
cache's price factor; blended as USD per million tokens (prompt + completion).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import msgspec

from edge.billing import PriceTable
from harness.client import Stream
from harness.stats import percentile

PERCENTILES = (50, 90, 95, 99)
SLO_METRICS = ("ttft", "itl", "tpot", "e2e")
CACHED_ANSWERS = ("HIT", "SEMANTIC")  # the edge's x-nearshore-cache values that never reached a region
REFUSALS = (429, 503)


@dataclass(slots=True)
class Sample:
    """One request as the generator saw it; ``sent_s`` is its due time from the run's start."""

    endpoint: str
    kind: str  # the prompt mix's kind: fresh | repeat | paraphrase
    sent_s: float
    stream: Stream
    lag_s: float = 0.0  # how late the generator sent it after its due time (its own limit showing)

    @property
    def cache(self) -> str:
        """The edge's x-nearshore-cache header: HIT | SEMANTIC | MISS, "" when absent."""
        return self.stream.cache

    @property
    def ok(self) -> bool:
        return self.stream.status == 200 and not self.stream.error

    @property
    def completion_tokens(self) -> int:
        usage = self.stream.usage
        return usage.completion_tokens if usage is not None else self.stream.tokens

    def tpot_s(self) -> float:
        tokens = self.stream.tokens
        return (self.stream.e2e_s - self.stream.ttft_s) / (tokens - 1) if tokens > 1 else math.nan

    def itl_s(self) -> float:
        """This request's inter-token latency for the objective: the p95 of its gaps."""
        return percentile(self.stream.gaps_s, 95)


class Latency(msgspec.Struct):
    """Milliseconds; NaN where nothing was measured."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values_s: list[float]) -> Latency:
        values = [v * 1000 for v in values_s if not math.isnan(v)]
        mean = sum(values) / len(values) if values else math.nan
        return cls(len(values), mean, *(percentile(values, p) for p in PERCENTILES))


class Slo(msgspec.Struct, frozen=True):
    """Objectives in seconds; 0 means none on that metric."""

    ttft: float = 0.0
    itl: float = 0.0
    tpot: float = 0.0
    e2e: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft=500ms,itl=100ms`` (units ms or s; a bare number is milliseconds)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, raw = part.partition("=")
            if name not in SLO_METRICS:
                raise ValueError(f"an objective is one of {', '.join(SLO_METRICS)}: {part!r}")
            values[name] = _seconds(raw, part)
        return cls(**values)

    def met(self, sample: Sample) -> bool:
        if not sample.ok:
            return False
        measured = {
            "ttft": sample.stream.ttft_s,
            "itl": sample.itl_s(),
            "tpot": sample.tpot_s(),
            "e2e": sample.stream.e2e_s,
        }
        # A request with too few tokens to have an ITL or TPOT does not fail those objectives.
        return all(
            not limit or math.isnan(measured[name]) or measured[name] <= limit
            for name, limit in msgspec.structs.asdict(self).items()
        )

    def __str__(self) -> str:
        given = msgspec.structs.asdict(self).items()
        return ",".join(f"{name}={limit * 1000:g}ms" for name, limit in given if limit) or "none"


def _seconds(raw: str, part: str) -> float:
    scale = 1.0 if raw.endswith("s") and not raw.endswith("ms") else 0.001
    number = raw.removesuffix("ms").removesuffix("s")
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError(f"an objective is name=NUMBER[ms|s]: {part!r}") from None
    if value <= 0:
        raise ValueError(f"an objective must be positive: {part!r}")
    return value


@dataclass(frozen=True)
class Prices:
    """The edge's price table, its response cache's price factor, and the model asked for."""

    table: PriceTable
    cache_price_factor: float
    model: str

    @classmethod
    def from_edge_config(cls, path: Path, model: str) -> Prices:
        from edge.config import EdgeConfig, value_problems  # only when asked: the edge's schema is large
        from nearshore.config import ConfigError, load_config

        config = load_config(path, EdgeConfig)
        if problems := value_problems(config):  # a negative or infinite price, as the edge refuses it
            raise ConfigError(f"{path}: {'; '.join(problems)}")
        return cls(PriceTable(config.prices), config.cache.price_factor, model)

    def cost_usd(self, sample: Sample) -> float:
        usage = sample.stream.usage
        if usage is None:
            return 0.0
        usd = self.table.cost(self.model, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
        return usd * self.cache_price_factor if sample.cache in CACHED_ANSWERS else usd


class StepSummary(msgspec.Struct):
    endpoint: str
    step: str  # "4 rps" or "closed 8"
    offered_rps: float  # NaN for a closed loop
    duration_s: float
    sent: int
    ok: int
    ttft_ms: Latency
    itl_ms: Latency
    tpot_ms: Latency
    e2e_ms: Latency
    request_rps: float
    output_tokens_per_s: float
    goodput_rps: float
    slo: str
    slo_met_share: float
    cache: dict[str, int]  # answers by x-nearshore-cache value ("none" where absent)
    # the same by the prompt mix's kind: a HIT or SEMANTIC on a "fresh" question answered it from another's
    cache_by_kind: dict[str, dict[str, int]]
    refused: dict[str, int]  # "429" / "503" -> count
    errors: dict[str, int]  # type -> count
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    usd_per_million_tokens: float  # NaN without prices or tokens
    send_lag_ms: Latency | None = None  # the generator's lateness: near its ceiling this grows


def summarize(
    samples: list[Sample],
    *,
    endpoint: str,
    step: str,
    offered_rps: float,
    duration_s: float,
    slo: Slo,
    prices: Prices | None = None,
) -> StepSummary:
    ok = [s for s in samples if s.ok]
    met = sum(1 for s in ok if slo.met(s))
    usages = [s.stream.usage for s in ok if s.stream.usage is not None]
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    cost = sum(prices.cost_usd(s) for s in ok) if prices is not None else math.nan
    tokens = prompt + completion
    per_second = 1 / duration_s if duration_s > 0 else math.nan
    return StepSummary(
        endpoint=endpoint,
        step=step,
        offered_rps=offered_rps,
        duration_s=duration_s,
        sent=len(samples),
        ok=len(ok),
        ttft_ms=Latency.of([s.stream.ttft_s for s in ok if s.stream.tokens]),
        itl_ms=Latency.of([gap for s in ok for gap in s.stream.gaps_s]),
        tpot_ms=Latency.of([s.tpot_s() for s in ok]),
        e2e_ms=Latency.of([s.stream.e2e_s for s in ok]),
        request_rps=len(ok) * per_second,
        output_tokens_per_s=sum(s.completion_tokens for s in ok) * per_second,
        goodput_rps=met * per_second,
        slo=str(slo),
        slo_met_share=met / len(samples) if samples else math.nan,
        cache=dict(Counter(s.cache or "none" for s in ok)),
        cache_by_kind={
            kind: dict(Counter(s.cache or "none" for s in ok if s.kind == kind))
            for kind in sorted({s.kind for s in ok})
        },
        refused={str(code): n for code in REFUSALS if (n := _count_status(samples, code))},
        errors=dict(Counter(error_type(s.stream) for s in samples if not s.ok and not _refused(s))),
        prompt_tokens=prompt,
        cached_prompt_tokens=sum(u.cached_tokens for u in usages),
        completion_tokens=completion,
        cost_usd=cost,
        usd_per_million_tokens=cost / tokens * 1e6 if tokens else math.nan,
        send_lag_ms=Latency.of([s.lag_s for s in samples]),
    )


def _refused(sample: Sample) -> bool:
    return sample.stream.status in REFUSALS


def _count_status(samples: list[Sample], status: int) -> int:
    return sum(1 for s in samples if s.stream.status == status)


def error_type(stream: Stream) -> str:
    """A failed stream's kind: ``http_502``, ``error_event``, ``no_done``, or the exception's class name."""
    if stream.status not in (0, 200):
        return f"http_{stream.status}"
    if stream.error.startswith("error event"):
        return "error_event"
    if stream.error.startswith("the stream ended"):
        return "no_done"
    if stream.status == 0 and stream.error not in ("", "unfinished"):
        return stream.error.split("(", 1)[0] or "exception"
    return stream.error.split(":", 1)[0] or "unknown"
