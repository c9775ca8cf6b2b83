"""A client that reads slower than the region streams: the region's connection is paused while the client's
socket is full and resumed once it drains (edge/sse_relay.py), so a reader that stops for a while and then
reads on misses nothing. (One that stops for good is cut off after write_timeout_s: tests/edge/test_proxy.py.)
"""

from __future__ import annotations

import asyncio

import pytest

from tests.edge.test_proxy import CHAT, ledger_rows, session
from tests.edge_fixtures import edge_over_pacer

pytestmark = pytest.mark.slow


async def test_a_reader_that_pauses_then_reads_on_gets_the_whole_stream(tmp_path):
    """The region is paused while the client's socket is full, and resumed once it has drained: a client
    that stops reading for a while (less than write_timeout_s) and then reads on misses nothing."""
    tokens = 20000
    edge = edge_over_pacer(
        tmp_path, "firehose", {"server": {"write_timeout_s": 30.0}}, tokens=tokens, interval_ms=0.05
    )
    try:
        key = edge.new_key(tpm=10**9)
        async with session(edge) as s:
            payload = {**CHAT, "stream": True, "max_tokens": tokens}
            headers = {"Authorization": f"Bearer {key}"}
            async with s.post(edge.url + "/v1/chat/completions", json=payload, headers=headers) as r:
                assert r.status == 200
                body = bytearray(await r.content.read(1000))
                await asyncio.sleep(1.0)  # a reader that stops reading for a second: the socket fills
                body += await r.content.read()
        events = [e for e in body.split(b"\n\n") if e.startswith(b"data: {")]
        content = [e for e in events if b'"content":"' in e and b'"role"' not in e]
        assert len(content) == tokens and body.rstrip().endswith(b"data: [DONE]")
        rows = [r for r in ledger_rows(edge) if r["key_id"] == key.split("-")[1]]
        assert rows and rows[0]["status"] == "ok" and rows[0]["completion_tokens"] == tokens
    finally:
        edge.stop()
