"""``bench load``'s parts on known inputs: arrivals (rate and burstiness), the prompt mix, the statistics
(percentiles, goodput, refusals, cost) and a soak's growth."""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path

import pytest

from bench.load.arrivals import OpenLoop, coefficient_of_variation, parse_rates
from bench.load.prompts import TEMPLATES, LengthDist, PromptMix
from bench.load.soak import (
    ProcessSeries,
    growth_of,
    parse_duration_s,
    parse_pid,
    pids_from_run,
    slope,
)
from bench.load.step_stats import Latency, Prices, Sample, Slo, error_type, summarize
from cache.verify import verify
from edge.billing import Price, PriceTable
from harness.client import PromptTokensDetails, Stream, Usage

REPO = Path(__file__).resolve().parents[2]

# --- arrivals --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("burstiness", "cv"), [(1.0, 1.0), (4.0, 2.0), (0.25, 0.5)])
def test_open_loop_hits_the_rate_and_the_burstiness(burstiness, cv):
    """Over 20,000 arrivals: the realised rate within 3% of the asked one, the gaps' CV within 5% of
    sqrt(burstiness) (Poisson: 1)."""
    rate = 50.0
    offsets = OpenLoop(rate, burstiness, seed=7).offsets_s(400.0)
    realised = len(offsets) / 400.0
    assert realised == pytest.approx(rate, rel=0.03)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert coefficient_of_variation(gaps) == pytest.approx(cv, rel=0.05)


def test_arrivals_are_seeded():
    assert OpenLoop(5, seed=1).offsets_s(10) == OpenLoop(5, seed=1).offsets_s(10)
    assert OpenLoop(5, seed=1).offsets_s(10) != OpenLoop(5, seed=2).offsets_s(10)
    assert all(0 < t < 10 for t in OpenLoop(5, seed=1).offsets_s(10))


def test_rates_parse():
    assert parse_rates("1,2, 4,8") == [1.0, 2.0, 4.0, 8.0]
    for bad in ("", "1,-2", "x"):
        with pytest.raises(ValueError):
            parse_rates(bad)


# --- prompt mix ------------------------------------------------------------------------------------------


def _messages(body: bytes) -> list[dict]:
    return json.loads(body)["messages"]


def test_a_paraphrase_is_worded_as_the_caches_verifier_explains():
    words = {"aspect": "mobile money", "subject": "street traders", "place": "Kano"}
    for template in TEMPLATES[1:]:
        assert verify(template.format(**words), TEMPLATES[0].format(**words)).ok, template


def test_prompt_mix_shares_repeats_and_paraphrases():
    mix = PromptMix("m", system_prompts=3, repeat_share=0.2, paraphrase_share=0.3, seed=5)
    stream = mix.requests()
    requests = [next(stream) for _ in range(3000)]
    kinds = [r.kind for r in requests]
    assert kinds.count("repeat") / 3000 == pytest.approx(0.2, abs=0.03)
    assert kinds.count("paraphrase") / 3000 == pytest.approx(0.3, abs=0.03)
    fresh_bodies = {r.body for r in requests if r.kind == "fresh"}
    assert len(fresh_bodies) == kinds.count("fresh")  # every fresh question is new
    assert all(r.body in fresh_bodies for r in requests if r.kind == "repeat")  # byte for byte
    earlier = {
        tuple(m["content"] for m in _messages(b)[:3]): _messages(b)[3]["content"] for b in fresh_bodies
    }
    for request in (r for r in requests if r.kind == "paraphrase"):
        messages = _messages(request.body)
        first = earlier[tuple(m["content"] for m in messages[:3])]  # same system prompt and context
        assert messages[3]["content"] != first
    systems = {_messages(r.body)[0]["content"] for r in requests}
    assert len(systems) == 3  # shared system prompts: the prefix cache's material
    body = json.loads(requests[0].body)
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["temperature"] == 0
    # seeded
    again = mix.requests()
    assert [next(again).body for _ in range(50)] == [r.body for r in requests[:50]]


