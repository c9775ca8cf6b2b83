"""`nearshore hostile`: every mode misbehaves as promised, within bounded time and bytes, and the process
keeps serving (health 200, no connection left open) after each; modes picked per request run side by side."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from harness.standins import hostile
from harness.standins.hostile import CUT_JSON, HUGE_EVENT_BYTES, MODES, TOO_MANY_FACTOR
from tests.edge_fixtures import EVENTUALLY_S, Pacer, start_hostile

TOKENS = 8
MB = 1024 * 1024
CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pacer]:
    r = start_hostile(tmp_path_factory.mktemp("hostile"), tokens=TOKENS)
    yield r
    r.process.stop()


# ---- a raw HTTP/1.1 client: it must see broken framing, not be hidden from it -------------------------


class Raw:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> Raw:
        host, port = url.removeprefix("http://").split(":")
        return cls(*await asyncio.open_connection(host, int(port), limit=1 * MB))

    async def send(
        self, path: str, body: bytes | dict[str, Any] = b"", method: str = "POST", **headers: str
    ) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", "Host: hostile", f"Content-Length: {len(raw)}"]
        lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + raw)
        await self.writer.drain()

    async def head(self) -> tuple[int, dict[str, str]]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        first, *lines = head.decode("latin-1").strip().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        return int(first.split(" ")[1]), headers

    async def chunked(self, max_bytes: int) -> tuple[bytes, bool]:
        """De-chunk up to about ``max_bytes``; True when the last chunk came. A bad size line raises
        ValueError, an early close IncompleteReadError."""
        data = bytearray()
        while len(data) < max_bytes:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await self.reader.readexactly(2)
                return bytes(data), True
            data += await self.reader.readexactly(size)
            await self.reader.readexactly(2)
        return bytes(data), False

    async def body(self, headers: dict[str, str], max_bytes: int = 32 * MB) -> bytes:
        if headers.get("transfer-encoding") == "chunked":
            data, complete = await self.chunked(max_bytes)
            assert complete, "the body did not end within the bound"
            return data
        return await self.reader.readexactly(int(headers["content-length"]))

    async def call(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        await self.send(path, body)
        status, headers = await self.head()
        return status, headers, await self.body(headers)

    async def silent_for(self, seconds: float) -> bool:
        """True when nothing came and the socket stayed open for ``seconds``."""
        try:
            async with asyncio.timeout(seconds):
                await self.reader.read(1)
        except TimeoutError:
            return True
        return False

    async def close(self) -> None:
        self.writer.close()
        await asyncio.gather(self.writer.wait_closed(), return_exceptions=True)


async def health(url: str) -> dict[str, Any]:
    raw = await Raw.open(url)
    try:
        await raw.send("/health", method="GET", connection="close")
        status, headers = await raw.head()
        body = await raw.body(headers)
    finally:
        await raw.close()
    assert status == 200
    return json.loads(body)


async def settle(url: str) -> None:
    """Health answers 200 and every connection a check opened is gone (only health's own is left)."""
    deadline = time.monotonic() + EVENTUALLY_S
    while (h := await health(url))["open_connections"] > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert h == {"status": "ok", "model": "ready", "hostile": "hostile", "open_connections": 1}


def mode(name: str, **fields: Any) -> dict[str, Any]:
    return {**CHAT, "user": f"mode:{name}", **fields}


def events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e]


def usage_of(data: bytes) -> dict[str, Any] | None:
    return json.loads(data)["usage"]


# ---- one check per mode ---------------------------------------------------------------------------------

Check = Callable[[Raw], Awaitable[None]]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn

    return register


@check("ok")
async def _ok(raw: Raw) -> None:
    # Both kinds of request, both endpoints, on one keep-alive connection.
    status, headers, body = await raw.call("/v1/chat/completions", mode("ok", max_tokens=5))
    answer = json.loads(body)
    assert status == 200 and headers["connection"] == "keep-alive"
    assert answer["choices"][0]["message"]["content"] == " token" * 5
    assert answer["usage"]["prompt_tokens"] == 10 and answer["usage"]["completion_tokens"] == 5
    status, headers, body = await raw.call("/v1/completions", {**mode("ok", prompt="x"), **STREAM})
    assert status == 200 and headers["content-type"] == "text/event-stream"
    datas = [e.removeprefix(b"data: ") for e in events(body)]
    assert datas[-1] == b"[DONE]"
    texts = [c["choices"][0]["text"] for c in map(json.loads, datas[:-1]) if c["choices"]]
    assert texts == [" token"] * TOKENS + [""]
    assert usage_of(datas[-2])["completion_tokens"] == TOKENS


