"""Compressed request bodies on the real region: a body that does not match its Content-Encoding is a 400,
a bomb is a 413 without being inflated in memory, and the node keeps serving (issue 7, item 4); JSON nested
past the limit is a 400 naming its field, never a 500 with a traceback (issue 34, N5)."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from pathlib import Path

import aiohttp
import pytest

from nearshore.bodies import MAX_JSON_DEPTH
from tests.conftest import MODEL, Node
from tests.edge_fixtures import edge_over_pacer

pytestmark = pytest.mark.slow

GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}


async def post_raw(node: Node, body: bytes, encoding: str) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    async with (
        aiohttp.ClientSession(auto_decompress=False) as s,
        s.post(node.url + "/v1/chat/completions", data=body, headers=headers) as r,
    ):
        return r.status, await r.json(content_type=None)


def rss_high_water_kb(node: Node) -> int:
    assert node.process.proc is not None
    for line in Path(f"/proc/{node.process.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "x-gzip"])
async def test_body_that_is_not_its_encoding_is_a_400(region: Node, encoding: str):
    status, payload = await post_raw(region, json.dumps(GOOD).encode(), encoding)
    assert status == 400, payload
    error = payload["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_content_encoding"
    assert encoding in error["message"]
    # A truncated stream of the right kind is refused the same way.
    status, payload = await post_raw(region, gzip.compress(json.dumps(GOOD).encode())[:20], "gzip")
    assert status == 400 and payload["error"]["code"] == "invalid_content_encoding"
    assert "Traceback" not in region.process.log_tail(200)


async def test_unsupported_encoding_is_a_415(region: Node):
    status, payload = await post_raw(region, json.dumps(GOOD).encode(), "br")
    assert status == 415, payload
    assert payload["error"]["code"] == "unsupported_media_type" and "br" in payload["error"]["message"]


@pytest.mark.parametrize("compress", [gzip.compress, zlib.compress], ids=["gzip", "deflate"])
async def test_compressed_bodies_are_served(region: Node, compress):
    encoding = "gzip" if compress is gzip.compress else "deflate"
    status, payload = await post_raw(region, compress(json.dumps(GOOD).encode()), encoding)
    assert status == 200, payload
    assert payload["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_compression_bomb_is_a_413_without_inflating_it(region: Node, encoding: str):
    inflated_bytes = 512 << 20  # 512 MiB of zeros inside a ~0.5 MiB body; the node allows 64 KiB
    zeros = b"\0" * (1 << 20)
    packer = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    parts = [packer.compress(b'{"model": "' + zeros)]
    parts += [packer.compress(zeros) for _ in range(inflated_bytes // len(zeros) - 1)]
    bomb = b"".join(parts) + packer.flush()
    before_kb = rss_high_water_kb(region)
    status, payload = await post_raw(region, bomb, encoding)
    assert status == 413, payload
    assert payload["error"]["code"] == "request_too_large"
    assert rss_high_water_kb(region) - before_kb < 64 << 10  # far below the 512 MiB it inflates to
    status, payload = await post_raw(region, gzip.compress(json.dumps(GOOD).encode()), "gzip")
    assert status == 200, payload


async def test_edge_answers_a_bad_encoding_with_a_400(tmp_path):
    """The edge shares read_json and inflates bodies itself, as the region does: the same errors."""
    edge = edge_over_pacer(tmp_path, "pacer", tokens=2, interval_ms=1)
    try:
        key = edge.new_key()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        body = json.dumps(GOOD).encode()
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            await _until_key_is_known(s, edge.url, headers, edge.ssl_context())
            for encoding, data, status, code in [
                ("gzip", body, 400, "invalid_content_encoding"),
                ("deflate", body, 400, "invalid_content_encoding"),
                ("gzip", gzip.compress(body)[:20], 400, "invalid_content_encoding"),
                ("br", body, 415, "unsupported_media_type"),
                ("gzip", gzip.compress(body), 200, None),
            ]:
                async with s.post(
                    edge.url + "/v1/chat/completions",
                    data=data,
                    headers={**headers, "Content-Encoding": encoding},
                    ssl=edge.ssl_context(),
                ) as r:
                    payload = await r.json(content_type=None)
                assert r.status == status, (encoding, payload)
                if code:
                    assert payload["error"]["code"] == code, (encoding, data[:20])
        assert "Traceback" not in edge.process.log_tail(200)
    finally:
        edge.stop()


async def _until_key_is_known(s: aiohttp.ClientSession, url: str, headers: dict, context) -> None:
    """The edge picks up keys made after its start on its next refresh."""
    for _ in range(100):
        async with s.post(url + "/v1/chat/completions", data=b"{}", headers=headers, ssl=context) as r:
            if r.status != 401:
                return
        await asyncio.sleep(0.1)
    raise AssertionError("the edge never learned the key")


# ---- JSON nested past the limit (issue 34, N5) ---------------------------------------------------------

FIELDS = ("guided_json", "response_format", "tools")


def nested_body(field: str, depth: int) -> bytes:
    """GOOD with a schema of ``depth`` objects inside each other in ``field``, written by hand: the json
    module cannot write it (it recurses too)."""
    schema = b'{"a":' * depth + b"1" + b"}" * depth
    value = {
        "guided_json": schema,
        "response_format": b'{"type":"json_schema","json_schema":{"name":"deep","schema":' + schema + b"}}",
        "tools": b'[{"type":"function","function":{"name":"f","parameters":' + schema + b"}}]",
    }[field]
    return json.dumps(GOOD).encode()[:-1] + b', "' + field.encode() + b'": ' + value + b"}"


def log_since(node_log: Path, offset: int) -> str:
    with node_log.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


@pytest.mark.parametrize("field", FIELDS)
async def test_json_nested_past_the_limit_is_a_400_naming_its_field_and_the_node_serves_on(
    region: Node, field: str
):
    log = region.process.log_path
    offset = log.stat().st_size
    for depth in (MAX_JSON_DEPTH + 1, 5000):  # just past the limit, and past Python's recursion limit
        status, payload = await post_raw(region, nested_body(field, depth), "identity")
        assert status == 400, (depth, payload)
        error = payload["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", field), error
        assert f"at most {MAX_JSON_DEPTH}" in error["message"], error
    status, payload = await post_raw(region, json.dumps(GOOD).encode(), "identity")
    assert status == 200, payload
    assert "Traceback" not in log_since(log, offset)
