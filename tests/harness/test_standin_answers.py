"""The stand-ins' answers, built by the protocol's builder: byte for byte what the pacer and the hostile
region sent before it (tests/nearshore/answer_bytes.json, captured from their own code), lies included."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from harness.standins import pacer
from harness.standins.hostile_answers import Answer, usage
from nearshore.protocol.answers import answer_for
from nearshore.protocol.schemas import Usage

PINNED = json.loads((Path(__file__).parents[1] / "nearshore" / "answer_bytes.json").read_text())
CREATED = 1_700_000_000


def pinned(name: str) -> bytes:
    return PINNED[name].encode()


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_the_pacers_events(kind: str):
    chunks = pacer._chunks(
        answer_for(kind == "chat", "req-3", "gemma-3-270m", created=CREATED), 3, Usage.of(10, 3)
    )
    assert b"".join(chunks.tokens) == pinned(f"pacer_{kind}_tokens") and len(chunks.tokens) == 3
    assert chunks.end == pinned(f"pacer_{kind}_end") and chunks.usage == pinned(f"pacer_{kind}_usage")
    none = pacer._chunks(answer_for(kind == "chat", "req-3", "m", created=CREATED), 0, Usage.of(10, 0))
    assert b"".join(none.tokens) == pinned(f"pacer_{kind}_zero_tokens")


@pytest.mark.parametrize(("path", "kind"), [("/v1/chat/completions", "chat"), ("/v1/completions", "text")])
async def test_the_pacers_stream_over_http(path: str, kind: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(time, "time", lambda: CREATED + 0.25)
    settings = pacer.PacerSettings(3, 0.0, 0, 0, "p")
    body = {
        "model": "gemma-3-270m",
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with TestClient(TestServer(pacer.create_app(settings))) as client:
        r = await client.post(path, json=body, headers={"x-request-id": "req-5"})
        assert await r.read() == pinned(f"pacer_{kind}_stream")


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_the_hostile_regions_answers_and_lies(kind: str):
    answer = Answer(kind == "chat", "req-6", "gemma-3-270m", CREATED)
    assert answer.id == ("chatcmpl-req-6" if kind == "chat" else "cmpl-req-6")
    assert answer.unary(" token" * 3, usage(10, 3)) == pinned(f"hostile_{kind}_whole")
    assert answer.unary(" token", usage(10, 2**70)) == pinned(f"hostile_{kind}_whole_lie")
    assert b"".join(answer.stream(3, usage(10, 3), True)) == pinned(f"hostile_{kind}_stream")
    stream = answer.stream(2, usage(10, 2), False, "first")
    assert b"".join(stream) == pinned(f"hostile_{kind}_stream_nousage")
    assert b"".join(answer.stream(0, usage(-10, -1000), True)) == pinned(f"hostile_{kind}_stream_zero")
    assert answer.usage_event(usage(10, 10**15)) == pinned(f"hostile_{kind}_usage_lie")
