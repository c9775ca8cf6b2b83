"""`nearshore hostile`'s provider faults (harness/standins/hostile_provider.py): each mode's bytes on the
wire, the mode spec (arguments, one mode per instance), and the test routes /_log and /_control."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from typing import Any

import pytest

from harness.standins import hostile_provider
from harness.standins.hostile import ALL_MODES, MODES, mode_spec
from harness.standins.hostile_provider import PROVIDER_MODES
from harness.standins.hostile_server import HostileRegion, HostileSettings
from harness.standins.hostile_spec import Choice, Spec, SpecError, bind, parse
from harness.standins.hostile_state import MAX_LOGGED, Memory, Record, RequestLog
from tests.edge_fixtures import EVENTUALLY_S, Pacer, start_hostile

TOKENS = 8
CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


# ---- the spec, pure ---------------------------------------------------------------------------------------


def test_a_plain_spec_is_one_choice_for_every_instance():
    spec = parse("stall-at:20:30")
    assert spec == Spec({"*": Choice("stall-at", ("20", "30"))})
    assert spec.pick("london") == spec.pick("paris") == Choice("stall-at", ("20", "30"))
    assert str(spec) == "stall-at:20:30" and str(parse("ok")) == "ok"


def test_a_spec_per_instance_picks_by_name_then_star_then_none():
    spec = parse("london=429:1,*=ok")
    assert spec.pick("london") == Choice("429", ("1",)) and spec.pick("paris") == Choice("ok")
    named = parse("london=503,paris=ok")
    assert named.pick("paris") == Choice("ok") and named.pick("rome") is None
    assert str(named) == "london=503,paris=ok"


@pytest.mark.parametrize(
    "text",
    ["", "Bad", "429:", "429::1", "429:a b", "london=", "=ok", "london=503,ok", "a=1,a=2", "london=503,",
     "a=b=c", "lon don=ok", "x" * 600],
)  # fmt: skip
def test_bad_syntax_is_a_spec_error(text: str):
    with pytest.raises(SpecError):
        parse(text)


def test_bind_fills_defaults_converts_and_refuses_bad_arguments():
    stall = PROVIDER_MODES["stall-at"].params
    assert bind(stall, Choice("stall-at")) == {"at": 20, "stall_s": 30.0}
    assert bind(stall, Choice("stall-at", ("3", "0.5"))) == {"at": 3, "stall_s": 0.5}
    assert bind(PROVIDER_MODES["malformed-chunk"].params, Choice("m", ("1", "shape")))["kind"] == "shape"
    bad = [("stall-at", "x"), ("stall-at", "1.5"), ("stall-at", "-1"), ("stall-at", "1", "inf"),
           ("stall-at", "1", "nan"), ("stall-at", "1", "9999"), ("stall-at", "1", "2", "3"),
           ("malformed-chunk", "1", "other"), ("ok", "1"), ("503", "1"), ("cut-at", "1", "0")]  # fmt: skip
    for name, *args in bad:
        with pytest.raises(SpecError, match=name):
            bind(ALL_MODES[name].params, Choice(name, tuple(args)))


def test_every_provider_mode_is_documented_in_order_binds_its_defaults_and_clashes_with_none():
    documented = re.findall(r"^\| ([a-z0-9-]+) +\|", hostile_provider.__doc__ or "", flags=re.MULTILINE)
    assert documented[1:] == list(PROVIDER_MODES)
    assert not set(PROVIDER_MODES) & set(MODES)
    for name, mode in PROVIDER_MODES.items():
        bind(mode.params, Choice(name))


def test_the_mode_flag_takes_a_checked_spec():
    assert mode_spec("london=429:1,*=ok") == "london=429:1,*=ok"
    for bad in ("nope", "429:x", "london=nope"):
        with pytest.raises(argparse.ArgumentTypeError):
            mode_spec(bad)


def test_a_request_picks_its_mode_then_the_override_then_the_flag_then_ok():
    region = HostileRegion(HostileSettings("london", "paris=503", TOKENS, 5, 10), ALL_MODES)
    assert region.choose("mode:london=429:2,*=ok") == (Choice("429", ("2",)), "request")
    assert region.choose("mode:paris=503") == (Choice("ok"), "fallback")  # --mode names paris only
    assert region.choose("someone") == region.choose(None) == (Choice("ok"), "fallback")
    region.set_override(b'{"mode": "london=down:5:x", "for_s": 60}')
    assert region.choose(None) == (Choice("down", ("5", "x")), "control")
    assert region.choose("mode:ok") == (Choice("ok"), "request")
    region.set_override(b'{"mode": null}')
    assert region.override is None
    with pytest.raises(SpecError, match="unknown hostile mode"):
        region.choose("mode:paris=nope,london=ok")  # every instance's choice is checked


def test_memory_and_the_log_are_bounded():
    memory = Memory(max_keys=3)
    first, new = memory.first_seen(("a",))
    assert new and memory.first_seen(("a",)) == (first, False)
    for key in "bcd":
        memory.first_seen((key,))
    assert len(memory) == 3 and memory.first_seen(("a",))[1]  # the oldest was forgotten
    memory.forget(("a",))
    assert memory.first_seen(("a",))[1]
    log = RequestLog()
    for i in range(MAX_LOGGED + 5):
        log.add(Record(float(i), "GET", "/health", None))
    assert len(log.to_json()) == MAX_LOGGED and log.to_json()[0]["t"] == 5.0


# ---- the real process, on the wire --------------------------------------------------------------------


class Wire:
    """A raw HTTP/1.1 client: it sees framing, resets and silences that aiohttp would hide."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> Wire:
        host, port = url.removeprefix("http://").split(":")
        return cls(*await asyncio.open_connection(host, int(port), limit=1 << 20))

    async def send(self, path: str, body: Any = b"", method: str = "POST", **headers: str) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", "Host: hostile", f"Content-Length: {len(raw)}"]
        lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + raw)
        await self.writer.drain()

    async def head(self) -> tuple[int, dict[str, str]]:
        first, *lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").strip().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        return int(first.split(" ")[1]), headers

    async def next_chunk(self) -> bytes:
        """The next chunk's data; b"" for the last chunk."""
        size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
        data = await self.reader.readexactly(size + 2)
        return data[:-2]

    async def body(self, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding") != "chunked":
            return await self.reader.readexactly(int(headers["content-length"]))
        data = b""
        while piece := await self.next_chunk():
            data += piece
        return data

    async def call(self, path: str, body: Any, **headers: str) -> tuple[int, dict[str, str], bytes]:
        await self.send(path, body, **headers)
        status, head = await self.head()
        return status, head, await self.body(head)

    async def silent_for(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self.reader.read(1)
        except TimeoutError:
            return True
        return False

    async def close(self) -> None:
        self.writer.close()
        await asyncio.gather(self.writer.wait_closed(), return_exceptions=True)


def ask(spec: str, **fields: Any) -> dict[str, Any]:
    return {**CHAT, "user": f"mode:{spec}", **fields}


def datas(body: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]


def _choices(items: list[bytes]) -> list[dict[str, Any]]:
    chunks = [json.loads(d) for d in items if d != b"[DONE]"]
    return [c["choices"][0] for c in chunks if c["choices"]]


def contents(items: list[bytes]) -> list[str]:
    """The content deltas of a chat stream's events (the role opener's empty content left out)."""
    return [c["delta"]["content"] for c in _choices(items) if c["delta"].get("content")]


def finishes(items: list[bytes]) -> list[str]:
    return [c["finish_reason"] for c in _choices(items) if c["finish_reason"]]


async def route(url: str, path: str, body: Any = None, method: str | None = None) -> tuple[int, Any]:
    """A test route's JSON answer; POST when there is a body."""
    wire = await Wire.open(url)
    try:
        raw = b"" if body is None else body
        status, _, data = await wire.call(path, raw, method=method or ("GET" if body is None else "POST"))
    finally:
        await wire.close()
    return status, json.loads(data)


async def post(url: str, body: Any, **headers: str) -> tuple[int, dict[str, str], bytes]:
    wire = await Wire.open(url)
    try:
        return await wire.call("/v1/chat/completions", body, **headers)
    finally:
        await wire.close()


async def settled(url: str) -> None:
    """Every connection a check opened is gone (only this probe's own is left)."""
    deadline = time.monotonic() + EVENTUALLY_S
    while (await route(url, "/health"))[1]["open_connections"] > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert (await route(url, "/health"))[1]["open_connections"] == 1


@pytest.fixture(scope="module")
def london(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pacer]:
    r = start_hostile(tmp_path_factory.mktemp("london"), name="london", tokens=TOKENS, limit_s=20)
    yield r
    r.process.stop()


@pytest.fixture(scope="module")
def paris(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pacer]:
    r = start_hostile(tmp_path_factory.mktemp("paris"), name="paris", tokens=TOKENS, mode="context-length")
    yield r
    r.process.stop()


slow = pytest.mark.slow


@slow
async def test_429s_carry_retry_after_in_seconds_as_a_date_or_not_at_all(london: Pacer):
    wire = await Wire.open(london.url)  # one keep-alive connection: every answer is well framed
    try:
        for spec, retry in (("429:2", "2"), ("429", "1"), ("429:0.5", "0.5")):
            status, head, body = await wire.call("/v1/chat/completions", ask(spec))
            error = json.loads(body)["error"]
            assert status == 429 and head["retry-after"] == retry and head["connection"] == "keep-alive"
            assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
            assert set(error) == {"message", "type", "param", "code"}
        before = time.time()
        status, head, _ = await wire.call("/v1/chat/completions", ask("429-date:2"))
        when = parsedate_to_datetime(head["retry-after"]).timestamp()
        assert status == 429 and head["retry-after"].endswith(" GMT") and before + 1 <= when <= before + 4
        status, head, body = await wire.call("/v1/chat/completions", ask("429-bare"))
        assert status == 429 and "retry-after" not in head and json.loads(body)["error"]["code"]
    finally:
        await wire.close()


@slow
async def test_500_once_fails_once_per_tag_and_the_other_errors_are_provider_shaped(london: Pacer):
    statuses = [(await post(london.url, ask(f"500-once:{tag}")))[0] for tag in ("t1", "t1", "t1", "t2")]
    assert statuses == [500, 200, 200, 500]
    status, _, body = await post(london.url, ask("500-once:t3", **STREAM))
    error = json.loads(body)["error"]
    assert status == 500 and error["message"] == hostile_provider.SERVER_ERROR.message
    assert error["type"] == "server_error" and error["param"] is None and error["code"] is None
    assert datas((await post(london.url, ask("500-once:t3", **STREAM)))[2])[-1] == b"[DONE]"
    status, _, body = await post(london.url, ask("503"))
    assert status == 503 and json.loads(body)["error"]["code"] == "service_unavailable"
    status, _, body = await post(london.url, ask("context-length"))
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert error["type"] == "invalid_request_error" and "maximum context length" in error["message"]
    status, _, body = await post(london.url, ask("content-filter"))
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "content_filter" and error["type"] is None
    assert error["innererror"]["code"] == "ResponsibleAIPolicyViolation"


@slow
async def test_reset_reads_the_request_then_resets_the_connection(london: Pacer):
    wire = await Wire.open(london.url)
    try:
        await wire.send("/v1/chat/completions", ask("reset", **STREAM))
        with pytest.raises(ConnectionResetError):
            async with asyncio.timeout(2):
                assert await wire.reader.read(1) == b"x"  # never: no byte comes before the reset
    finally:
        await wire.close()
    await settled(london.url)


@slow
async def test_slow_first_token_sends_nothing_at_all_then_a_correct_answer(london: Pacer):
    for fields in (STREAM, {}):
        wire = await Wire.open(london.url)
        try:
            started = time.monotonic()
            await wire.send("/v1/chat/completions", ask("slow-first-token:0.6", **fields))
            assert await wire.silent_for(0.4)
            status, head = await wire.head()
            body = await wire.body(head)
            assert status == 200 and 0.55 < time.monotonic() - started < 3
        finally:
            await wire.close()
        if fields:
            assert datas(body)[-1] == b"[DONE]" and len(contents(datas(body))) == TOKENS
        else:
            assert json.loads(body)["usage"]["completion_tokens"] == TOKENS


@slow
async def test_slow_first_event_sends_the_head_at_once_then_waits(london: Pacer):
    wire = await Wire.open(london.url)
    try:
        started = time.monotonic()
        await wire.send("/v1/chat/completions", ask("slow-first-event:2.0", **STREAM))
        status, head = await wire.head()
        assert time.monotonic() - started < 1.5  # the head at once, not with the first event
        assert status == 200 and head["content-type"] == "text/event-stream"
        first = await wire.next_chunk()
        assert first.startswith(b"data: {") and time.monotonic() - started > 1.95
        body = first + await wire.body(head)
        assert len(contents(datas(body))) == TOKENS and datas(body)[-1] == b"[DONE]"
    finally:
        await wire.close()


@slow
async def test_cut_at_sends_exactly_k_content_events_then_a_clean_end(london: Pacer):
    wire = await Wire.open(london.url)
    try:
        for spec, fields, expected in (("cut-at:3:10", {}, 3), ("cut-at", {"max_tokens": 5}, 5)):
            status, head, body = await wire.call("/v1/chat/completions", ask(spec, **STREAM, **fields))
            items = datas(body)
            assert status == 200 and head["connection"] == "keep-alive"  # the chunked end came: body() saw it
            assert len(contents(items)) == expected and not finishes(items) and b"[DONE]" not in items
            assert all(json.loads(d)["usage"] is None for d in items)  # no usage chunk either
        status, head, body = await wire.call("/v1/completions", ask("cut-at:2:4", prompt="x"))
        assert status == 200 and head["transfer-encoding"] == "chunked" and body.startswith(b'{"id":')
        with pytest.raises(json.JSONDecodeError):
            json.loads(body)
        status, _, body = await wire.call("/v1/chat/completions", ask("ok"))  # the connection still serves
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == TOKENS
    finally:
        await wire.close()


@slow
async def test_stall_at_stalls_after_k_events_with_the_socket_open_then_finishes(london: Pacer):
    wire = await Wire.open(london.url)
    try:
        await wire.send("/v1/chat/completions", ask("stall-at:3:1", **STREAM))
        _, head = await wire.head()
        before = [await wire.next_chunk() for _ in range(1 + 3)]  # the role opener and three tokens
        stalled_at = time.monotonic()
        assert len(contents([d for b in before for d in datas(b)])) == 3
        assert await wire.silent_for(0.7)
        rest = await wire.body(head)
        assert time.monotonic() - stalled_at > 0.85
        items = datas(b"".join(before) + rest)
        assert len(contents(items)) == TOKENS and finishes(items) == ["length"] and items[-1] == b"[DONE]"
    finally:
        await wire.close()


@slow
async def test_malformed_chunk_puts_one_bad_event_among_good_ones(london: Pacer):
    for spec, bad in (("malformed-chunk:2", b"{not json"), ("malformed-chunk:2:shape", b'{"foo": 1}')):
        status, _, body = await post(london.url, ask(spec, **STREAM))
        items = datas(body)
        assert status == 200 and items[1 + 2] == bad and items[-1] == b"[DONE]"
        good = items[: 1 + 2] + items[1 + 2 + 1 :]
        assert len(contents(good)) == TOKENS and finishes(good) == ["length"]
    status, _, body = await post(london.url, ask("malformed-chunk:0:shape"))
    assert status == 200 and body == b'{"foo": 1}'


@slow
async def test_no_done_ends_after_the_finish_and_usage_chunks(london: Pacer):
    status, _, body = await post(london.url, ask("no-done", **STREAM))
    items = datas(body)
    assert status == 200 and b"[DONE]" not in items and finishes(items) == ["length"]
    assert json.loads(items[-1])["usage"]["completion_tokens"] == TOKENS and len(contents(items)) == TOKENS


@slow
async def test_one_body_picks_a_mode_per_instance_by_name(london: Pacer, paris: Pacer):
    body = ask("london=429:1,*=ok")
    assert [(await post(r.url, body))[0] for r in (london, paris)] == [429, 200]
    body = ask("london=503")  # paris is not named and there is no *: its own --mode, context-length
    assert [(await post(r.url, body))[0] for r in (london, paris)] == [503, 400]
    assert (await post(paris.url, {**CHAT}))[0] == 400


@slow
async def test_down_answers_503_for_its_window_then_correctly(london: Pacer):
    body = ask("london=down:1:window,*=ok")
    assert (await post(london.url, body))[0] == 503
    await asyncio.sleep(0.4)
    assert (await post(london.url, body))[0] == 503
    await asyncio.sleep(0.8)
    assert (await post(london.url, body))[0] == 200


@slow
async def test_control_sets_the_default_for_a_while_and_re_arms_keyed_faults(london: Pacer):
    url = london.url
    status, state = await route(url, "/_control", {"mode": "503", "for_s": 0.8})
    assert status == 200 and state["mode"] == "503" and 0.5 < state["for_s"] <= 0.8
    assert state["name"] == "london" and state["default"] == "ok"
    assert (await post(url, CHAT))[0] == 503 and (await post(url, ask("ok")))[0] == 200
    await asyncio.sleep(0.9)
    assert (await post(url, CHAT))[0] == 200 and (await route(url, "/_control"))[1]["mode"] is None
    # Fire once, then the tag answers correctly; set through /_control, it fires once again.
    assert [(await post(url, ask("500-once:armed")))[0] for _ in range(2)] == [500, 200]
    await route(url, "/_control", {"mode": "500-once:armed"})
    assert [(await post(url, CHAT))[0] for _ in range(2)] == [500, 200]
    await route(url, "/_control", {"mode": "london=down:0.3:armed,*=ok"})
    assert (await post(url, CHAT))[0] == 503
    await asyncio.sleep(0.4)
    assert (await post(url, CHAT))[0] == 200
    assert await route(url, "/_control", {"mode": None}) == (
        200, {"name": "london", "mode": None, "for_s": None, "default": "ok"})  # fmt: skip
    bad = [{"mode": "nope"}, {"mode": "ok", "for_s": 0}, {"mode": "ok", "for_s": True}, {"mode": 3}, [1]]
    for payload in bad:
        status, error = await route(url, "/_control", payload)
        assert status == 400 and error["error"]["param"] == "mode"
    assert (await route(url, "/_control", {"mode": "ok", "pad": "x" * 5000}))[0] == 413
    assert (await route(url, "/_control", method="PUT"))[0] == 405
    assert (await route(url, "/_control"))[1]["mode"] is None


@slow
async def test_the_log_records_arrival_mode_and_status(london: Pacer):
    url = london.url
    await route(url, "/_log", method="DELETE")
    started = time.time()
    await post(url, ask("stall-at:1:0.5", **STREAM), x_request_id="stalled")
    await post(url, ask("london=429,*=ok"), x_request_id="limited")
    await post(url, ask("nope"), x_request_id="refused")
    await route(url, "/health")
    status, log = await route(url, "/_log")
    assert status == 200 and log["name"] == "london" and log["now"] >= started
    stalled, limited, refused, health = log["requests"]  # reading the log is not logged
    assert stalled["mode"] == "stall-at:1:0.5" and stalled["source"] == "request" and stalled["status"] == 200
    assert stalled["request_id"] == "stalled" and stalled["path"] == "/v1/chat/completions"
    assert started <= stalled["t"] and stalled["end_t"] - stalled["t"] >= 0.45
    assert limited["mode"] == "429" and limited["status"] == 429 and limited["t"] >= stalled["t"] + 0.45
    assert refused["status"] == 400 and refused["mode"] is None
    assert health["path"] == "/health" and health["status"] == 200 and health["method"] == "GET"
    assert set(stalled) == {"t", "method", "path", "request_id", "mode", "source", "status", "end_t"}


@slow
@pytest.mark.parametrize(
    "user",
    ["mode:", "mode:nope", "mode:429:x", "mode:ok:1", "mode:london=", "mode:a=1,a=2", "mode:paris=nope,*=ok",
     "mode:stall-at:1:99999"],
)  # fmt: skip
async def test_a_bad_spec_answers_400_and_the_connection_serves_on(london: Pacer, user: str):
    wire = await Wire.open(london.url)
    try:
        status, head, body = await wire.call("/v1/chat/completions", {**CHAT, "user": user})
        error = json.loads(body)["error"]
        assert status == 400 and error["param"] == "user" and head["connection"] == "keep-alive"
        assert (await wire.call("/v1/chat/completions", ask("ok")))[0] == 200
    finally:
        await wire.close()


@slow
@pytest.mark.parametrize("spec", ["slow-first-token:30", "slow-first-event:30", "stall-at:1:30"])
async def test_every_wait_ends_when_the_peer_leaves(london: Pacer, spec: str):
    wire = await Wire.open(london.url)
    await wire.send("/v1/chat/completions", ask(spec, **STREAM))
    await asyncio.sleep(0.2)
    await wire.close()
    await settled(london.url)  # well before the 30 s wait and the 20 s limit
