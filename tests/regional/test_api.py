"""The regional node over real HTTP with the real model: answers, streams, stops, aborts, concurrency."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import aiohttp
import pytest

from nearshore.protocol.sse import iter_data
from tests.conftest import MODEL, Node

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Describe the city of Lagos in a few sentences."}]


async def post(url: str, payload: dict) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as s, s.post(url, json=payload) as r:
        return r.status, r.headers.copy(), await r.json(content_type=None)


async def stream(
    url: str, payload: dict, headers: dict[str, str] | None = None
) -> tuple[list[dict], list[float], dict]:
    """All SSE payloads of one streamed answer, with their arrival times."""
    chunks, times = [], []
    async with (
        aiohttp.ClientSession() as s,
        s.post(url, json={**payload, "stream": True}, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        async for data in iter_data(r.content):
            times.append(time.perf_counter())
            chunks.append({"done": True} if data == b"[DONE]" else json.loads(data))
        return chunks, times, r.headers.copy()


def chat_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


async def metric(node: Node, name: str, label: str = "") -> float:
    async with aiohttp.ClientSession() as s, s.get(node.url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def aborted_count(node: Node) -> float:
    return await metric(node, "nearshore:request_success_total", 'finished_reason="abort"')


async def wait_for_one_abort(node: Node, aborted_before: float, timeout_s: float = 5.0) -> None:
    """The node stopped decoding for a client that left: nothing running, one more abort counted."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = await metric(node, "nearshore:num_requests_running")
        aborted = await aborted_count(node)
        if running == 0 and aborted == aborted_before + 1:
            return
        await asyncio.sleep(0.05)
    assert (running, aborted) == (0, aborted_before + 1)


async def test_models_health_and_readiness(region: Node):
    async with aiohttp.ClientSession() as s:
        async with s.get(region.url + "/v1/models") as r:
            ids = [m["id"] for m in (await r.json())["data"]]
        async with s.get(region.url + "/health") as r:
            health = await r.json()
        async with s.get(region.url + "/health/ready") as r:
            assert r.status == 200
    assert MODEL in ids
    assert health["status"] == "ok" and health["model"] == "ready"


async def test_chat_answer_has_usage_and_headers(region: Node):
    status, headers, body = await post(
        region.url + "/v1/chat/completions",
        {"model": MODEL, "messages": QUESTION, "max_tokens": 12, "temperature": 0},
    )
    assert status == 200, body
    choice = body["choices"][0]
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].strip()
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert usage["prompt_tokens"] > 10
    assert "prefill;dur=" in headers["Server-Timing"] and headers["x-request-id"]
    assert headers["Server"] == "nearshore"  # no Python or aiohttp version


async def test_request_id_is_propagated(region: Node):
    _, headers, body = await post_with_id(region, "trace-abc.123")
    assert headers["x-request-id"] == "trace-abc.123" and body["id"] == "chatcmpl-trace-abc.123"


async def test_a_callers_id_never_addresses_another_request(region: Node):
    """Two callers chose the same x-request-id; the first leaving must not abort the second's generation."""
    payload = {"model": MODEL, "messages": QUESTION, "max_tokens": 24, "temperature": 0, "stream": True}
    headers = {"x-request-id": "everyone-uses-this"}
    async with aiohttp.ClientSession() as s:
        survivor = asyncio.create_task(stream(region.url + "/v1/chat/completions", payload, headers=headers))
        async with s.post(region.url + "/v1/chat/completions", json=payload, headers=headers) as leaver:
            await leaver.content.readline()  # it has started; now it leaves
        chunks, _, _ = await survivor
    assert chunks[-1] == {"done": True}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"  # all 24 tokens, not an abort


async def post_with_id(node: Node, request_id: str) -> tuple[int, dict, dict]:
    payload = {"model": MODEL, "messages": QUESTION, "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as s,
        s.post(node.url + "/v1/chat/completions", json=payload, headers={"x-request-id": request_id}) as r,
    ):
        return r.status, r.headers.copy(), await r.json()


