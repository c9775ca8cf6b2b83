"""The edge always tells the region the max_tokens it reserved (issue 18, item 7): a region whose own default
differs never produces more, or less, than the client was reserved and billed for."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import msgspec
import pytest

from edge.call_body import region_body
from nearshore.protocol.schemas import chat_request_decoder, completion_request_decoder
from tests.edge_fixtures import start_edge, start_pacer


def test_the_region_body_says_the_reserved_max_tokens_when_the_client_named_none():
    chat = chat_request_decoder.decode(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    assert json.loads(region_body(chat, 256))["max_tokens"] == 256
    named = msgspec.structs.replace(chat, max_completion_tokens=9)
    sent = json.loads(region_body(named, 256))
    assert sent["max_completion_tokens"] == 9 and sent.get("max_tokens") is None  # the client's own stands
    completion = completion_request_decoder.decode(b'{"model": "m", "prompt": "hi"}')
    assert json.loads(region_body(completion, 16))["max_tokens"] == 16
    scored = completion_request_decoder.decode(
        b'{"model": "m", "prompt": "hi", "max_tokens": 0, "echo": true}'
    )
    assert json.loads(region_body(scored, 16))["max_tokens"] == 0


def test_the_region_body_leaves_out_what_is_at_its_default():
    """What a region one release behind still takes: it forbids the fields it does not know, and a request
    that does not use a newer field does not send it (not even as null)."""
    chat = chat_request_decoder.decode(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    assert set(json.loads(region_body(chat, 256))) == {"model", "messages", "max_tokens"}
    labelled = msgspec.structs.replace(chat, metadata={"team": "a"}, temperature=0.0)
    assert json.loads(region_body(labelled, 256))["metadata"] == {"team": "a"}  # what was said goes
    assert json.loads(region_body(labelled, 256))["temperature"] == 0.0
    completion = completion_request_decoder.decode(b'{"model": "m", "prompt": "hi", "echo": true}')
    assert set(json.loads(region_body(completion, 16))) == {"model", "prompt", "echo", "max_tokens"}


def test_a_stream_asks_for_usage_and_a_fallback_is_asked_by_its_own_name():
    chat = chat_request_decoder.decode(
        b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
    )
    sent = json.loads(region_body(chat, 5, "small"))
    assert sent["model"] == "small" and sent["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [False, True])
async def test_an_edge_whose_default_differs_from_the_regions_gets_what_it_reserved(
    tmp_path: Path, stream: bool
):
    pacer = start_pacer(tmp_path, tokens=40, interval_ms=1)  # the region's own default: 40 tokens
    edge = start_edge(tmp_path / "edge", [("pacer", pacer.url)], top={"default_max_tokens": 5})
    edge.extra.append(pacer.process)
    try:
        key = edge.new_key()
        payload = {"model": "gemma-3-270m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
        connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.post(
                edge.url + "/v1/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
            ) as r,
        ):
            assert r.status == 200
            body = await r.read()
        assert b'"error"' not in body, body[-300:]
        row = edge.ledger_rows()[-1]
        assert row["completion_tokens"] == 5 and row["status"] == "ok"
    finally:
        edge.stop()
