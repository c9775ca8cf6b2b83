"""Ask a running topology, as its user would: one streamed answer through the edge, printed as it comes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

import aiohttp

from harness.client import Stream, stream_once
from harness.launcher import RunningTopology
from harness.models import LARGE
from nearshore import tls


async def stream_answer(
    running: RunningTopology,
    question: str,
    max_tokens: int,
    temperature: float = 0.3,
    out: TextIO = sys.stdout,
    model: str = "",
) -> int:
    """Stream one answer on a new connection (the user's own TCP and TLS handshakes included), from
    ``model`` (empty: the topology's chat model, the instruction-tuned one where it serves it)."""
    model = model or running.chat_model
    payload: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model == LARGE:
        # A small base model: a mild penalty keeps it from looping.
        payload["frequency_penalty"] = 0.5
    headers = {"Authorization": f"Bearer {running.api_key}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(ssl=tls.client_context(ca=Path(running.edge_ca)), force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        answer = await stream_once(
            session,
            running.edge_url + "/v1/chat/completions",
            json.dumps(payload).encode(),
            headers,
            Stream(),
            on_text=lambda text: print(text, end="", flush=True, file=out),
        )
    if answer.tokens:
        print("\n", file=out)
    if answer.error:
        print(f"error: {answer.error}", file=sys.stderr)
        return 1
    if answer.usage:
        timing = ", ".join(f"{name};dur={ms:g}" for name, ms in answer.server_timing_ms.items())
        print(
            f"[served by {answer.region or '?'}; first token after {1000 * answer.ttft_s:.0f} ms "
            "(from Lagos, on a new connection), "
            f"{answer.usage.completion_tokens} tokens in {answer.e2e_s:.1f}s]\n[Server-Timing: {timing}]",
            file=out,
        )
    return 0
