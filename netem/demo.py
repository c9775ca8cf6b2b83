"""``nearshore demo``: start a regional node on the embedded model and stream one answer to the terminal.

Later the demo grows into the whole topology (a Lagos user, an edge, regions behind emulated links).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from nearshore.procs import ManagedProcess, free_port, nearshore_argv
from nearshore.protocol.sse import iter_data

DEFAULT_QUESTION = "Give three tips for a first visit to Lagos."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", nargs="?", default=DEFAULT_QUESTION, help="what to ask the model")
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--config", metavar="FILE", help="region TOML file (its port is overridden)")


def main(args: argparse.Namespace) -> int:
    logs = Path(tempfile.mkdtemp(prefix="nearshore-demo-"))
    port = free_port()
    argv = nearshore_argv("region", "--port", str(port), *(["--config", args.config] if args.config else []))
    node = ManagedProcess("region", argv, logs / "region.log")
    base = f"http://127.0.0.1:{port}"
    print(f"starting a regional node on the embedded model (log: {logs / 'region.log'}) ...", flush=True)
    started = time.perf_counter()
    with node:
        node.wait_http(f"{base}/health/ready", timeout_s=300)
        print(f"ready in {time.perf_counter() - started:.1f}s at {base}\n", flush=True)
        print(f"> {args.question}\n", flush=True)
        asyncio.run(_stream_answer(base, args.question, args.max_tokens))
    return 0


async def _stream_answer(base: str, question: str, max_tokens: int) -> None:
    payload = {
        "model": "gemma-3-270m",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    first = 0.0
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base}/v1/chat/completions", json=payload) as r,
    ):
        if r.status != 200:
            print(f"error {r.status}: {await r.text()}", file=sys.stderr)
            return
        timing = r.headers.get("Server-Timing", "")
        usage = None
        async for data in iter_data(r.content):
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    first = first or time.perf_counter()
                    print(text, end="", flush=True)
    total = time.perf_counter() - sent
    print("\n")
    if usage:
        tokens = usage["completion_tokens"]
        rate = tokens / (total - (first - sent)) if first and total > first - sent else 0.0
        print(
            f"[{usage['prompt_tokens']} prompt + {tokens} completion tokens; "
            f"first token {1000 * (first - sent):.0f} ms; {rate:.0f} tokens/s; {timing}]"
        )
