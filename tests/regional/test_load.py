"""A region's load report (issue 9): ``x-nearshore-load`` on every response it sends and ``load`` in its
/health, from the real engine; and, without a model, the token-rate meter and the engine-stats mapping."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from nearshore.protocol.headers import LOAD
from nearshore.protocol.load import LoadReport, parse_load
from nearshore.protocol.sse import iter_data
from regional.engine import EngineStats
from regional.load_report import MAX_AGE_S, load_of
from regional.token_rate import TokenRate
from tests.conftest import MODEL, Node, start_region

CAPACITY = 2  # two sequences decode at once; one more may wait; a fourth is refused (503)
# A prompt the base model continues for as long as it is let (no early end of text).
COUNTING = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 200, "temperature": 0}


@pytest.fixture(scope="module")
def small_region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = start_region(
        tmp_path_factory.mktemp("load"),
        engine={"max_sequences": CAPACITY, "max_waiting": 1, "kv_cache_tokens": 4096, "context_window": 512},
    )
    yield node
    node.process.stop()


def load_in(headers: aiohttp.typedefs.LooseHeaders) -> LoadReport:
    value = headers.get(LOAD)
    report = parse_load(value)
    assert report is not None, f"no load report in {value!r}"
    return report


async def health(s: aiohttp.ClientSession, node: Node) -> tuple[LoadReport, dict]:
    async with s.get(node.url + "/health") as r:
        assert r.status == 200
        return load_in(r.headers), await r.json()


@pytest.mark.slow
async def test_every_response_carries_the_load_report(small_region: Node):
    url = small_region.url
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    requests = [
        ("GET", "/health", None, 200),
        ("GET", "/health/ready", None, 200),
        ("GET", "/v1/models", None, 200),
        ("GET", "/metrics", None, 200),
        ("POST", "/v1/chat/completions", chat, 200),
        ("POST", "/v1/chat/completions", b"{not json", 400),
        ("POST", "/v1/chat/completions", {**chat, "model": "nope"}, 404),
        ("POST", "/v1/chat/completions", {**chat, "temperature": 9}, 400),
        ("GET", "/no/such/path", None, 404),
        ("GET", "/v1/chat/completions", None, 405),
    ]
    async with aiohttp.ClientSession() as s:
        for method, path, body, status in requests:
            kwargs = {"data": body, "headers": {"Content-Type": "application/json"}}
            if isinstance(body, dict):
                kwargs = {"json": body}
            async with s.request(method, url + path, **(kwargs if body is not None else {})) as r:
                assert r.status == status, (path, await r.text())
                report = load_in(r.headers)
                assert report.state == "ready" and report.capacity == CAPACITY, (path, report)
                assert report.running <= CAPACITY and 0.0 <= report.kv_usage <= 1.0


@contextlib.asynccontextmanager
async def long_streams(s: aiohttp.ClientSession, node: Node, count: int) -> AsyncIterator[list[asyncio.Task]]:
    """``count`` streams of counting running as tasks; each returns its head's load and its chunk count."""

    async def one() -> tuple[LoadReport, int]:
        async with s.post(node.url + "/v1/completions", json={**COUNTING, "stream": True}) as r:
            assert r.status == 200, await r.text()
            head = load_in(r.headers)
            chunks = [data async for data in iter_data(r.content)]
            return head, len(chunks)

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for_load(s: aiohttp.ClientSession, node: Node, running: int, waiting: int) -> LoadReport:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        report, _ = await health(s, node)
        if (report.running, report.waiting) == (running, waiting):
            return report
        await asyncio.sleep(0.02)
    raise AssertionError(f"the load never showed running={running}, waiting={waiting}: last {report}")


