"""``nearshore bench region-rss``: a regional node's memory over many scoring requests (issue 34 N6).

A real region (llama.cpp, the embedded model) answers ``--requests`` completions with ``echo`` and
``logprobs=20``, each a distinct prompt of about ``--prompt-words`` words (one after another: memory, not
speed). The node's resident memory (``VmRSS``) is read before the first, every ``--every`` requests, and after
the last. Printed: the samples, the growth over the run, and the growth per request over its second half
(where a bounded cache has reached its bound): flat is the promise. Other request kinds for comparison:
``--kind chat`` sends short chats instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from bench import peers

MODEL = peers.MODEL


@dataclass(frozen=True)
class RssBench:
    requests: int = 1000
    every: int = 100
    prompt_words: int = 120
    kind: str = "echo"  # "echo": echo + logprobs=20 completions; "chat": short chats
    threads: int = 0
    logs: str = ""
    json: str | None = None


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def body(bench: RssBench, n: int) -> tuple[str, dict]:
    if bench.kind == "chat":
        chat = {"model": MODEL, "messages": [{"role": "user", "content": f"Say hello to guest {n}."}]}
        return "/v1/chat/completions", {**chat, "max_tokens": 8, "temperature": 0}
    prompt = f"Entry {n}: " + " ".join(f"word{(n * 7 + i) % 997}" for i in range(bench.prompt_words))
    payload = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 20}
    return "/v1/completions", payload


async def load(bench: RssBench, url: str, pid: int) -> list[tuple[int, float]]:
    samples = [(0, rss_mb(pid))]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        for n in range(1, bench.requests + 1):
            path, payload = body(bench, n)
            async with s.post(url + path, json=payload) as r:
                answer = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"request {n}: HTTP {r.status}: {answer[:300]!r}")
            if n % bench.every == 0 or n == bench.requests:
                samples.append((n, rss_mb(pid)))
    return samples


def run(bench: RssBench) -> dict:
    from regional.model_store import resolve_model_path  # the region extra: only this command needs it

    with tempfile.TemporaryDirectory(prefix="bench-rss-") as scratch:
        logs = Path(bench.logs or scratch)
        logs.mkdir(parents=True, exist_ok=True)
        node = peers.start_region(logs, str(resolve_model_path("")), bench.threads, 4)
        try:
            pid = node.process.proc.pid
            samples = asyncio.run(load(bench, node.url, pid))
        finally:
            node.process.stop()
    half = [s for s in samples if s[0] >= bench.requests // 2]
    (n0, mb0), (n1, mb1) = half[0], half[-1]
    return {
        "settings": asdict(bench),
        "samples": samples,
        "growth_mb": round(samples[-1][1] - samples[0][1], 1),
        "second_half_kb_per_request": round((mb1 - mb0) * 1024 / max(n1 - n0, 1), 2),
    }


def format_report(report: dict) -> str:
    lines = [f"region RSS over {report['settings']['requests']} {report['settings']['kind']} requests:"]
    lines += [f"  after {n:>5}: {mb:8.1f} MB" for n, mb in report["samples"]]
    lines.append(f"  growth: {report['growth_mb']} MB in all")
    lines.append(f"  second half: {report['second_half_kb_per_request']} KB per request")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=1000, help="requests in all (default 1000)")
    parser.add_argument("--every", type=int, default=100, help="read RSS every this many (default 100)")
    parser.add_argument("--prompt-words", type=int, default=120, help="words per prompt (default 120)")
    parser.add_argument("--kind", choices=("echo", "chat"), default="echo", help="request kind (echo)")
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: one per core)")
    parser.add_argument("--logs", default="", help="keep the region's log here")
    parser.add_argument("--json", default=None, help="also write the report here")


def run_and_print(args: argparse.Namespace) -> int:
    bench = RssBench(
        args.requests, args.every, args.prompt_words, args.kind, args.threads, args.logs, args.json
    )
    report = run(bench)
    print(format_report(report))
    if bench.json:
        Path(bench.json).write_text(json.dumps(report, indent=2))
    return 0
