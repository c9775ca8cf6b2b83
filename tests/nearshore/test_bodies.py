"""Request bodies under a size limit whatever their Content-Encoding claims (nearshore/bodies.py), read by a
real aiohttp server on loopback: as Nearshore's servers run it (``auto_decompress=False``: gzip, x-gzip and
deflate, zlib or raw, inflated here in pieces) and on aiohttp's default (it inflates; its errors become the
same 400). Bad bytes are a 400, an unknown encoding a 415, a body that inflates past the limit a 413. JSON
nested past MAX_JSON_DEPTH is a 400 naming its field, read on the bytes before anything decodes them."""

from __future__ import annotations

import gzip
import json
import os
import random
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from nearshore.bodies import BROKEN_BODY, MAX_JSON_DEPTH, check_json_depth, json_depth, read_body
from nearshore.protocol.errors import ApiError

LIMIT = 1000
TIMEOUT = aiohttp.ClientTimeout(total=10)


async def echo(request: web.Request) -> web.Response:
    try:
        body = await read_body(request)
    except ApiError as exc:
        response = web.json_response(
            {"code": exc.kind.code, "message": exc.message, "broken": request.get(BROKEN_BODY, False)},
            status=exc.status,
        )
        if request.get(BROKEN_BODY):  # what nearshore.httpkit.openai_errors does with it
            response.force_close()
        return response
    return web.Response(body=body)


@asynccontextmanager
async def serving(auto_decompress: bool) -> AsyncIterator[str]:
    app = web.Application(client_max_size=LIMIT)
    app.router.add_post("/", echo)
    runner = web.AppRunner(app, auto_decompress=auto_decompress, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/"
    finally:
        await runner.cleanup()


@pytest.fixture
async def raw() -> AsyncIterator[str]:
    """As the edge and the region run: the raw bytes handed over, inflated by read_body."""
    async with serving(auto_decompress=False) as url:
        yield url


@pytest.fixture
async def inflating() -> AsyncIterator[str]:
    """On aiohttp's default: it inflates gzip and deflate itself."""
    async with serving(auto_decompress=True) as url:
        yield url


async def post(url: str, data, encoding: str | None = None) -> tuple[int, bytes | dict, bool]:
    """(status, the body echoed or the error as JSON, whether the server closed the connection)."""
    headers = {"Content-Encoding": encoding} if encoding is not None else {}
    async with (
        aiohttp.ClientSession(auto_decompress=False, timeout=TIMEOUT) as session,
        session.post(url, data=data, headers=headers) as r,
    ):
        raw = await r.read()
        closed = r.headers.get("Connection", "").lower() == "close"
        if r.content_type == "application/json":
            return r.status, await r.json(), closed
        return r.status, raw, closed


async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


TEXT = b'{"model": "m", "messages": [{"role": "user", "content": "hello"}]}'


async def test_an_identity_body_is_read_as_it_is(raw):
    assert (await post(raw, TEXT))[:2] == (200, TEXT)
    assert (await post(raw, TEXT, "identity"))[:2] == (200, TEXT)
    assert (await post(raw, b""))[:2] == (200, b"")


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "GZip", " gzip "])
async def test_a_gzip_body_is_inflated_whatever_the_case_and_spacing_of_its_header(raw, encoding):
    assert (await post(raw, gzip.compress(TEXT), encoding))[:2] == (200, TEXT)


async def test_deflate_is_accepted_as_zlib_and_as_raw_deflate(raw):
    assert (await post(raw, zlib.compress(TEXT), "deflate"))[:2] == (200, TEXT)
    squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw_deflate = squeeze.compress(TEXT) + squeeze.flush()
    assert (await post(raw, raw_deflate, "deflate"))[:2] == (200, TEXT)


async def test_a_body_sent_in_many_pieces_is_inflated_whole(raw):
    text = b"".join(b"line %d of the prompt\n" % i for i in range(40))[:LIMIT]
    assert (await post(raw, chunks(gzip.compress(text), 7), "gzip"))[:2] == (200, text)


@pytest.mark.parametrize(
    "body",
    [
        b"not gzip at all",
        gzip.compress(TEXT)[:-12],  # cut short
        gzip.compress(TEXT) + b"trailing",  # bytes after the end of the stream
        b"",  # nothing at all
    ],
    ids=["garbage", "cut-short", "trailing-bytes", "empty"],
)
async def test_a_body_that_is_not_its_encoding_is_a_400_naming_it(raw, body):
    status, error, _ = await post(raw, body, "gzip")
    assert status == 400 and error["code"] == "invalid_content_encoding"
    assert error["message"] == "The request body is not valid gzip data, as its Content-Encoding: gzip says."


async def test_a_deflate_body_that_is_not_deflate_is_a_400_naming_deflate(raw):
    status, error, _ = await post(raw, b"\x78\x9c definitely not", "deflate")
    assert status == 400 and "not valid deflate data" in error["message"]


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, deflate"])
async def test_an_encoding_not_decoded_here_is_a_415(raw, encoding):
    status, error, _ = await post(raw, b"whatever", encoding)
    assert status == 415 and error["code"] == "unsupported_media_type"
    assert repr(encoding) in error["message"] and "identity, gzip or deflate" in error["message"]


async def test_an_inflated_body_may_be_exactly_the_limit_and_not_a_byte_more(raw):
    assert (await post(raw, gzip.compress(b"a" * LIMIT), "gzip"))[:2] == (200, b"a" * LIMIT)
    status, error, _ = await post(raw, gzip.compress(b"a" * (LIMIT + 1)), "gzip")
    assert status == 413 and error["code"] == "request_too_large"
    assert error["message"] == f"Request body too large: the decoded body may be at most {LIMIT} bytes."


