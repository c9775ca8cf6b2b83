"""``nearshore chat``: stream an answer through the running topology's edge, as the Lagos user would."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

from nearshore import tls
from nearshore.protocol.sse import iter_data
from netem.launcher import RunningTopology

MODEL = "gemma-3-270m"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", help="what to ask")
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--temperature", type=float, default=0.3)
    parser.add_argument("--state", type=Path, help="a topology's state.json (default: the one `up` started)")


def main(args: argparse.Namespace) -> int:
    try:
        running = RunningTopology.load(args.state)
    except FileNotFoundError as exc:
        print(f"nearshore chat: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(stream_answer(running, args.question, args.max_tokens, args.temperature))


async def stream_answer(
    running: RunningTopology, question: str, max_tokens: int, temperature: float = 0.3, out=sys.stdout
) -> int:
    """Stream one answer on a new connection (the user's own TCP and TLS handshakes included)."""
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": 1,
        # The embedded model is a small base model: a mild penalty keeps it from looping.
        "frequency_penalty": 0.5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    connector = aiohttp.TCPConnector(ssl=tls.client_context(ca=Path(running.edge_ca)), force_close=True)
    sent = time.perf_counter()
    first = 0.0
    usage = None
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(
            running.edge_url + "/v1/chat/completions",
            json=payload,
            headers={"Authorization": f"Bearer {running.api_key}"},
        ) as r,
    ):
        if r.status != 200:
            print(f"error {r.status}: {await r.text()}", file=sys.stderr)
            return 1
        region, timing = r.headers.get("x-nearshore-region", "?"), r.headers.get("Server-Timing", "")
        async for data in iter_data(r.content):
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    first = first or time.perf_counter()
                    print(text, end="", flush=True, file=out)
    total = time.perf_counter() - sent
    print("\n", file=out)
    if usage:
        print(
            f"[served by {region}; first token after {1000 * (first - sent):.0f} ms "
            "(from Lagos, on a new connection), "
            f"{usage['completion_tokens']} tokens in {total:.1f}s]\n[Server-Timing: {timing}]",
            file=out,
        )
    return 0
