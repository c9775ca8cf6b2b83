"""Fair shares through a real region (llama.cpp, the embedded model): a short chat from key B is admitted and
answered while key A's long prompts hold the KV memory and more of them wait, instead of behind them all.

The node's KV memory holds two of A's prompts (and their completion budgets) and B's chat beside them, not a
third of A's. First come first served, B would wait at the head of the queue behind A's third until one of
A's first two finished; by share key it goes first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest

from nearshore.protocol.headers import SHARE_KEY
from tests.conftest import MODEL, Node, start_region

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    region = start_region(
        tmp_path_factory.mktemp("fair"),
        engine={
            "max_sequences": 8,
            "kv_cache_tokens": 1024,
            "context_window": 512,
            "batch_tokens": 512,
            "prefill_chunk": 128,
            "max_waiting": 16,
        },
    )
    yield region
    region.process.stop()


def long_prompt(i: int) -> str:
    return f"Document {i}. " + "".join(f"{n} apples, " for n in range(80))  # about 400 tokens


async def timed(s: aiohttp.ClientSession, node: Node, body: dict, share: str | None) -> tuple[float, float]:
    """(first token, end) in perf_counter seconds, of one streamed completion."""
    headers = {SHARE_KEY: share} if share else {}
    first = 0.0
    async with s.post(node.url + "/v1/completions", json={**body, "stream": True}, headers=headers) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: {") and not first:
                first = time.perf_counter()
    return first, time.perf_counter()


async def flood_then_chat(node: Node, flood_key: str | None, chat_key: str | None) -> tuple[list, tuple]:
    long = {"model": MODEL, "max_tokens": 16, "temperature": 0}
    chat = {"model": MODEL, "prompt": "Hello, how are", "max_tokens": 8, "temperature": 0}
    async with aiohttp.ClientSession() as s:
        flood = [
            asyncio.create_task(timed(s, node, {**long, "prompt": long_prompt(i)}, flood_key))
            for i in range(4)
        ]
        await asyncio.sleep(0.3)  # all four are queued or running when the chat arrives
        victim = await timed(s, node, chat, chat_key)
        return list(await asyncio.gather(*flood)), victim


async def test_a_short_chat_from_another_key_is_answered_before_the_flood_ends(node: Node):
    flood, (first_token, done) = await flood_then_chat(node, "key-a", "key-b")
    # B was admitted beside A's first two and prefilled first in its round: answered before any of A's ended.
    assert done < min(end for _, end in flood)
    assert first_token < sorted(first for first, _ in flood)[2]  # before A's queued prompts began


async def test_without_share_keys_the_chat_waits_behind_the_queue(node: Node):
    flood, (first_token, _) = await flood_then_chat(node, None, None)
    # The same load, one share for all: the chat waits at the head of the queue for one of A's to end.
    assert first_token > min(end for _, end in flood)
