"""``bench cache``'s TTFT part: a cache hit through an edge against a miss, and a miss against an edge with
no cache at all, in front of a region whose first byte takes a Lagos-London round trip.

The edge with a cache uses the folder ``bench/cache/lookup.py`` filled (its bench partition holds every
stored question of the labelled set among 100k rows, say), so a hit is found in a partition of that size.
Four kinds of streamed requests, interleaved round by round so that drift on a busy machine hits all alike:
an exact repeat of a stored question, a paraphrase of one (a semantic hit, racing the region's first byte),
a question never stored (``Cache-Control: no-store``, so it stays a miss), and the same miss through the
edge without a cache. A response that carries no region header was answered by the cache. What a miss
costs is read from each round's pair (the two misses sent one after the other, in turns first): the median
of the differences with its 95% bootstrap interval, and the edge's own time before the request left for
the region (``Server-Timing: edge``) beside it, which the region's and the client's noise do not reach.
Last, the CPU an edge spends on a huge question (about 850 KB, what an attacker may send): with the cache
on and off, counted from the edge process's own accounting over the request and the store after it.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from bench import peers
from bench.cache.lookup import BENCH_MAX_TOKENS, BENCH_MODEL, JUDGED_AT
from bench.edge.request import session_for
from harness.client import Stream, stream_once
from harness.stats import percentile

LAGOS_LONDON_RTT_MS = 100.0  # configs/netem/lagos-london.toml


@dataclass
class TtftBench:
    folder: Path  # a filled cache folder (bench/cache/lookup.py)
    rows: int
    stored: list[str]  # questions stored in it
    paraphrases: list[str]  # paraphrases of stored questions that the cache answers
    requests: int = 100  # per kind
    rtt_ms: float = LAGOS_LONDON_RTT_MS
    logs: str = ""
    audit: bool = True  # False: the edges with a cache audit no semantic hit
    judged: list[str] = field(default_factory=list)  # paraphrases only the pair judge accepts


def _body(question: str) -> bytes:
    return json.dumps(
        {
            "model": BENCH_MODEL,
            "messages": [{"role": "user", "content": question}],
            "temperature": 0,
            "max_tokens": BENCH_MAX_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


async def _one(session: aiohttp.ClientSession, edge: peers.Endpoint, question: str, store: bool) -> Stream:
    headers = edge.headers if store else {**edge.headers, "Cache-Control": "no-store"}
    return await stream_once(session, edge.url + "/v1/chat/completions", _body(question), headers, Stream())


def _summary(streams: list[Stream]) -> dict:
    ok = [s for s in streams if not s.error and s.status == 200]
    ttft_ms = np.array([s.ttft_s * 1e3 for s in ok]) if ok else np.array([np.nan])
    cache_ms = [s.server_timing_ms["cache"] for s in ok if "cache" in s.server_timing_ms]
    edge_ms = [s.server_timing_ms["edge"] for s in ok if s.region and "edge" in s.server_timing_ms]
    return {
        "requests": len(streams),
        "errors": len(streams) - len(ok),
        "answered_by_cache": sum(1 for s in ok if not s.region),
        "ttft_p50_ms": round(percentile(ttft_ms, 50), 2),
        "ttft_p99_ms": round(percentile(ttft_ms, 99), 2),
        "cache_dur_p50_ms": round(percentile(cache_ms, 50), 2) if cache_ms else None,
        # the edge's time before the request left for the region (a forwarded request's Server-Timing)
        "edge_p50_ms": round(percentile(edge_ms, 50), 3) if edge_ms else None,
        "edge_p99_ms": round(percentile(edge_ms, 99), 3) if edge_ms else None,
    }


BOOTSTRAP_DRAWS = 2000


def paired_cost(on: list[Stream], off: list[Stream], seed: int = 0) -> dict:
    """What the cache adds to a miss, from the rounds' pairs (a miss with the cache, the same question
    without it): the median difference in TTFT with its 95% bootstrap interval, the 99th percentile of
    the differences, and the same median for the edge's own time before forwarding."""
    pairs = [(a, b) for a, b in zip(on, off, strict=True) if a.status == b.status == 200]
    pairs = [(a, b) for a, b in pairs if not a.error and not b.error]
    if not pairs:
        return {"pairs": 0}
    ttft = np.array([(a.ttft_s - b.ttft_s) * 1e3 for a, b in pairs])
    draws = np.random.default_rng(seed).choice(ttft, (BOOTSTRAP_DRAWS, len(ttft)))
    low, high = np.percentile(np.median(draws, axis=1), [2.5, 97.5])
    edge = [
        a.server_timing_ms["edge"] - b.server_timing_ms["edge"]
        for a, b in pairs
        if "edge" in a.server_timing_ms and "edge" in b.server_timing_ms
    ]
    return {
        "pairs": len(pairs),
        "ttft_median_ms": round(float(np.median(ttft)), 3),
        "ttft_median_ci95_ms": [round(float(low), 3), round(float(high), 3)],
        "ttft_p99_ms": round(percentile(ttft, 99), 3),
        "edge_median_ms": round(float(np.median(edge)), 3) if edge else None,
    }