@check("endless-body")
async def _endless_body(raw: Raw) -> None:
    await raw.send("/v1/chat/completions", mode("endless-body"))
    status, headers = await raw.head()
    assert status == 200 and headers["content-type"] == "application/json"
    data, complete = await raw.chunked(8 * MB)
    assert not complete and len(data) >= 8 * MB and data.startswith(b'{"id":')


@check("endless-stream")
async def _endless_stream(raw: Raw) -> None:
    await raw.send("/v1/chat/completions", mode("endless-stream", max_tokens=5, **STREAM))
    status, headers = await raw.head()
    assert status == 200 and headers["content-type"] == "text/event-stream"
    data, complete = await raw.chunked(2 * MB)
    got = events(data)
    assert not complete and len(got) > 1000 and b"[DONE]" not in data
    assert json.loads(got[500].removeprefix(b"data: "))["choices"][0]["delta"] == {"content": " token"}


@check("no-newline")
async def _no_newline(raw: Raw) -> None:
    await raw.send("/v1/chat/completions", mode("no-newline", **STREAM))
    status, headers = await raw.head()
    assert status == 200 and headers["content-type"] == "text/event-stream"
    data, complete = await raw.chunked(4 * MB)
    assert not complete and data.startswith(b"data: aaaa") and b"\n" not in data and len(data) >= 4 * MB


@check("huge-event")
async def _huge_event(raw: Raw) -> None:
    status, _, body = await raw.call("/v1/chat/completions", mode("huge-event", **STREAM))
    sizes = [len(e) for e in events(body)]
    assert status == 200 and sizes[1] > HUGE_EVENT_BYTES and max(sizes[2:]) < 1000
    assert body.endswith(b"data: [DONE]\n\n")
    status, _, body = await raw.call("/v1/completions", mode("huge-event", prompt="x"))
    assert status == 200 and len(json.loads(body)["choices"][0]["text"]) > HUGE_EVENT_BYTES


LIES = {
    "usage-negative": (-10, -1000),
    "usage-huge": (10, 10**15),
    "usage-overflow": (10, 2**70),
    "usage-over-max": (10, 842650),
}


def _lie_check(name: str, prompt_tokens: int, completion_tokens: int) -> Check:
    async def run(raw: Raw) -> None:
        claimed = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        status, _, body = await raw.call("/v1/chat/completions", mode(name, max_tokens=5))
        answer = json.loads(body)
        assert status == 200 and answer["choices"][0]["message"]["content"] == " token" * 5
        assert claimed.items() <= answer["usage"].items()
        status, _, body = await raw.call(
            "/v1/completions", {**mode(name, prompt="x", max_tokens=5), **STREAM}
        )
        datas = [e.removeprefix(b"data: ") for e in events(body)]
        assert status == 200 and datas[-1] == b"[DONE]" and len(datas) == 5 + 3
        assert claimed.items() <= usage_of(datas[-2]).items()

    return run


for _name, (_prompt, _completion) in LIES.items():
    CHECKS[_name] = _lie_check(_name, _prompt, _completion)


@check("too-many-tokens")
async def _too_many_tokens(raw: Raw) -> None:
    status, _, body = await raw.call("/v1/chat/completions", mode("too-many-tokens", max_tokens=5, **STREAM))
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events(body)[:-1]]
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert status == 200 and len(tokens) == 5 * TOO_MANY_FACTOR
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    status, _, body = await raw.call("/v1/completions", mode("too-many-tokens", prompt="x", max_tokens=5))
    answer = json.loads(body)
    assert answer["choices"][0]["text"].count("token") == 5 * TOO_MANY_FACTOR
    assert answer["usage"]["completion_tokens"] == 5