async def test_stream_matches_answer_and_ends_with_usage_and_done(region: Node):
    payload = {"model": MODEL, "messages": QUESTION, "max_tokens": 20, "temperature": 0}
    _, _, whole = await post(region.url + "/v1/chat/completions", payload)
    chunks, _, headers = await stream(
        region.url + "/v1/chat/completions", {**payload, "stream_options": {"include_usage": True}}
    )
    assert chunks[-1] == {"done": True}
    usage_chunk = chunks[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 20
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])
    assert len(chunks) > 10  # token by token, not one blob
    assert chat_text(chunks) == whole["choices"][0]["message"]["content"]
    assert "queue;dur=" in headers["Server-Timing"]


async def test_stream_without_usage_option_has_no_usage_chunk(region: Node):
    chunks, _, _ = await stream(
        region.url + "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 3}
    )
    assert all(c.get("usage") is None for c in chunks[:-1])


async def test_completions_stream_and_echo(region: Node):
    payload = {
        "model": MODEL,
        "prompt": "The three largest cities in Nigeria are",
        "max_tokens": 8,
        "temperature": 0,
    }
    status, _, body = await post(region.url + "/v1/completions", {**payload, "echo": True})
    assert status == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"].startswith(payload["prompt"])
    assert body["usage"]["completion_tokens"] == 8
    chunks, _, _ = await stream(region.url + "/v1/completions", payload)
    streamed = "".join(c["choices"][0]["text"] for c in chunks[:-1] if c.get("choices"))
    assert payload["prompt"] + streamed == body["choices"][0]["text"]


async def test_stop_sequence_spanning_tokens_is_never_sent(region: Node):
    payload = {"model": MODEL, "messages": QUESTION, "max_tokens": 40, "temperature": 0}
    chunks, _, _ = await stream(region.url + "/v1/chat/completions", payload)
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks[1:-2]]
    # A stop string made of the end of one token and the start of the next.
    i = next(
        i
        for i in range(3, len(pieces) - 1)
        if len(pieces[i].strip()) >= 2 and len(pieces[i + 1].strip()) >= 2
    )
    stop = pieces[i][-2:] + pieces[i + 1][:2]
    full = "".join(pieces)
    expected = full[: full.index(stop)]
    for stops in (stop, [stop, "never-appears-xyz"]):
        got, _, _ = await stream(region.url + "/v1/chat/completions", {**payload, "stop": stops})
        assert chat_text(got) == expected
        assert got[-2]["choices"][0]["finish_reason"] == "stop"
        assert stop[0] not in "".join(c["choices"][0]["delta"].get("content") or "" for c in got[-3:-1])
    _, _, body = await post(region.url + "/v1/chat/completions", {**payload, "stop": stop})
    assert body["choices"][0]["message"]["content"] == expected
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_two_streams_progress_at_once(region: Node):
    payload = {"model": MODEL, "messages": QUESTION, "max_tokens": 40, "temperature": 0}
    (a, ta, _), (b, tb, _) = await asyncio.gather(
        stream(region.url + "/v1/chat/completions", payload),
        stream(
            region.url + "/v1/chat/completions", {**payload, "messages": [{"role": "user", "content": "Hi!"}]}
        ),
    )
    assert len(a) > 10 and len(b) > 10
    # Each stream got tokens while the other was still streaming: no one waited behind the other.
    assert tb[1] < ta[-2] and ta[1] < tb[-2]
    overlap = [t for t in ta if tb[0] <= t <= tb[-1]]
    assert len(overlap) >= 5


async def test_client_disconnect_aborts_its_sequence(region: Node):
    aborted_before = await aborted_count(region)
    payload = {"model": MODEL, "messages": QUESTION, "max_tokens": 400, "temperature": 0, "stream": True}
    async with aiohttp.ClientSession() as s:
        r = await s.post(region.url + "/v1/chat/completions", json=payload)
        got = 0
        async for _ in iter_data(r.content):
            got += 1
            if got == 3:
                break
        r.close()  # the client goes away mid-stream
    await wait_for_one_abort(region, aborted_before)
    generated = await metric(region, "nearshore:generation_tokens_total")
    await asyncio.sleep(0.3)
    assert await metric(region, "nearshore:generation_tokens_total") == generated  # nothing decodes on