async def _measure(
    edge_on: peers.Endpoint, edge_fp32: peers.Endpoint, edge_off: peers.Endpoint, bench: TtftBench
) -> dict:
    kinds = ("exact hit", "semantic hit", "semantic hit, fp32 embedder", "miss, cache on", "miss, cache off")
    kinds += ("semantic hit, judged",) if bench.judged else ()
    results: dict[str, list[Stream]] = {k: [] for k in kinds}
    async with session_for(edge_on) as on, session_for(edge_fp32) as fp32, session_for(edge_off) as off:
        for i in range(5):  # warm: connections, the edge's embedder, the partition's files and index
            await _one(on, edge_on, bench.paraphrases[i % len(bench.paraphrases)], store=False)
            await _one(fp32, edge_fp32, bench.paraphrases[i % len(bench.paraphrases)], store=False)
            await _one(off, edge_off, f"warm-up question {i}", store=False)
        for i in range(bench.requests):
            miss = f"What was the price of cement in Kumasi on day {i} of the {bench.rows} day survey?"
            results["exact hit"].append(await _one(on, edge_on, bench.stored[i % len(bench.stored)], False))
            paraphrase = bench.paraphrases[i % len(bench.paraphrases)]
            results["semantic hit"].append(await _one(on, edge_on, paraphrase, False))
            results["semantic hit, fp32 embedder"].append(await _one(fp32, edge_fp32, paraphrase, False))
            if bench.judged:  # a candidate the verifier cannot explain: the judge reads the pair
                judged = bench.judged[i % len(bench.judged)]
                results["semantic hit, judged"].append(await _one(on, edge_on, judged, False))
            misses = [("miss, cache on", on, edge_on), ("miss, cache off", off, edge_off)]
            for kind, session, edge in misses if i % 2 == 0 else reversed(misses):  # each goes first in turn
                results[kind].append(await _one(session, edge, miss, store=False))
        huge = await _huge_question_cpu(on, edge_on, off, edge_off)
    cost = paired_cost(results["miss, cache on"], results["miss, cache off"])
    return {kind: _summary(streams) for kind, streams in results.items()} | {
        "huge question": huge,
        "miss cost": cost,
    }


HUGE_REPEATS = 3
SETTLE_S = 1.0  # the store (and, before it was bounded, the embedding) happen after the answer


async def _huge_question_cpu(
    on: aiohttp.ClientSession, edge_on: peers.Endpoint, off: aiohttp.ClientSession, edge_off: peers.Endpoint
) -> dict:
    """CPU seconds of the edge per huge question (a new one each time), cache on against cache off."""
    seconds: dict[str, list[float]] = {"cache on": [], "cache off": []}
    for i in range(HUGE_REPEATS):
        text = (
            f"Please proofread letter {i}. "
            + "Our harvest was late this year and the rains came early. " * 15_000
        )
        for label, session, edge in (("cache on", on, edge_on), ("cache off", off, edge_off)):
            before = edge.cpu_s()
            await _one(session, edge, text, store=True)
            await asyncio.sleep(SETTLE_S)
            seconds[label].append(edge.cpu_s() - before)
    return {
        "bytes": len(text.encode()),
        "repeats": HUGE_REPEATS,
        **{label: round(percentile(values, 50), 3) for label, values in seconds.items()},
    }


def run(bench: TtftBench) -> dict:
    with tempfile.TemporaryDirectory(prefix="nearshore-bench-cache-ttft-") as tmp:
        logs = Path(bench.logs or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        started: list[peers.Endpoint] = []
        try:
            pacer = peers.start_stand_in(
                logs, "pacer", "pacer", tokens=BENCH_MAX_TOKENS, interval_ms=bench.rtt_ms
            )
            started.append(pacer)
            # judged hits served as in a partition the audit opened all the way (bench/cache/lookup.py)
            cache: dict[str, object] = {
                "folder": str(bench.folder),
                "size_limit_mb": 1 << 16,
                "judge_threshold": JUDGED_AT,
            }
            if not bench.audit:
                cache |= {"audit_first_hits": 0, "audit_share": 0.0}
            edge_on = peers.start_edge(logs, "edge-cache", pacer.url, tls=True, cache=cache)
            started.append(edge_on)
            # The same folder through an edge that embeds in fp32: the int8 default's gain, in the same run.
            fp32 = cache | {"embedder_backend": "auto"}
            edge_fp32 = peers.start_edge(logs, "edge-cache-fp32", pacer.url, tls=True, cache=fp32)
            started.append(edge_fp32)
            edge_off = peers.start_edge(logs, "edge-no-cache", pacer.url, tls=True, cache={"enabled": False})
            started.append(edge_off)
            t = time.perf_counter()
            kinds = asyncio.run(_measure(edge_on, edge_fp32, edge_off, bench))
            return {
                "rows": bench.rows,
                "rtt_ms": bench.rtt_ms,
                "audit": bench.audit,
                "seconds": round(time.perf_counter() - t, 1),
            } | {"kinds": kinds}
        finally:
            for endpoint in reversed(started):
                endpoint.stop()
