"""The public /health says ok or degraded in one word, the operator's listener keeps the details; the route
explanation is only for keys allowed it; a malformed request logs one line (issue 19, items 8 and 9)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest

from edge.health import readiness
from tests.edge_fixtures import EVENTUALLY_S, Edge, edge_over_pacer, start_edge, start_pacer
from tests.redis_server import RedisServer

CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
ONE_WORD = re.compile(r"[a-z]*")


# --- the reasons, on their own ----------------------------------------------------------------------------


def fake_state(
    *,
    redis_up=True,
    fail_mode="closed",
    ledger="",
    accepting=True,
    routable=(True,),
    local=(),
    cooling=(),
    keys="up",
) -> SimpleNamespace:
    """Just what readiness() reads (``local``: which replicas are on this side of the ocean; ``cooling``:
    seconds each must not be asked after a Retry-After; ``keys``: "up", or the key store out of reach
    "within" or "past" its offline grace)."""
    local = local or (False,) * len(routable)
    cooling = cooling or (0.0,) * len(routable)
    upstreams = [
        SimpleNamespace(
            replica=SimpleNamespace(health=SimpleNamespace(routable=lambda _now, up=up: up), local=here),
            cooling_left=lambda _now, left=left: left,
        )
        for up, here, left in zip(routable, local, cooling, strict=True)
    ]
    return SimpleNamespace(
        config=SimpleNamespace(limits=SimpleNamespace(fail_mode=fail_mode)),
        limiter=SimpleNamespace(backend_up=lambda: redis_up),
        keys=SimpleNamespace(out_of_reach=lambda: keys != "up", trusted=lambda: keys != "past"),
        ledger=SimpleNamespace(health=lambda: ledger, accepting=lambda: accepting),
        pool=SimpleNamespace(upstreams=upstreams),
    )


@pytest.mark.parametrize(
    ("state", "reasons", "http_status"),
    [
        (fake_state(), (), 200),
        (fake_state(redis_up=False), ("limits",), 503),
        (fake_state(redis_up=False, fail_mode="open"), (), 200),  # serving on local limits
        (fake_state(routable=(False, False)), ("regions",), 200),  # the cache still answers
        (fake_state(routable=(False, True)), (), 200),  # one region left still serves
        (fake_state(ledger="spooling"), ("spooling",), 200),  # rows are durable in the spool: serving
        (fake_state(ledger="unavailable", accepting=False), ("unavailable",), 503),
        (fake_state(ledger="spooling", routable=(False,)), ("spooling", "regions"), 200),
        (fake_state(redis_up=False, routable=(False,)), ("limits", "regions"), 503),  # refusing first
        # Only the local region (this side of the ocean) left: a cable cut, still serving.
        (fake_state(routable=(False, True), local=(False, True)), ("cut",), 200),
        (fake_state(routable=(True, True), local=(False, True)), (), 200),
        (fake_state(routable=(True,), local=(True,)), (), 200),  # no remote region at all: nothing cut
        # Every replica that could be asked said Retry-After (issue 34, N2): serving the cache, saying so.
        (fake_state(cooling=(4.0,)), ("cooling",), 200),
        (fake_state(routable=(True, False), cooling=(4.0, 0.0)), ("cooling",), 200),
        (fake_state(routable=(True, True), cooling=(4.0, 0.0)), (), 200),  # another one may be asked
        # The key store (PostgreSQL) out of reach: known keys served within the grace, every key 503 after.
        (fake_state(keys="within"), ("keys",), 200),
        (fake_state(keys="past", ledger="spooling"), ("keys", "spooling"), 503),
    ],
)
def test_readiness_collects_every_reason_and_refusing_ones_answer_503(state, reasons, http_status):
    ready = readiness(state, 0.0)
    assert ready.reasons == reasons
    assert ready.status == ("degraded" if reasons else "ok") and ready.http_status == http_status


# --- real edges ------------------------------------------------------------------------------------------


def session(edge: Edge) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context(), limit=0))


async def public_health(edge: Edge) -> tuple[int, str]:
    async with session(edge) as s, s.get(edge.url + "/health") as r:
        return r.status, await r.text()


async def operator_health(edge: Edge) -> dict:
    async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/health") as r:
        assert r.status == 200  # always: the liveness probe reads it
        return await r.json()


def assert_says_nothing_inside(text: str) -> dict:
    """Only {"status", "reason"}, the reason one lowercase word: no path, no error text, no region."""
    assert "/" not in text and "\\" not in text, text  # no file path (nor a URL)
    body = json.loads(text)
    assert set(body) == {"status", "reason"} and ONE_WORD.fullmatch(body["reason"]), body
    return body


async def post(s: aiohttp.ClientSession, edge: Edge, key: str, headers: dict | None = None):
    async with s.post(
        edge.url + "/v1/chat/completions",
        json=CHAT,
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
    ) as r:
        await r.read()
        return r.status, r.headers


@pytest.mark.slow
async def test_public_health_is_one_word_and_degraded_while_redis_is_down_in_fail_closed(tmp_path: Path):
    redis = RedisServer(tmp_path / "redis").start()
    pacer = start_pacer(tmp_path, tokens=1, interval_ms=1)
    not_a_folder = tmp_path / "not-a-folder"
    not_a_folder.write_text("a file where the cache folder should be")  # the cache is off, with a path
    edge = start_edge(
        tmp_path / "edge",
        [("lagos-pacer", pacer.url)],
        limits={"backend": "redis", "redis_url": redis.url, "fail_mode": "closed"},
        cache={"folder": str(not_a_folder)},
    )
    try:
        key = edge.new_key(rpm=1000)
        status, text = await public_health(edge)
        assert status == 200 and assert_says_nothing_inside(text) == {"status": "ok", "reason": ""}
        assert "lagos-pacer" not in text
        details = await operator_health(edge)
        assert details["status"] == "ok" and details["cache"].startswith("off (cannot open")
        assert str(not_a_folder) in details["cache"]  # the operator still sees where
        assert details["regions"] == {"lagos-pacer": "up"}

        async with session(edge) as s:
            redis.stop()
            assert (await post(s, edge, key))[0] == 503  # the limiter finds Redis gone
            status, text = await public_health(edge)
            assert status == 503  # a load balancer sends the traffic elsewhere
            assert assert_says_nothing_inside(text) == {"status": "degraded", "reason": "limits"}
            for leak in ("Connection", "Error", "refused", "redis", "6379", str(redis.port)):
                assert leak not in text
            details = await operator_health(edge)
            assert (details["status"], details["reasons"], details["refusing"]) == (
                "degraded",
                ["limits"],
                True,
            )
            assert details["limits"] == "down (closed)" and details["limits_backend"] == "redis"

            redis.start()
            deadline = time.monotonic() + EVENTUALLY_S
            while (await public_health(edge))[0] != 200:
                assert time.monotonic() < deadline, "health did not come back with Redis"
                await asyncio.sleep(0.1)
            assert (await post(s, edge, key))[0] == 200
            assert (await operator_health(edge))["limits"] == "up"
    finally:
        edge.stop()
        pacer.process.stop()
        redis.stop()


@pytest.mark.slow
async def test_no_routable_region_is_degraded_regions(tmp_path: Path):
    edge = edge_over_pacer(
        tmp_path, "only-region", {"upstream": {"health_interval_s": 0.2}}, tokens=1, interval_ms=1
    )
    try:
        edge.extra[0].stop()  # the edge's one region goes away; two failed probes take it out
        deadline = time.monotonic() + EVENTUALLY_S
        while '"ok"' in (status_text := await public_health(edge))[1]:
            assert time.monotonic() < deadline, "the edge still says ok with no region"
            await asyncio.sleep(0.1)
        status, text = status_text
        # Degraded, still 200: its cache answers, and edges that all lost their regions stay in the pool.
        assert status == 200 and assert_says_nothing_inside(text) == {
            "status": "degraded",
            "reason": "regions",
        }
        assert "only-region" not in text
        details = await operator_health(edge)
        assert details["reasons"] == ["regions"] and details["regions"]["only-region"].startswith("down")
    finally:
        edge.stop()


@pytest.mark.slow
async def test_the_route_explanation_is_only_for_keys_allowed_it(tmp_path: Path):
    edge = edge_over_pacer(tmp_path, "explained", tokens=1, interval_ms=1)
    try:
        allowed, other = edge.new_key(debug=True), edge.new_key()
        ask = {"x-nearshore-debug": "route"}
        async with session(edge) as s:
            status, headers = await post(s, edge, allowed, ask)
            assert status == 200 and headers["x-nearshore-route"].startswith("explained")
            status, headers = await post(s, edge, other, ask)
            assert status == 200 and "x-nearshore-route" not in headers  # silently: no error, no header
            status, headers = await post(s, edge, allowed)  # allowed, but did not ask
            assert status == 200 and "x-nearshore-route" not in headers
    finally:
        edge.stop()


@contextlib.contextmanager
def tls_to(edge: Edge) -> Iterator[ssl.SSLSocket]:
    """A TLS connection of its own to the edge."""
    port = int(edge.url.rsplit(":", 1)[1])
    with (
        socket.create_connection(("127.0.0.1", port)) as plain,
        edge.ssl_context().wrap_socket(plain, server_hostname="localhost") as tls,
    ):
        yield tls


def send_raw(edge: Edge, raw: bytes) -> bytes:
    """One request's bytes on a TLS connection of its own; the status line of the answer."""
    with tls_to(edge) as tls:
        tls.sendall(raw)
        tls.settimeout(5)
        return tls.recv(100).split(b"\r\n")[0]


