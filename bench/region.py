"""``nearshore bench region``: concurrent streaming load on a regional node, beside llama-cpp-python's server.

Both servers get the same model file, thread count and prompts (pre-rendered in the Gemma turn format and
sent to ``/v1/completions``, so both see identical tokens), greedy decoding and the same token budget.
They run one after the other, never at once, so they do not compete for the cores.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench import node_counters, peers
from bench.peers import Endpoint
from harness.client import Stream, stream_once
from harness.stats import percentile
from nearshore.protocol.chat_format import gemma_turns
from nearshore.protocol.schemas import ChatMessage

QUESTIONS = [
    "Explain why the sky is blue.",
    "Write a short story about a lighthouse keeper.",
    "List some tips for learning a new language.",
    "Describe the water cycle.",
    "What makes a good cup of coffee?",
    "Summarise the history of the bicycle.",
    "Explain how a refrigerator works.",
    "Write a poem about the ocean at night.",
    "Give advice to someone starting their first job.",
    "Describe a busy market in Lagos.",
    "How do airplanes stay in the air?",
    "Explain what a neural network is.",
    "Write a letter to a friend about a trip.",
    "What are the benefits of walking every day?",
    "Describe how bread is made.",
    "Explain the rules of football to a child.",
]
# What the constrained runs follow (guided_json): an answer longer than the budget (minItems), so that every
# constrained stream decodes its whole budget as the free ones do; one that closed its JSON early would
# shrink the batch and its run's tokens, and the two modes would no longer compare step for step.
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "points": {"type": "array", "items": {"type": "string", "maxLength": 80}, "minItems": 32},
    },
    "required": ["title", "points"],
    "additionalProperties": False,
}
CONSTRAINED = "+json"  # the suffix of a constrained run's server name
# The peer's defaults add repeat_penalty 1.1, top_k 40, top_p 0.95, min_p 0.05: turn them off.
PEER_GREEDY = {"repeat_penalty": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


@dataclass(frozen=True)
class RegionBench:
    """The run's settings (the command's flags)."""

    concurrency: str  # stream counts, comma-separated
    max_tokens: int  # tokens per stream
    threads: int  # llama.cpp threads, both servers
    model_path: str  # GGUF file ("": the embedded model)
    no_peer: bool  # skip llama-cpp-python's server
    json: str | None  # also write the results here
    logs: str  # folder for server logs ("": a temp folder)
    engine: str = "llama.cpp"  # "gpu": the torch engine too, beside the llama.cpp engine
    schema: bool = False  # each Nearshore server also runs every level constrained to a JSON schema
    repeats: int = 1  # runs of each level per server; with schema, the modes alternate (ABBA)


@dataclass
class LevelResult:
    """One server at one stream count: its runs' streams together (a level run several times)."""

    server: str
    concurrency: int
    wall_s: float
    streams: list[Stream]
    runs_tok_per_s: list[float] = field(default_factory=list)  # each run's throughput
    node: list[dict[str, float]] = field(default_factory=list)  # each run's step counters (ours only)

    def add(self, run: LevelResult) -> None:
        self.wall_s += run.wall_s
        self.streams += run.streams
        self.runs_tok_per_s += run.runs_tok_per_s
        self.node += run.node

    @property
    def ok(self) -> list[Stream]:
        return [s for s in self.streams if not s.error]

    def summary(self) -> dict[str, float]:
        ttfts = [s.ttft_s for s in self.ok]
        gaps = [g for s in self.ok for g in s.gaps_s]
        tokens = sum(s.tokens for s in self.ok)
        runs = self.runs_tok_per_s or [tokens / self.wall_s if self.wall_s else 0.0]
        return {
            "ttft_p50_ms": percentile(ttfts, 50) * 1000,
            "ttft_p99_ms": percentile(ttfts, 99) * 1000,
            "itl_p50_ms": percentile(gaps, 50) * 1000,
            "itl_p99_ms": percentile(gaps, 99) * 1000,
            "tokens": tokens,
            "tok_per_s": statistics.median(runs),
            "errors": len(self.streams) - len(self.ok),
            **(node_counters.step_cost(self.node) if self.node else {}),
        }


