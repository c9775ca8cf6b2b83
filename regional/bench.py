"""``nearshore bench region``: concurrent streaming load on a regional node, beside llama-cpp-python's server.

Both servers get the same model file, thread count and prompts (pre-rendered in the Gemma turn format and
sent to ``/v1/completions``, so both see identical tokens), greedy decoding and the same token budget.
They run one after the other, never at once, so they do not compete for the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from nearshore.procs import ManagedProcess, free_port, nearshore_argv
from nearshore.protocol.sse import iter_data
from nearshore.stats import percentile
from regional.model_store import resolve_model_path

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


@dataclass
class StreamResult:
    ttft_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


@dataclass
class LevelResult:
    server: str
    concurrency: int
    wall_s: float
    streams: list[StreamResult]

    @property
    def ok(self) -> list[StreamResult]:
        return [s for s in self.streams if not s.error]

    def summary(self) -> dict[str, float]:
        ttfts = [s.ttft_s for s in self.ok]
        gaps = [g for s in self.ok for g in s.gaps_s]
        tokens = sum(s.tokens for s in self.ok)
        return {
            "ttft_p50_ms": percentile(ttfts, 50) * 1000,
            "ttft_p99_ms": percentile(ttfts, 99) * 1000,
            "itl_p50_ms": percentile(gaps, 50) * 1000,
            "itl_p99_ms": percentile(gaps, 99) * 1000,
            "tokens": tokens,
            "tok_per_s": tokens / self.wall_s if self.wall_s else 0.0,
            "errors": len(self.streams) - len(self.ok),
        }


async def _one_stream(session: aiohttp.ClientSession, url: str, payload: dict, result: StreamResult) -> None:
    started = time.perf_counter()
    last = 0.0
    try:
        async with session.post(url, json=payload) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return
            async for data in iter_data(response.content):
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                choices = chunk.get("choices") or []
                if not choices or not choices[0].get("text"):
                    continue
                now = time.perf_counter()
                if result.tokens == 0:
                    result.ttft_s = now - started
                else:
                    result.gaps_s.append(now - last)
                last = now
                result.tokens += 1
    except (TimeoutError, aiohttp.ClientError) as exc:
        result.error = repr(exc)


async def drive(base_url: str, model: str, concurrency: int, max_tokens: int, extra: dict) -> LevelResult:
    results = [StreamResult() for _ in range(concurrency)]
    timeout = aiohttp.ClientTimeout(total=1800)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(
            *(
                _one_stream(session, f"{base_url}/v1/completions", _payload(model, i, max_tokens, extra), r)
                for i, r in enumerate(results)
            )
        )
        wall = time.perf_counter() - started
    return LevelResult("", concurrency, wall, results)


def _payload(model: str, index: int, max_tokens: int, extra: dict) -> dict:
    question = QUESTIONS[index % len(QUESTIONS)]
    from nearshore.protocol.schemas import ChatMessage
    from regional.chat_template import gemma_turns  # needs jinja2, a region extra

    prompt = gemma_turns([ChatMessage(role="user", content=question)])
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        **extra,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency", default="1,4,16", help="comma-separated stream counts (default 1,4,16)"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per stream (default 64)")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 2, help="llama.cpp threads, both servers"
    )
    parser.add_argument("--model-path", default="", help="GGUF file (default: the embedded model)")
    parser.add_argument("--no-peer", action="store_true", help="skip llama-cpp-python's server")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--logs", default="", help="folder for server logs (default: a temp folder)")


def main(args: argparse.Namespace) -> int:
    levels = [int(x) for x in args.concurrency.split(",") if x]
    model_path = str(resolve_model_path(args.model_path))
    logs = Path(args.logs or tempfile.mkdtemp(prefix="nearshore-bench-"))
    results: list[LevelResult] = []
    results += _run_server(
        "nearshore", _nearshore_server(model_path, args, logs, max(levels)), levels, args, {}
    )
    if not args.no_peer:
        # The peer's defaults add repeat_penalty 1.1, top_k 40, top_p 0.95, min_p 0.05: turn them off.
        peer_extra = {"repeat_penalty": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
        results += _run_server(
            "llama_cpp.server", _peer_server(model_path, args, logs), levels, args, peer_extra
        )
    _print_table(results, levels)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [{"server": r.server, "concurrency": r.concurrency, **r.summary()} for r in results], indent=2
            )
        )
    print(f"server logs: {logs}")
    return 0


def _nearshore_server(model_path: str, args: argparse.Namespace, logs: Path, streams: int) -> tuple:
    port = free_port()
    config = logs / "region.toml"
    config.write_text(
        f'[server]\nport = {port}\n[model]\npath = "{model_path}"\n'
        f"[engine]\nn_threads = {args.threads}\nmax_sequences = {max(16, streams)}\n"
    )
    process = ManagedProcess(
        "nearshore region", nearshore_argv("region", "--config", str(config)), logs / "region.log"
    )
    return process, f"http://127.0.0.1:{port}", "gemma-3-270m", "/health/ready"


def _peer_server(model_path: str, args: argparse.Namespace, logs: Path) -> tuple:
    port = free_port()
    argv = [
        os.sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        model_path,
        "--model_alias",
        "gemma-3-270m",
        "--n_threads",
        str(args.threads),
        "--n_threads_batch",
        str(args.threads),
        "--n_ctx",
        "4096",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--interrupt_requests",
        "False",
    ]
    return (
        ManagedProcess("llama_cpp.server", argv, logs / "peer.log"),
        f"http://127.0.0.1:{port}",
        "gemma-3-270m",
        "/v1/models",
    )


def _run_server(
    name: str, server: tuple, levels: list[int], args: argparse.Namespace, extra: dict
) -> list[LevelResult]:
    process, base_url, model, ready_path = server
    out = []
    with process:
        process.wait_http(base_url + ready_path)
        asyncio.run(drive(base_url, model, 1, 4, extra))  # warm-up
        for level in levels:
            result = asyncio.run(drive(base_url, model, level, args.max_tokens, extra))
            result.server = name
            out.append(result)
            s = result.summary()
            print(
                f"  {name:>18} x{level:<3} {s['tok_per_s']:7.1f} tok/s  ttft p99 {s['ttft_p99_ms']:8.0f} ms",
                flush=True,
            )
    return out


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
        ours, peer = by_key.get(("nearshore", level)), by_key.get(("llama_cpp.server", level))
        if ours and peer and peer["tok_per_s"] and ours["ttft_p99_ms"]:
            print(
                f"x{level}: throughput {ours['tok_per_s'] / peer['tok_per_s']:.2f}x the peer's; "
                f"TTFT p99 {peer['ttft_p99_ms'] / ours['ttft_p99_ms']:.1f}x lower"
            )