@check("truncated-length")
async def _truncated_length(raw: Raw) -> None:
    await raw.send("/v1/chat/completions", mode("truncated-length"))
    status, headers = await raw.head()
    assert status == 200
    with pytest.raises(asyncio.IncompleteReadError) as cut:
        await raw.body(headers)
    assert 0 < len(cut.value.partial) < int(headers["content-length"])


@check("truncated-chunked")
async def _truncated_chunked(raw: Raw) -> None:
    await raw.send("/v1/chat/completions", mode("truncated-chunked"))
    status, headers = await raw.head()
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    with pytest.raises(ValueError, match="invalid literal"):
        await raw.body(headers)
    await raw.reader.read()  # then the region closes
    assert raw.reader.at_eof()


@check("close-mid-body")
async def _close_mid_body(raw: Raw) -> None:
    await raw.send("/v1/chat/completions", mode("close-mid-body"))
    status, headers = await raw.head()
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    with pytest.raises(asyncio.IncompleteReadError):
        await raw.body(headers)


@check("truncated-json")
async def _truncated_json(raw: Raw) -> None:
    status, headers, body = await raw.call("/v1/chat/completions", mode("truncated-json"))
    assert status == 200 and body == CUT_JSON and headers["connection"] == "keep-alive"
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)
    status, _, body = await raw.call("/v1/chat/completions", mode("truncated-json", **STREAM))
    assert body == b"data: " + CUT_JSON + b"\n\ndata: [DONE]\n\n"


def _html_check(code: int) -> Check:
    async def run(raw: Raw) -> None:
        status, headers, body = await raw.call("/v1/chat/completions", mode(f"html-{code}"))
        assert status == code and headers["content-type"].startswith("text/html")
        assert body.startswith(b"<!DOCTYPE html>")

    return run


CHECKS["html-200"], CHECKS["html-418"] = _html_check(200), _html_check(418)


@check("sse-on-unary")
async def _sse_on_unary(raw: Raw) -> None:
    status, headers, body = await raw.call("/v1/chat/completions", mode("sse-on-unary"))
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert body.startswith(b"data: {") and body.endswith(b"data: [DONE]\n\n")


@check("json-on-stream")
async def _json_on_stream(raw: Raw) -> None:
    status, headers, body = await raw.call("/v1/chat/completions", mode("json-on-stream", **STREAM))
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body)["object"] == "chat.completion"


@check("hang")
async def _hang(raw: Raw) -> None:
    await raw.send("/v1/chat/completions", mode("hang", **STREAM))
    assert await raw.silent_for(1.0)


@check("hang-after-headers")
async def _hang_after_headers(raw: Raw) -> None:
    await raw.send("/v1/chat/completions", mode("hang-after-headers", **STREAM))
    status, headers = await raw.head()
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert await raw.silent_for(1.0)


@check("slow-drip")
async def _slow_drip(raw: Raw) -> None:
    await raw.send("/v1/chat/completions", mode("slow-drip"))
    started = time.monotonic()
    got = b""
    while len(got) < 3:
        got += await raw.reader.read(3 - len(got))
    assert got == b"HTT" and 1.6 < time.monotonic() - started < 4


@check("error-401")
async def _error_401(raw: Raw) -> None:
    status, _, body = await raw.call("/v1/chat/completions", mode("error-401"))
    error = json.loads(body)["error"]
    assert status == 401 and error["type"] == "authentication_error" and error["code"] == "invalid_api_key"


@check("garbage-error")
async def _garbage_error(raw: Raw) -> None:
    status, headers, body = await raw.call("/v1/chat/completions", mode("garbage-error"))
    assert status == 400 and headers["content-type"] == "application/json"
    with pytest.raises(ValueError):
        json.loads(body)


# ---- the tests ------------------------------------------------------------------------------------------

pytestmark = pytest.mark.slow


def test_every_mode_is_documented_and_checked():
    documented = re.findall(r"^\| ([a-z0-9-]+) +\|", hostile.__doc__ or "", flags=re.MULTILINE)
    assert documented[1:] == list(MODES)  # [0] is the header row
    assert set(CHECKS) == set(MODES)