def _body(index: int, max_tokens: int, extra: dict) -> bytes:
    question = QUESTIONS[index % len(QUESTIONS)]
    prompt = gemma_turns([ChatMessage(role="user", content=question)])
    payload = {"model": peers.MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    return json.dumps({**payload, "stream": True, **extra}).encode()


async def drive(server: Endpoint, concurrency: int, max_tokens: int, extra: dict) -> LevelResult:
    """``concurrency`` streams at once, one per question in turn."""
    streams = [Stream() for _ in range(concurrency)]
    url = server.url + "/v1/completions"
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.perf_counter()
        await asyncio.gather(
            *(
                stream_once(session, url, _body(i, max_tokens, extra), server.headers, stream)
                for i, stream in enumerate(streams)
            )
        )
        wall = time.perf_counter() - started
    tokens = sum(s.tokens for s in streams if not s.error)
    return LevelResult(server.name, concurrency, wall, streams, [tokens / wall if wall else 0.0])


def run(bench: RegionBench) -> list[LevelResult]:
    """Each server in turn over every level; print the table; return every level's streams."""
    from regional.model_store import resolve_model_path  # the region extra: only this command needs it

    levels = [int(x) for x in bench.concurrency.split(",") if x]
    model_path = str(resolve_model_path(bench.model_path))
    logs = Path(bench.logs or tempfile.mkdtemp(prefix="nearshore-bench-"))
    logs.mkdir(parents=True, exist_ok=True)
    sequences = max(16, max(levels))
    schema = {"guided_json": JSON_SCHEMA} if bench.schema else None
    # (start it, fields for every request, fields of the constrained runs, one of our nodes)
    servers: list[tuple[Callable[[], Endpoint], dict, dict | None, bool]] = [
        (lambda: peers.start_region(logs, model_path, bench.threads, sequences), {}, schema, True)
    ]
    if bench.engine == "gpu":
        gpu = lambda: peers.start_region(logs, model_path, bench.threads, sequences, "gpu")  # noqa: E731
        servers.append((gpu, {}, schema, True))
    if not bench.no_peer:
        peer = lambda: peers.start_llama_cpp_server(logs, model_path, bench.threads)  # noqa: E731
        servers.append((peer, PEER_GREEDY, None, False))
    results: list[LevelResult] = []
    for start, extra, constrained, ours in servers:
        results += _run_server(start(), levels, bench, extra, constrained, ours)
    _print_table(results, levels)
    if bench.json:
        rows = [{"server": r.server, "concurrency": r.concurrency, **r.summary()} for r in results]
        Path(bench.json).write_text(json.dumps(rows, indent=2))
    print(f"server logs: {logs}")
    return results


def _run_server(
    server: Endpoint,
    levels: list[int],
    bench: RegionBench,
    extra: dict,
    constrained: dict | None = None,
    ours: bool = True,
) -> list[LevelResult]:
    """Every level on ``server``, ``bench.repeats`` times; with ``constrained``, each run again with those
    fields, the two modes alternating (ABBA: neither always meets the machine first) on one process."""
    modes = [("", extra)] + ([(CONSTRAINED, {**extra, **constrained})] if constrained else [])
    merged: dict[tuple[str, int], LevelResult] = {}
    try:
        for _suffix, fields in modes:
            asyncio.run(drive(server, 1, 4, fields))  # warm-up (and the grammar engine's vocabulary)
        for level in levels:
            for repeat in range(bench.repeats):
                for suffix, fields in modes if repeat % 2 == 0 else modes[::-1]:
                    before = node_counters.read(server.url) if ours else None
                    result = asyncio.run(drive(server, level, bench.max_tokens, fields))
                    if before is not None:
                        result.node.append(node_counters.delta(before, node_counters.read(server.url)))
                    result.server += suffix
                    _print_run(result)
                    key = (result.server, level)
                    if key in merged:
                        merged[key].add(result)
                    else:
                        merged[key] = result
    finally:
        server.stop()
    return list(merged.values())


def _print_run(result: LevelResult) -> None:
    s = result.summary()
    step = f"  step {s['step_ms']:5.1f} ms" if "step_ms" in s else ""
    print(
        f"  {result.server:>18} x{result.concurrency:<3} {s['tok_per_s']:7.1f} tok/s  "
        f"itl p50 {s['itl_p50_ms']:6.1f} ms  ttft p99 {s['ttft_p99_ms']:8.0f} ms{step}",
        flush=True,
    )


def paired_step_ratios(constrained: LevelResult, free: LevelResult) -> list[float]:
    """Each repeat's constrained step time over its free one's (the pair ran back to back): a machine
    that slows for a while slows both of a pair, so the median of the ratios is steadier than the means'."""
    ratios = []
    for a, b in zip(constrained.node, free.node, strict=False):
        mine, theirs = node_counters.step_cost([a])["step_ms"], node_counters.step_cost([b])["step_ms"]
        if mine and theirs:
            ratios.append(mine / theirs)
    return ratios


def _print_table(results: list[LevelResult], levels: list[int]) -> None:
    header = (
        f"{'server':>18} {'streams':>7} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'tok/s':>7} {'err':>3}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    by_key = {(r.server, r.concurrency): r.summary() for r in results}
    for r in results:
        s = by_key[(r.server, r.concurrency)]
        print(
            f"{r.server:>18} {r.concurrency:>7} {s['ttft_p50_ms']:8.0f}ms {s['ttft_p99_ms']:8.0f}ms "
            f"{s['itl_p50_ms']:6.1f}ms {s['itl_p99_ms']:6.1f}ms {s['tok_per_s']:7.1f} {s['errors']:>3}"
        )
    for level in levels:
        gpu, ours = by_key.get(("nearshore-gpu", level)), by_key.get(("nearshore", level))
        if gpu and ours and ours["tok_per_s"] and gpu["ttft_p99_ms"]:
            print(
                f"x{level}: the torch engine's throughput {gpu['tok_per_s'] / ours['tok_per_s']:.2f}x the "
                f"llama.cpp engine's; TTFT p99 {gpu['ttft_p99_ms'] / ours['ttft_p99_ms']:.1f}x its"
            )
    runs = {(r.server, r.concurrency): r for r in results}
    for (name, level), s in by_key.items():
        free = by_key.get((name.removesuffix(CONSTRAINED), level))
        if name.endswith(CONSTRAINED) and free and free["tok_per_s"] and free["itl_p50_ms"]:
            print(
                f"x{level} {name}: constrained to a JSON schema, {s['tok_per_s'] / free['tok_per_s']:.2f}x "
                f"the throughput and {s['itl_p50_ms'] / free['itl_p50_ms']:.2f}x the ITL p50 of the same "
                "streams unconstrained"
            )
            if s.get("step_ms") and free.get("step_ms"):
                print(
                    f"x{level} {name}: a step {s['step_ms']:.1f} ms against {free['step_ms']:.1f} ms "
                    f"unconstrained ({s['step_ms'] / free['step_ms']:.2f}x); the grammar "
                    f"{s['grammar_us_per_token']:.0f} us a token, {s['grammar_share'] * 100:.1f}% of the "
                    "step time (its masks on their own thread, beside the model)"
                )
            ratios = paired_step_ratios(runs[(name, level)], runs[(name.removesuffix(CONSTRAINED), level)])
            if len(ratios) > 1:
                print(
                    f"x{level} {name}: step time over the free run of the same repeat, median "
                    f"{statistics.median(ratios):.2f}x (from {min(ratios):.2f}x to {max(ratios):.2f}x, "
                    f"{len(ratios)} pairs)"
                )
    for level in levels:
        ours, peer = by_key.get(("nearshore", level)), by_key.get(("llama_cpp.server", level))
        if ours and peer and peer["tok_per_s"] and ours["ttft_p99_ms"]:
            print(
                f"x{level}: throughput {ours['tok_per_s'] / peer['tok_per_s']:.2f}x the peer's; "
                f"TTFT p99 {peer['ttft_p99_ms'] / ours['ttft_p99_ms']:.1f}x lower"
            )