def test_length_distributions():
    import random

    rng = random.Random(3)
    assert LengthDist.parse("64").sample(rng) == 64
    uniform = [LengthDist.parse("uniform:10-20").sample(rng) for _ in range(2000)]
    assert min(uniform) == 10 and max(uniform) == 20
    lognormal = [LengthDist.parse("lognormal:100:0.5").sample(rng) for _ in range(20000)]
    assert sum(lognormal) / len(lognormal) == pytest.approx(100, rel=0.03)
    for bad in ("uniform:20-10", "normal:5", "lognormal:x", "0"):
        with pytest.raises(ValueError):
            LengthDist.parse(bad)
    mix = PromptMix("m", output_tokens=LengthDist.parse("uniform:5-9"), seed=1)
    stream = mix.requests()
    for _ in range(200):
        request = next(stream)
        assert 5 <= request.max_tokens <= 9 and json.loads(request.body)["max_tokens"] == request.max_tokens


# --- statistics ------------------------------------------------------------------------------------------


def _sample(ttft_s=0.1, gap_s=0.02, tokens=11, status=200, error="", cache="", prompt=100, cached=0):
    stream = Stream(status=status, error=error, cache=cache)
    if not error and status == 200:
        stream.ttft_s = ttft_s
        stream.gaps_s = [gap_s] * (tokens - 1)
        stream.tokens = tokens
        stream.last_token_s = ttft_s + gap_s * (tokens - 1)
        stream.e2e_s = stream.last_token_s
        stream.usage = Usage(prompt, tokens, PromptTokensDetails(cached_tokens=cached))
    return Sample("a", "fresh", 0.0, stream)


