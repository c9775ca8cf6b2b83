"""The edge in front of a hostile region (``nearshore hostile``): it trusts nothing the region sends.

Every misbehaviour ends its request with a typed error (or a checked answer), one ledger row with sane counts,
and a settled reservation; the edge's memory stays bounded and its /health keeps answering (issue 7, items
5 to 8).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator

import aiohttp
import pytest

from tests.edge_fixtures import Edge, Pacer, start_edge, start_hostile

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
MAX_TOKENS = 8
# The edge's view of a request's prompt: "hi" is 2 bytes + framing (8 per message, 32 per prompt).
PROMPT_CEILING = 42


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pacer]:
    region = start_hostile(tmp_path_factory.mktemp("hostile"), limit_s=60)
    yield region
    region.process.stop()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, hostile: Pacer) -> Iterator[Edge]:
    e = start_edge(
        tmp_path_factory.mktemp("edge"),
        [("hostile", hostile.url)],
        upstream={
            "ttft_timeout_s": 2.0,
            "unary_timeout_per_token_s": 0.05,
            "stall_timeout_s": 1.5,
            "heartbeat_s": 5.0,
            "health_interval_s": 60.0,
        },
        # One key floods every mode at once here: that is the test, not a key to share the pool fairly with.
        pools={"key_share": {"max_concurrent": 0, "max_tokens_in_flight": 0}},
    )
    yield e
    e.stop()


def session(edge: Edge) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=edge.ssl_context()), timeout=aiohttp.ClientTimeout(total=30)
    )


class Result:
    def __init__(self, status: int, body: bytes, headers: dict, client_id: str) -> None:
        self.status, self.body, self.headers, self.client_id = status, body, headers, client_id

    def json(self) -> dict:
        return json.loads(self.body)

    def events(self) -> list[bytes]:
        return [e[6:] for e in self.body.split(b"\n\n") if e.startswith(b"data: ")]


async def ask(
    edge: Edge, key: str, mode: str, *, stream: bool, usage: bool = False, path: str = "chat"
) -> Result:
    client_id = uuid.uuid4().hex
    payload: dict = {"model": MODEL, "max_tokens": MAX_TOKENS, "user": f"mode:{mode}", "stream": stream}
    if path == "chat":
        payload["messages"] = [{"role": "user", "content": "hi"}]
    else:
        payload["prompt"] = "hi"
    if usage:
        payload["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {key}", "x-client-request-id": client_id}
    url = edge.url + ("/v1/chat/completions" if path == "chat" else "/v1/completions")
    async with session(edge) as s, s.post(url, json=payload, headers=headers) as r:
        return Result(r.status, await r.read(), r.headers.copy(), client_id)


def rows_for(edge: Edge, client_id: str) -> list[dict]:
    db = sqlite3.connect(edge.ledger_db)
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute("SELECT * FROM usage WHERE client_request_id = ?", (client_id,))]
    finally:
        db.close()


async def one_row(edge: Edge, client_id: str) -> dict:
    for _ in range(50):  # a row of a request cut short is written just after its answer
        rows = rows_for(edge, client_id)
        if rows:
            break
        await asyncio.sleep(0.05)
    assert len(rows) == 1, rows
    row = rows[0]
    assert 0 <= row["prompt_tokens"] <= PROMPT_CEILING
    assert 0 <= row["completion_tokens"] <= MAX_TOKENS + 1
    assert 0 <= row["cached_tokens"] <= row["prompt_tokens"] and row["cost_usd"] >= 0
    return row


# mode -> (the status a unary request gets, its error code); every one of them also for streams below.
UNARY = {
    "endless-body": (502, "bad_upstream_response"),
    "endless-stream": (502, "bad_upstream_response"),
    "no-newline": (502, "bad_upstream_response"),
    "huge-event": (502, "bad_upstream_response"),
    "too-many-tokens": (502, "bad_upstream_response"),
    "truncated-length": (502, "bad_upstream_response"),
    # aiohttp's parser does not always end the body on a bad chunk line: the edge's deadline does (504).
    "truncated-chunked": ((502, 504), ("bad_upstream_response", "upstream_timeout")),
    "close-mid-body": (502, "bad_upstream_response"),
    "truncated-json": (502, "bad_upstream_response"),
    "html-200": (502, "bad_upstream_response"),
    "html-418": (502, "bad_upstream_response"),
    "sse-on-unary": (502, "bad_upstream_response"),
    "error-401": (502, "bad_upstream_response"),
    "garbage-error": (502, "bad_upstream_response"),
    "hang": (504, "upstream_timeout"),
    "hang-after-headers": (504, "upstream_timeout"),
    "slow-drip": (504, "upstream_timeout"),
}


@pytest.mark.parametrize("mode", sorted(UNARY))
async def test_a_unary_request_gets_a_typed_error_and_one_row(edge: Edge, mode: str):
    key = edge.new_key(tpm=200)  # three unsettled reservations would lock it
    statuses, codes = UNARY[mode]
    for _ in range(4):
        result = await ask(edge, key, mode, stream=False)
        assert result.status in _tuple(statuses), (mode, result.body[:300])
        error = result.json()["error"]
        assert error["code"] in _tuple(codes) and error["type"] == "server_error"
        assert result.headers.get("x-nearshore-region", "hostile") == "hostile"
        row = await one_row(edge, result.client_id)
        assert row["status"] == "error" and row["http_status"] == result.status
        assert row["error_code"] == error["code"]
    assert (await ask(edge, key, "ok", stream=False)).status == 200  # every reservation was settled


# mode -> whether the client's 200 stream began (then the error is an event), and the error's code
STREAMED = {
    "endless-body": (False, "bad_upstream_response"),  # JSON on a stream request
    "json-on-stream": (False, "bad_upstream_response"),
    "html-200": (False, "bad_upstream_response"),
    "html-418": (False, "bad_upstream_response"),
    "error-401": (False, "bad_upstream_response"),
    "garbage-error": (False, "bad_upstream_response"),
    "hang": (False, "upstream_timeout"),
    "slow-drip": (False, "upstream_timeout"),
    "endless-stream": (True, "bad_upstream_response"),
    "no-newline": (True, "bad_upstream_response"),
    "huge-event": (True, "bad_upstream_response"),
    "too-many-tokens": (True, "bad_upstream_response"),
    "truncated-json": (True, "bad_upstream_response"),
    "hang-after-headers": (True, "upstream_timeout"),
    "truncated-length": (True, "upstream_unavailable"),
    # Whether aiohttp sees the bad chunk line with the head (a 502 before the stream) or later varies.
    "truncated-chunked": (None, ("upstream_unavailable", "upstream_timeout", "bad_upstream_response")),
    "close-mid-body": (True, "upstream_unavailable"),
}


def _tuple(value: object) -> tuple:
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("mode", sorted(STREAMED))
async def test_a_stream_ends_with_a_typed_error_and_one_row(edge: Edge, mode: str):
    key = edge.new_key(tpm=200)
    began, code = STREAMED[mode]
    for _ in range(4):
        result = await ask(edge, key, mode, stream=True)
        if began is not None:
            assert (result.status == 200) == began, (mode, result.status, result.body[:300])
        if result.status == 200:
            events = result.events()
            assert events[-1] == b"[DONE]", (mode, result.body[-300:])
            assert json.loads(events[-2])["error"]["code"] in _tuple(code), (mode, events[-2])
            tokens = sum(1 for e in events[:-2] if '"content":" token"' in e.decode())
            assert tokens <= MAX_TOKENS  # never relayed past max_tokens
        else:
            assert result.status in (502, 504), result.body[:300]
            assert result.json()["error"]["code"] in _tuple(code)
        row = await one_row(edge, result.client_id)
        assert row["status"] == "error" and row["error_code"] in _tuple(code)
        if result.status == 200:
            assert row["completion_tokens"] == tokens  # what the client got, whatever the region claimed
    assert (await ask(edge, key, "ok", stream=True)).status == 200


@pytest.mark.parametrize("mode", ["usage-negative", "usage-huge", "usage-overflow", "usage-over-max"])
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_lying_usage_is_billed_as_what_was_delivered(edge: Edge, mode: str, stream: bool):
    key = edge.new_key(tpm=200, budget_usd=1.0)
    result = await ask(edge, key, mode, stream=stream, usage=stream)
    assert result.status == 200
    if stream:
        events = result.events()
        assert events[-1] == b"[DONE]"
        usage = json.loads(events[-2])["usage"]
    else:
        usage = result.json()["usage"]
    # The client sees the figure it was billed, never the region's claim.
    assert 0 <= usage["completion_tokens"] <= MAX_TOKENS and 0 <= usage["prompt_tokens"] <= PROMPT_CEILING
    row = await one_row(edge, result.client_id)
    assert row["status"] == "ok" and row["completion_tokens"] == usage["completion_tokens"]
    assert row["cost_usd"] < 1e-4
    async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/metrics") as r:
        assert 'nearshore_edge:usage_anomalies_total{kind="' in await r.text()
    assert (await ask(edge, key, "ok", stream=stream)).status == 200  # the key is not locked


async def test_an_honest_region_passes_unchanged(edge: Edge):
    key = edge.new_key()
    unary = await ask(edge, key, "ok", stream=False)
    assert unary.status == 200 and unary.json()["usage"]["completion_tokens"] == MAX_TOKENS
    streamed = await ask(edge, key, "ok", stream=True, usage=True)
    events = streamed.events()
    assert events[-1] == b"[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == MAX_TOKENS
    for result in (unary, streamed):
        row = await one_row(edge, result.client_id)
        assert (row["status"], row["prompt_tokens"], row["completion_tokens"]) == ("ok", 10, MAX_TOKENS)
    echoed = await ask(edge, key, "ok", stream=True, path="completions")
    assert echoed.status == 200 and echoed.events()[-1] == b"[DONE]"


async def test_memory_and_health_hold_while_every_mode_runs_at_once(edge: Edge):
    """All the modes at once, several times over: RSS stays far from the 11 GB an endless body once cost,
    and /health (on the operator's listener) keeps answering fast: the event loop never freezes."""
    key = edge.new_key(rpm=10_000, tpm=10**7)
    modes = sorted(set(UNARY) | set(STREAMED))
    latencies: list[float] = []
    rss: list[int] = []
    stop = asyncio.Event()

    async def watch() -> None:
        async with aiohttp.ClientSession() as s:
            while not stop.is_set():
                started = time.perf_counter()
                async with s.get(edge.metrics_url + "/health") as r:
                    assert r.status == 200
                    await r.read()
                latencies.append(time.perf_counter() - started)
                rss.append(_rss_mb(edge.process.proc.pid))
                await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    asked = [(mode, stream) for mode in modes for stream in (False, True) for _ in range(3)]
    results = await asyncio.gather(*(ask(edge, key, mode, stream=stream) for mode, stream in asked))
    stop.set()
    await watcher
    statuses = [(mode, stream, r.status) for (mode, stream), r in zip(asked, results, strict=True)]
    assert all(status in (200, 502, 504) for *_, status in statuses), [
        s for s in statuses if s[2] not in (200, 502, 504)
    ]
    for r in results:
        await one_row(edge, r.client_id)
    latencies.sort()
    assert max(rss) < 300, rss
    # The figure is 50 ms; the bounds here leave room for a shared 2-core machine (whose host may
    # take the process off its core for about a second, once: 0.99 s beside a test run, with and without
    # the edge's connection refill), and still fail on a frozen loop (an endless body once froze it for
    # 26 s) or on stalls that come back. How fast /health answers is measured by benchmarks, not here.
    assert latencies[len(latencies) // 2] < 0.05, latencies[-5:]
    assert latencies[-2] < 0.5 and latencies[-1] < 3.0, latencies[-5:]


def _rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) // 1024


async def test_a_stream_that_fails_before_its_first_byte_is_billed_and_refunded(tmp_path):
    """A tpm=200 key was locked for a minute by failures that wrote no row and refunded nothing."""
    edge = start_edge(tmp_path, [("dead", "http://127.0.0.1:9")])
    try:
        key = edge.new_key(tpm=200)
        for _ in range(5):
            result = await ask(edge, key, "ok", stream=True)
            assert result.status == 503 and result.json()["error"]["code"] == "no_region_available"
            row = await one_row(edge, result.client_id)
            assert (row["status"], row["http_status"], row["completion_tokens"]) == ("error", 503, 0)
    finally:
        edge.stop()


def test_no_key_reached_any_log(edge: Edge):
    """Last in this module: every key used above, against every log the processes wrote."""
    edge.assert_no_secret_in_logs()