async def test_a_small_bomb_is_refused_while_inflating(raw):
    bomb = gzip.compress(b"\0" * (1 << 20))  # 1 MiB of zeros in about 1 KiB
    head = bomb[: LIMIT // 2]  # within the limit as sent, a thousand times past it inflated
    assert len(zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head)) > 100 * LIMIT
    status, error, _ = await post(raw, chunks(head, 100), "gzip")
    assert status == 413 and error["code"] == "request_too_large"


async def test_compressed_bytes_past_the_limit_are_refused_before_inflating(raw):
    noise = gzip.compress(os.urandom(2 * LIMIT))  # incompressible: the compressed body is past the limit
    status, error, _ = await post(raw, chunks(noise, 256), "gzip")
    assert status == 413 and error["code"] == "request_too_large"


async def test_an_identity_body_past_the_limit_is_a_413(raw):
    assert (await post(raw, b"x" * (LIMIT + 1)))[0] == 413


async def test_on_aiohttps_default_its_inflated_body_is_read(inflating):
    assert (await post(inflating, gzip.compress(TEXT), "gzip"))[:2] == (200, TEXT)
    assert (await post(inflating, zlib.compress(TEXT), "deflate"))[:2] == (200, TEXT)
    assert (await post(inflating, TEXT))[:2] == (200, TEXT)


async def test_on_aiohttps_default_bad_bytes_are_the_same_400_and_the_connection_is_marked_broken(inflating):
    status, error, closed = await post(inflating, b"not gzip at all", "gzip")
    assert status == 400 and error["code"] == "invalid_content_encoding"
    assert error["message"] == "The request body is not valid gzip data, as its Content-Encoding: gzip says."
    assert error["broken"] is True and closed
    # The server keeps serving.
    assert (await post(inflating, gzip.compress(TEXT), "gzip"))[:2] == (200, TEXT)


async def test_on_aiohttps_default_a_bomb_is_a_413(inflating):
    assert (await post(inflating, gzip.compress(b"\0" * 100_000), "gzip"))[0] == 413


async def test_a_gzip_body_of_several_members_is_read_whole(raw):
    body = gzip.compress(b"hello ") + gzip.compress(b"world")
    assert gzip.decompress(body) == b"hello world"
    assert (await post(raw, body, "gzip"))[:2] == (200, b"hello world")


async def test_bytes_after_a_deflate_stream_are_refused(raw):
    body = zlib.compress(b"hello") + b"tail"
    status, _ = (await post(raw, body, "deflate"))[:2]
    assert status == 400


# ---- nesting (issue 34, N5) -----------------------------------------------------------------------------


def nested(depth: int, field: str = "guided_json") -> bytes:
    return b'{"model": "m", "' + field.encode() + b'": ' + b'{"a":' * (depth - 1) + b"1" + b"}" * depth


@pytest.mark.parametrize(
    "text, depth",
    [
        (b"1", 0),
        (b'"[{[{"', 0),
        (b"{}", 1),
        (b'{"a": [1, {"b": "]]]"}], "c": []}', 3),
        (b'["\\"[", [["\\\\"]]]', 3),  # escaped quotes and backslashes end no string early
        (b"[" * 100_000 + b"]" * 100_000, 100_000),
    ],
)
def test_json_depth_counts_arrays_and_objects_and_never_brackets_in_strings(text, depth):
    assert json_depth(text) == depth


def _depth_of(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth_of, value.values()), default=0)
    return 0


def test_json_depth_is_the_decoded_documents_depth_for_random_documents():
    """Strings full of brackets, quotes and backslashes (escaped as JSON escapes them), keys among them."""
    rng = random.Random(7)
    pieces = ["[", "]", "{", "}", '"', "\\", "a", " ", "Ω", '\\"', "\\\\"]

    def text() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))

    def value(levels: int) -> object:
        if levels <= 0 or rng.random() < 0.25:
            return rng.choice([1, None, True, 2.5, text()])
        if rng.random() < 0.5:
            return [value(levels - 1) for _ in range(rng.randint(0, 4))]
        return {text(): value(levels - 1) for _ in range(rng.randint(0, 4))}

    for _ in range(2000):
        document = value(rng.randint(0, 12))
        encoded = json.dumps(document, ensure_ascii=rng.random() < 0.5).encode()
        assert json_depth(encoded) == _depth_of(document), encoded


def test_a_body_nested_to_the_limit_passes_and_one_level_deeper_is_a_400_naming_its_field():
    check_json_depth(nested(MAX_JSON_DEPTH))
    check_json_depth(b'{"s": "' + b"[" * 10_000 + b'"}')  # brackets in a string nest nothing
    for field in ("guided_json", "tools", "response_format", 'we\\"ird'):
        with pytest.raises(ApiError) as refused:
            check_json_depth(nested(MAX_JSON_DEPTH + 1, field))
        assert refused.value.status == 400 and refused.value.kind.type == "invalid_request_error"
        assert refused.value.param == field.replace("\\", "")
        assert f"{MAX_JSON_DEPTH + 1} levels" in refused.value.message
    with pytest.raises(ApiError) as refused:  # a top-level array has no field to name
        check_json_depth(b"[" * 1000 + b"]" * 1000)
    assert refused.value.param is None


def test_the_field_named_is_the_one_that_nests_too_deep_not_the_last_one():
    deep = b"[" * 100 + b"]" * 100
    body = b'{"messages": [{"content": "x"}], "tools": ' + deep + b', "n": 1, "stop": ["a"]}'
    with pytest.raises(ApiError) as refused:
        check_json_depth(body)
    assert refused.value.param == "tools"