def test_latency_percentiles_on_known_values():
    latency = Latency.of([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert latency.count == 100 and latency.mean == pytest.approx(50.5)
    assert latency.p50 == pytest.approx(50.5)
    assert latency.p90 == pytest.approx(90.1)
    assert latency.p99 == pytest.approx(99.01)
    assert math.isnan(Latency.of([]).p50)


def test_goodput_refusals_errors_and_throughput():
    samples = (
        [_sample(ttft_s=0.2, gap_s=0.05)] * 4  # meets both objectives
        + [_sample(ttft_s=0.9, gap_s=0.05)] * 2  # TTFT too slow
        + [_sample(ttft_s=0.2, gap_s=0.15)] * 2  # ITL too slow
        + [_sample(status=429, error="HTTP 429: slow down")] * 3
        + [_sample(status=503, error="HTTP 503: busy")]
        + [_sample(status=502, error="HTTP 502: bad")]
        + [_sample(status=0, error="TimeoutError()")]
    )
    slo = Slo.parse("ttft=500ms,itl=100ms")
    s = summarize(samples, endpoint="a", step="2 rps", offered_rps=2.0, duration_s=4.0, slo=slo)
    assert (s.sent, s.ok) == (14, 8)
    assert s.goodput_rps == pytest.approx(4 / 4.0)
    assert s.slo_met_share == pytest.approx(4 / 14)
    assert s.request_rps == pytest.approx(8 / 4.0)
    assert s.output_tokens_per_s == pytest.approx(8 * 11 / 4.0)
    assert s.refused == {"429": 3, "503": 1}
    assert s.errors == {"http_502": 1, "TimeoutError": 1}
    assert s.ttft_ms.p50 == pytest.approx(200) and s.ttft_ms.p99 == pytest.approx(900)
    assert s.tpot_ms.p50 == pytest.approx(50)
    assert s.itl_ms.count == 80
    # no objective: every answer counts
    loose = summarize(samples, endpoint="a", step="x", offered_rps=2.0, duration_s=4.0, slo=Slo())
    assert loose.goodput_rps == pytest.approx(2.0)


def test_slo_parses_units_and_refuses_nonsense():
    slo = Slo.parse("ttft=0.5s, itl=100ms,e2e=2000")
    assert (slo.ttft, slo.itl, slo.tpot, slo.e2e) == (0.5, 0.1, 0.0, 2.0)
    assert str(slo) == "ttft=500ms,itl=100ms,e2e=2000ms"
    for bad in ("latency=1ms", "ttft=fast", "ttft=-1ms"):
        with pytest.raises(ValueError):
            Slo.parse(bad)


def test_cost_with_cached_prompt_tokens_and_response_cache_hits():
    """1000 prompt tokens (400 of them from the prefix cache) and 500 completion tokens at input 1,
    cached input 0.5, output 2 USD per million: 1.8e-3 USD fresh; a response-cache hit at the factor 0.1."""
    prices = Prices(PriceTable({"m": Price(input=1.0, cached_input=0.5, output=2.0)}), 0.1, "m")
    miss = _sample(tokens=500, prompt=1000, cached=400, cache="MISS")
    hit = _sample(tokens=500, prompt=1000, cached=400, cache="HIT")
    assert prices.cost_usd(miss) == pytest.approx(1.8e-3)
    assert prices.cost_usd(hit) == pytest.approx(1.8e-4)
    s = summarize([miss, hit], endpoint="a", step="x", offered_rps=1, duration_s=1, slo=Slo(), prices=prices)
    assert s.cost_usd == pytest.approx(1.98e-3)
    assert s.usd_per_million_tokens == pytest.approx(1.98e-3 / 3000 * 1e6)
    assert s.cached_prompt_tokens == 800 and s.cache == {"MISS": 1, "HIT": 1}
    assert s.cache_by_kind == {"fresh": {"MISS": 1, "HIT": 1}}


def test_prices_from_the_edge_config():
    prices = Prices.from_edge_config(REPO / "configs" / "edge.toml", "gemma-3-270m")
    assert prices.table.prices["gemma-3-270m"].output == 0.20
    assert prices.cache_price_factor == 0.1


def test_error_types():
    assert error_type(Stream(status=0, error="ClientConnectorError(x)")) == "ClientConnectorError"
    assert error_type(Stream(status=200, error="error event: b'{}'")) == "error_event"
    assert error_type(Stream(status=200, error="the stream ended without [DONE]")) == "no_done"


# --- soak ------------------------------------------------------------------------------------------------


def test_soak_growth_and_slope():
    times = [float(t) for t in range(0, 3600, 60)]  # an hour, a sample a minute
    series = ProcessSeries(1, times, [100 + t / 3600 * 12 for t in times], [20] * 30 + [30] * 30)
    growth = growth_of("edge", series)
    assert growth.rss_slope_mib_per_h == pytest.approx(12.0)
    assert growth.rss_first_mib == pytest.approx(100 + 2.5 * 60 / 3600 * 12)
    assert growth.rss_growth_mib == pytest.approx(54 * 60 / 3600 * 12)
    assert growth.fds_growth == 10 and growth.fds_slope_per_h > 0
    assert slope([1.0], [2.0]) == 0.0
    assert parse_duration_s("30m") == 1800 and parse_duration_s("2h") == 7200 and parse_duration_s("45") == 45
    assert parse_pid("edge=12") == ("edge", 12)
    with pytest.raises(ValueError):
        parse_pid("12")


def test_pids_from_a_run_folder(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"pids": [os.getpid(), 2**22 + 12345]}))
    named = pids_from_run(tmp_path)
    assert list(named.values()) == [os.getpid()]  # the dead one is left out


def test_the_knee_is_the_highest_rate_where_most_requests_met_the_objectives():
    from bench.load.run import knees

    def step(endpoint, rate, met):
        good, bad = _sample(ttft_s=0.1), _sample(ttft_s=5.0)
        samples = [good] * met + [bad] * (10 - met)
        return summarize(samples, endpoint=endpoint, step=f"{rate:g} rps", offered_rps=rate, duration_s=10,
                         slo=Slo(ttft=1.0))  # fmt: skip

    steps = [step("a", 1, 10), step("a", 2, 9), step("a", 4, 5), step("b", 1, 8), step("a", math.nan, 10)]
    result = knees(steps)
    assert result["a"] == 2 and math.isnan(result["b"])
