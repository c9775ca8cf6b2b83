"""What one tenant's longest prompts cost another user's stream on the same edge.

    python -m bench.edge.long_prompts --prompts 4

Two edges over one pacer: one that estimates prompt tokens (the default) and one that counts them exactly
with a GGUF vocabulary (``[tokenizer] gguf``; the embedded model's, unless ``--gguf`` names another). For
each, a victim streams ``--tokens`` events a few milliseconds apart, first alone, then while a second key
sends ``--prompts`` prompts of nearly the edge's whole body limit, one after another. Printed per edge and
part: the largest gap between the victim's events, its p99, and how many gaps passed 50 ms. Anything the
edge does with a prompt on its event loop shows here as a gap in everyone else's stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench import peers
from bench.peers import Endpoint
from harness.stats import percentile

MODEL = "gemma-3-270m"
WORDS = ("lagos", "weather", "naira", "1234567", "the", "ocean", "cable", "Ωμέγα", "数据")
BODY_LIMIT = 1 << 20  # the edge's default server.max_body_bytes
LONG_GAP_S = 0.05


@dataclass
class Part:
    edge: str
    part: str
    gaps_s: list[float]
    statuses: list[int]

    def line(self) -> str:
        gaps = self.gaps_s or [0.0]
        longest, p99 = max(gaps) * 1000, percentile(gaps, 99) * 1000
        over = sum(g > LONG_GAP_S for g in gaps)
        sent = f"; the long prompts answered {self.statuses}" if self.statuses else ""
        return (
            f"{self.edge:>9} {self.part:<22} longest gap {longest:7.1f} ms  p99 {p99:6.1f} ms  "
            f"gaps over {LONG_GAP_S * 1000:.0f} ms: {over}{sent}"
        )


def long_prompt(size: int, seed: int = 2) -> bytes:
    """A chat request whose body is ``size`` bytes or just under: mixed words, digits and other scripts."""
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(size // 4))
    body = {"model": MODEL, "messages": [{"role": "user", "content": ""}], "max_tokens": 1}
    room = size - len(json.dumps(body).encode())
    while len(json.dumps(text).encode()) - 2 > room:
        text = text[: int(len(text) * 0.98)]
    body["messages"][0]["content"] = text
    return json.dumps(body).encode()


async def _victim(session: aiohttp.ClientSession, edge: Endpoint, tokens: int) -> list[float]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body["max_tokens"] = tokens
    gaps: list[float] = []
    last = 0.0
    async with session.post(edge.url + "/v1/chat/completions", json=body, headers=edge.headers) as r:
        async for line in r.content:
            if line.startswith(b"data:"):
                now = time.perf_counter()
                if last:
                    gaps.append(now - last)
                last = now
    return gaps


async def _flood(session: aiohttp.ClientSession, edge: Endpoint, body: bytes, count: int) -> list[int]:
    statuses = []
    headers = {**edge.headers, "Content-Type": "application/json"}
    for _ in range(count):
        async with session.post(edge.url + "/v1/chat/completions", data=body, headers=headers) as r:
            await r.read()
            statuses.append(r.status)
    return statuses


async def measure(edge: Endpoint, name: str, prompts: int, tokens: int, body: bytes) -> list[Part]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        alone = await _victim(session, edge, tokens)
        victim = asyncio.create_task(_victim(session, edge, tokens))
        await asyncio.sleep(0.1)  # its stream under way
        statuses = await _flood(session, edge, body, prompts)
        beside = await victim
    return [
        Part(name, "alone", alone, []),
        Part(name, f"beside {prompts} long prompts", beside, statuses),
    ]


def run(logs: Path, prompts: int, tokens: int, gguf: str, size: int) -> list[Part]:
    pacer = peers.start_stand_in(logs, "pacer", "pacer", tokens=tokens, interval_ms=5)
    edges: list[tuple[str, Endpoint]] = []
    try:
        edges.append(("estimate", peers.start_edge(logs, "edge-estimate", pacer.url, tls=False)))
        exact = {"tokenizer": {"gguf": gguf}}
        edges.append(("exact", peers.start_edge(logs, "edge-exact", pacer.url, tls=False, sections=exact)))
        body = long_prompt(size)
        parts: list[Part] = []
        for name, edge in edges:
            parts += asyncio.run(measure(edge, name, prompts, tokens, body))
        return parts
    finally:
        for _, edge in edges:
            edge.stop()
        pacer.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.edge.long_prompts", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--prompts", type=int, default=4, help="long prompts sent beside the victim's stream")
    parser.add_argument("--tokens", type=int, default=400, help="events in the victim's stream, 5 ms apart")
    parser.add_argument("--bytes", type=int, default=BODY_LIMIT - 1024, help="each long prompt's body size")
    parser.add_argument(
        "--gguf", default="", help="the exact edge's vocabulary (default: the embedded model's)"
    )
    parser.add_argument("--logs", type=Path, default=None, help="keep the processes' logs here")
    args = parser.parse_args(argv)
    gguf = args.gguf
    if not gguf:
        from regional.model_store import resolve_model_path

        gguf = str(resolve_model_path(""))
    with tempfile.TemporaryDirectory(prefix="nearshore-long-prompts-") as scratch:
        logs = args.logs or Path(scratch)
        for part in run(logs, args.prompts, args.tokens, gguf, args.bytes):
            print(part.line())


if __name__ == "__main__":
    main()