@pytest.mark.parametrize("name", list(MODES))
async def test_mode_misbehaves_as_promised_and_the_region_keeps_serving(region: Pacer, name: str):
    raw = await Raw.open(region.url)
    try:
        async with asyncio.timeout(10):
            await CHECKS[name](raw)
    finally:
        await raw.close()
    await settle(region.url)  # the peer closed: endless, hanging and dripping answers stop


async def test_modes_picked_per_request_run_side_by_side(region: Pacer):
    endless = await Raw.open(region.url)
    try:
        await endless.send("/v1/chat/completions", mode("endless-stream", **STREAM))
        await endless.head()
        assert not (await endless.chunked(256 * 1024))[1]
        async with aiohttp.ClientSession(region.url) as session:

            async def post(name: str) -> dict[str, Any]:
                async with session.post("/v1/chat/completions", json=mode(name, max_tokens=3)) as r:
                    return {"status": r.status, **json.loads(await r.read())}

            ok, huge, denied = await asyncio.gather(post("ok"), post("usage-huge"), post("error-401"))
        assert ok["status"] == 200 and ok["usage"]["completion_tokens"] == 3
        assert huge["status"] == 200 and huge["usage"]["completion_tokens"] == 10**15
        assert denied["status"] == 401
        assert not (await endless.chunked(256 * 1024))[1]  # still streaming meanwhile
    finally:
        await endless.close()
    await settle(region.url)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_a_peer_that_stops_reading_costs_no_cpu(region: Pacer):
    pid = region.process.proc.pid
    stalled = await Raw.open(region.url)
    try:
        await stalled.send("/v1/chat/completions", mode("endless-body"))
        await stalled.head()
        await asyncio.sleep(0.3)  # the socket buffers fill, then the writer waits on drain()
        before = _cpu_s(pid)
        await asyncio.sleep(1.0)
        assert _cpu_s(pid) - before < 0.15
        assert (await health(region.url))["open_connections"] == 2
    finally:
        await stalled.close()
    await settle(region.url)


async def test_flags_set_the_default_mode_the_time_limit_and_the_connection_bound(tmp_path):
    limited = start_hostile(tmp_path, mode="hang", limit_s=1, max_connections=2)
    try:
        hanging = [await Raw.open(limited.url) for _ in range(2)]
        started = time.monotonic()
        for raw in hanging:
            await raw.send("/v1/completions", {"prompt": "x"})  # no mode:, so --mode hang
        await asyncio.sleep(0.2)
        third = await Raw.open(limited.url)
        async with asyncio.timeout(3):
            assert await third.reader.read() == b""  # over --max-connections: closed at once
        await third.close()
        async with asyncio.timeout(5):
            for raw in hanging:
                assert await raw.reader.read() == b""  # nothing sent, then closed at --limit-s
                await raw.close()
        assert 0.8 < time.monotonic() - started < 4
        ok = await Raw.open(limited.url)
        status, _, body = await ok.call("/v1/completions", {"prompt": "x", "user": "mode:ok"})
        await ok.close()
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 16
    finally:
        limited.process.stop()


async def test_bad_requests_get_openai_errors_and_the_region_keeps_serving(region: Pacer):
    post = "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{}"
    cases = [
        (400, post.format(9, "{not json")),
        (400, post.format(29, '{"user": "mode:no-such-mode"}')),
        (404, "POST /v1/nothing HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"),
        (405, "GET /v1/completions HTTP/1.1\r\n\r\n"),
        (413, post.format(99_999_999, "")),
        (431, "GET /health HTTP/1.1\r\nX-Long: " + "a" * 20_000 + "\r\n\r\n"),
        (400, "GET /health HTTP/1.1\r\nno colon here\r\n\r\n"),
    ]
    for expected, request in cases:
        raw = await Raw.open(region.url)
        try:
            raw.writer.write(request.encode())
            status, headers = await raw.head()
            error = json.loads(await raw.body(headers))["error"]
        finally:
            await raw.close()
        assert status == expected and set(error) == {"message", "type", "param", "code"}
    await settle(region.url)