@pytest.mark.slow
async def test_the_load_rises_with_requests_in_flight_and_a_refusal_says_why(small_region: Node):
    async with aiohttp.ClientSession() as s:
        idle, payload = await health(s, small_region)
        assert (idle.running, idle.waiting) == (0, 0)
        async with long_streams(s, small_region, CAPACITY + 1) as streams:
            busy = await wait_for_load(s, small_region, running=CAPACITY, waiting=1)
            assert busy.kv_usage > 0
            # The queue is full: the refusal's head carries the load that explains it.
            async with s.post(small_region.url + "/v1/completions", json=COUNTING) as r:
                assert r.status == 503, await r.text()
                assert "Retry-After" in r.headers
                refused = load_in(r.headers)
                assert (refused.running, refused.waiting, refused.capacity) == (CAPACITY, 1, CAPACITY)
            done = await asyncio.wait_for(asyncio.gather(*streams), timeout=120)
        # Each stream's head carries the load of when it started (give or take the report's max age).
        heads = [head for head, _ in done]
        assert all(head.capacity == CAPACITY and head.running <= CAPACITY for head in heads), heads
        assert max(head.running for head in heads) >= 1, heads
        assert all(count == COUNTING["max_tokens"] + 2 for _, count in done)  # tokens, finish, [DONE]
        after, payload = await health(s, small_region)
    assert (after.running, after.waiting) == (0, 0)
    assert after.tokens_per_s > 0
    # /health's JSON field is the same report as its header (the header rounds kv and tps).
    load = LoadReport(**payload["load"])
    assert load.state == after.state and (load.running, load.waiting, load.capacity) == (0, 0, CAPACITY)
    assert load.kv_usage == pytest.approx(after.kv_usage, abs=1e-3)
    assert load.tokens_per_s == pytest.approx(after.tokens_per_s, abs=0.1)
    assert set(payload) >= {"status", "model", "running", "waiting", "load"}


@pytest.mark.slow
async def test_a_streams_head_carries_the_load_and_health_counts_it(small_region: Node):
    async with aiohttp.ClientSession() as s:
        payload = {**COUNTING, "stream": True, "max_tokens": 40}
        await asyncio.sleep(MAX_AGE_S)  # a report made before this request is not reused for its head
        async with s.post(small_region.url + "/v1/completions", json=payload) as r:
            assert r.status == 200
            head = load_in(r.headers)
            assert head.running == 1 and head.state == "ready"
            first = json.loads(await anext(iter_data(r.content)))
            assert first["choices"][0]["text"]
            during, body = await health(s, small_region)
            assert during.running == 1 and body["load"]["running"] == 1
            async for _ in iter_data(r.content):
                pass


@pytest.mark.slow
async def test_once_its_steps_are_fitted_the_report_carries_a_prompt_tokens_prefill_cost(small_region: Node):
    async with aiohttp.ClientSession() as s:
        for words in (2, 12, 30, 60, 100, 150):  # prompts of several sizes: the fit needs their steps
            payload = {**COUNTING, "prompt": "one two three " * words, "max_tokens": 10}
            async with s.post(small_region.url + "/v1/completions", json=payload) as r:
                assert r.status == 200
                await r.read()
        report, body = await health(s, small_region)
    # A CPU node prefills hundreds of tokens a second: a token costs it between a tenth of a ms and 100 ms.
    assert 0.1 < report.prefill_ms_per_token < 100.0
    assert body["load"]["prefill_ms_per_token"] == pytest.approx(report.prefill_ms_per_token, rel=1e-3)


# --- without a model ----------------------------------------------------------------------------------


def stats(**fields: object) -> EngineStats:
    base: dict[str, object] = dict(
        state="ready",
        running=3,
        waiting=1,
        kv_tokens_used=2048,
        kv_tokens_total=8192,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
        steps=0,
        model_load_s=0.0,
        capacity=8,
        tokens_per_s=212.5,
    )
    return EngineStats(**{**base, **fields})  # type: ignore[arg-type]


def test_engine_stats_become_a_load_report():
    assert load_of(stats()) == LoadReport(
        state="ready", running=3, waiting=1, capacity=8, kv_usage=0.25, tokens_per_s=212.5
    )
    for state in ("loading", "unloaded", "failed"):
        assert load_of(stats(state=state)).state == state
    assert load_of(stats(state="exploded")).state == "failed"  # a state it cannot name is never routable
    assert load_of(stats(kv_tokens_total=0)).kv_usage == 0.0
    assert load_of(stats(kv_tokens_used=9000)).kv_usage == 1.0
    assert load_of(stats(tokens_per_s=float("nan"))).tokens_per_s == 0.0
    assert load_of(stats(prefill_ms_per_token=2.5)).prefill_ms_per_token == 2.5
    assert load_of(stats(prefill_ms_per_token=-1.0)).prefill_ms_per_token == 0.0


def test_the_token_rate_is_tokens_over_the_recent_window():
    rate = TokenRate(started_at_s=1000.0, window_s=10)
    assert rate.per_s(1000.5) == 0.0
    rate.add(5, 1000.2)
    assert rate.per_s(1000.5) == 5.0  # young: never divided by less than a second
    for second in range(1001, 1020):
        rate.add(100, second + 0.5)
    assert rate.per_s(1019.99) == pytest.approx(100.0, rel=0.02)  # steady: the rate it runs at
    assert rate.per_s(1025.0) == pytest.approx(400 / 9.0)  # idle since 1020: four busy seconds left in it
    assert rate.per_s(1100.0) == 0.0  # long idle: nothing recent