def answer_raw(edge: Edge, raw: bytes) -> tuple[bytes, bytes, bytes]:
    """One request's bytes on a TLS connection of its own; the answer's status line, head and body (read to
    the connection's end: the edge closes it after a request it could not parse)."""
    answer = b""
    with tls_to(edge) as tls:
        tls.sendall(raw)
        tls.settimeout(10)
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while chunk := tls.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], head, body


def malformed_lines(edge: Edge) -> list[str]:
    text = (edge.folder / "edge.log").read_text(errors="replace")
    assert "Traceback" not in text and "Error handling request" not in text
    return [line for line in text.splitlines() if "malformed HTTP request from 127.0.0.1" in line]


@pytest.mark.slow
def test_a_malformed_request_logs_one_line_and_a_flood_a_few(tmp_path: Path):
    edge = edge_over_pacer(tmp_path, "malformed", tokens=1, interval_ms=1)
    bad = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n"  # a NUL in a header value
    try:
        assert b" 400" in send_raw(edge, bad)
        time.sleep(1.2)  # let the line reach the log, and the rate limit's second pass
        lines = malformed_lines(edge)
        assert len(lines) == 1 and lines[0].endswith(
            "malformed HTTP request from 127.0.0.1: Invalid header value char"
        )
        first = len(lines)

        for _ in range(50):
            assert b" 400" in send_raw(edge, bad)
        time.sleep(1.2)
        assert b" 400" in send_raw(edge, bad)  # its line counts the ones left out before it
        time.sleep(0.3)
        lines = malformed_lines(edge)[first:]
        assert len(lines) < 30, len(lines)  # at most 5 a second, and 50 take a few seconds at most
        left_out = sum(int(n) for n in re.findall(r"\((\d+) more not logged\)", "\n".join(lines)))
        assert left_out > 0 and len(lines) + left_out == 51  # every one logged or counted
        assert all(line.count("\n") == 0 and len(line) < 300 for line in lines)
        # A real request still works and nothing else was hidden.
        assert send_raw(edge, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200")
    finally:
        edge.stop()


@pytest.mark.slow
def test_a_request_that_is_not_http_gets_an_api_error_without_its_bytes(tmp_path: Path):
    """aiohttp's parser refuses these before any handler runs; the answer is still the API's error shape,
    and never quotes the client's bytes (here a key)."""
    edge = edge_over_pacer(tmp_path, "not-http", tokens=1, interval_ms=1)
    key = "ns-0123456789ab-" + "S" * 43
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    cases = {
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Bad: "
        + key.encode()
        + b"\x00\r\n\r\n": "Invalid header value char",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + key.encode() * 200 + b"\r\n\r\n": "Got more than",
        post + b"Transfer-Encoding: chunked\r\n\r\n{}": "Transfer-Encoding can't be present with",
    }
    try:
        for raw, words in cases.items():
            status, head, body = answer_raw(edge, raw)
            assert status.endswith(b" 400 Bad Request"), status
            assert b"content-type: application/json" in head.lower()
            error = json.loads(body)["error"]
            assert error["type"] == "invalid_request_error" and words in error["message"], error
            assert key not in body.decode() and "S" * 20 not in body.decode()
        # The edge goes on serving.
        assert send_raw(edge, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200")
    finally:
        edge.stop()