async def test_shared_prefix_is_reused_and_reported(region: Node):
    system = {"role": "system", "content": "You are a helpful travel guide for West Africa. " * 6}
    payload = {"model": MODEL, "max_tokens": 2, "temperature": 0}
    await post(
        region.url + "/v1/chat/completions",
        {**payload, "messages": [system, {"role": "user", "content": "Hi"}]},
    )
    _, _, second = await post(
        region.url + "/v1/chat/completions",
        {**payload, "messages": [system, {"role": "user", "content": "Where should I eat?"}]},
    )
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 60, second["usage"]
    assert cached < second["usage"]["prompt_tokens"]
    assert await metric(region, "nearshore:prefix_cache_hits_total") >= cached


async def test_safety_blocklist_ends_stream_with_content_filter(region: Node):
    payload = {
        "model": MODEL,
        "prompt": "banana banana banana banana banana banana banana banana",
        "max_tokens": 20,
        "temperature": 0,
    }
    chunks, _, _ = await stream(region.url + "/v1/completions", payload)
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1] if c.get("choices"))
    assert "banana" not in text.lower()
    assert chunks[-2]["choices"][0]["finish_reason"] == "content_filter"
    _, _, body = await post(region.url + "/v1/completions", payload)
    assert body["choices"][0]["finish_reason"] == "content_filter"


async def test_context_overflow_is_a_400_with_token_counts(region: Node):
    long = "word " * 700  # well past the shared node's 512-token window
    status, _, body = await post(
        region.url + "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": long}]}
    )
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    # Counting stops once past the window, so the count is a lower bound.
    assert "512 tokens" in body["error"]["message"] and "prompt is at least 7" in body["error"]["message"]
    status, _, body = await post(
        region.url + "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 500}
    )
    assert status == 400 and body["error"]["param"] == "max_tokens"
    assert "500 in the completion" in body["error"]["message"]


async def test_metrics_expose_vllm_named_series(region: Node):
    await post(region.url + "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 3})
    async with aiohttp.ClientSession() as s, s.get(region.url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    for name in (
        "nearshore:time_to_first_token_seconds_bucket",
        "nearshore:inter_token_latency_seconds_bucket",
        "nearshore:e2e_request_latency_seconds_count",
        "nearshore:request_queue_time_seconds_sum",
        "nearshore:prompt_tokens_total",
        "nearshore:generation_tokens_total",
        "nearshore:num_requests_running",
        "nearshore:num_requests_waiting",
        "nearshore:prefix_cache_queries_total",
        "nearshore:prefix_cache_hits_total",
        "nearshore:model_load_time_seconds",
        "nearshore:kv_cache_usage_perc",
    ):
        assert name in text, name
    assert await metric(region, "nearshore:model_load_time_seconds") > 0
    assert await metric(region, "nearshore:generation_tokens_total") >= 3


async def test_long_prompt_prefill_does_not_freeze_another_stream(region: Node):
    """The long prompt is prefilled in chunks between the running stream's decode steps."""
    runner = {"model": MODEL, "messages": QUESTION, "max_tokens": 150, "temperature": 0, "stream": True}
    long_prompt = {"model": MODEL, "prompt": "The market opens early. " * 80, "max_tokens": 2}  # ~480 tokens
    times: list[float] = []
    long_done = asyncio.Event()

    async def run_stream() -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(region.url + "/v1/chat/completions", json=runner) as r,
        ):
            async for _ in iter_data(r.content):
                times.append(time.perf_counter())
                if long_done.is_set() and len(times) > 40:
                    break

    async def run_long() -> tuple[float, float, float]:
        while len(times) < 5:
            await asyncio.sleep(0.01)
        sent = time.perf_counter()
        _, headers, body = await post(region.url + "/v1/completions", long_prompt)
        long_done.set()
        assert body["usage"]["prompt_tokens"] > 400, body
        prefill_ms = float(headers["Server-Timing"].split("prefill;dur=")[1].split(",")[0])
        return sent, time.perf_counter(), prefill_ms / 1000

    _, (start, end, prefill_s) = await asyncio.gather(run_stream(), run_long())
    gaps = [b - a for a, b in itertools.pairwise(times) if start <= b <= end]
    assert len(gaps) >= 3  # the stream kept producing while the long prompt was prefilled
    assert max(gaps) < 0.6 * prefill_s, (max(gaps), prefill_s)
