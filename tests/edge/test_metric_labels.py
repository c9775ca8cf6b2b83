"""Label values from outside the edge cannot mint time series (issue 19, item 4): a region whose every error
names a new 4 kB code once made 2,000 ``upstream_errors_total`` series in 2,000 requests (/metrics 10 KB ->
16 MB); codes the edge does not know, and models it does not serve, are counted as ``other``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from edge.metric_labels import ERROR_CODES, OTHER, error_code_label, model_label
from nearshore.protocol import errors
from nearshore.protocol.errors import ErrorKind
from tests.edge_fixtures import Edge
from tests.fake_region import FakeRegion, edge_over

MODEL = "gemma-3-270m"
CODE_BYTES = 4096
ERRORS = "nearshore_edge:upstream_errors_total{"


# ---- the mapping --------------------------------------------------------------------------------------


def test_every_code_the_edge_answers_is_its_own_label():
    kinds = [k for k in vars(errors).values() if isinstance(k, ErrorKind)]
    assert len(kinds) > 20
    for kind in kinds:
        # A failed journey's error_code: the kind's code, or its type when it has none.
        assert error_code_label(kind.code or kind.type) == (kind.code or kind.type)
    for code in (
        "upstream_timeout",
        "upstream_unavailable",
        "upstream_rate_limited",
        "bad_upstream_response",
    ):
        assert error_code_label(code) == code
    assert error_code_label("context_length_exceeded") == "context_length_exceeded"
    assert error_code_label("content_filter") == "content_filter"  # a provider's, passed on


def test_anything_else_is_other():
    assert OTHER not in ERROR_CODES
    for code in ("", "x" * CODE_BYTES, secrets.token_hex(32), "Upstream_Timeout", "upstream_timeout "):
        assert error_code_label(code) == OTHER
    assert len(ERROR_CODES) < 100  # a fixed, small set


def test_models_the_edge_does_not_serve_are_other():
    configured = ["gemma-3-270m", "all-minilm-l6-v2"]
    assert model_label("gemma-3-270m", configured) == "gemma-3-270m"
    assert model_label("gpt-" + secrets.token_hex(200), configured) == OTHER
    assert model_label("", configured) == OTHER


# ---- a real edge in front of a region whose every error names a new code ------------------------------


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def noisy(kind: str, body: dict[str, Any], request: web.Request) -> web.StreamResponse:
    """A token, then an error event with a new long code (or, on odd requests, a new long type and no
    code); a unary request is refused (400) with a new code."""
    new = secrets.token_hex(CODE_BYTES // 2)
    odd = secrets.randbits(1)
    error = {
        "message": "the region failed",
        "type": new if odd else "server_error",
        "code": None if odd else new,
    }
    if not body.get("stream"):
        return web.json_response(
            {"error": {**error, "type": "invalid_request_error", "code": new}}, status=400
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if kind == "chat":
        delta = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello"}}]}
    else:
        delta = {"choices": [{"index": 0, "text": "Hello"}]}
    await response.write(_event({"id": "x", "created": 0, "model": body["model"], **delta}))
    await response.write(_event({"error": error}))
    await response.write_eof()
    return response


@pytest.fixture(scope="module")
async def edge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edge]:
    async with edge_over(FakeRegion(noisy), tmp_path_factory.mktemp("metric-labels"), "noisy") as e:
        yield e


async def ask(s: aiohttp.ClientSession, edge: Edge, key: str, kind: str, *, stream: bool, model: str = MODEL):
    payload: dict[str, Any] = {"model": model, "max_tokens": 4, "stream": stream}
    if kind == "chat":
        payload["messages"] = [{"role": "user", "content": "hi"}]
    else:
        payload["prompt"] = "hi"
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    headers = {"Authorization": f"Bearer {key}", "x-client-request-id": uuid.uuid4().hex}
    async with s.post(edge.url + path, json=payload, headers=headers) as r:
        return r.status, await r.read()


async def scrape(edge: Edge) -> str:
    async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/metrics") as r:
        assert r.status == 200
        return await r.text()


def series(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


async def run(edge: Edge, key: str, n: int) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        for i in range(n):
            kind = "chat" if i % 2 else "completions"
            status, body = await ask(s, edge, key, kind, stream=True)
            assert status == 200 and b'"error"' in body and body.endswith(b"data: [DONE]\n\n"), body[-300:]
            if i % 10 == 0:  # a refusal is the client's to see: passed on, not counted, no series either
                status, body = await ask(s, edge, key, kind, stream=False)
                assert status == 400, body[:300]


@pytest.mark.slow
async def test_new_error_codes_each_request_leave_the_series_bounded(edge: Edge):
    key = await asyncio.to_thread(edge.new_key, rpm=100_000, tpm=100_000_000)
    await run(edge, key, 20)
    before = await scrape(edge)
    await run(edge, key, 200)
    after = await scrape(edge)
    errors_after = series(after, ERRORS)
    assert len(errors_after) == len(series(before, ERRORS)) <= 2, errors_after
    assert set(errors_after) and all('code="other"' in line for line in errors_after), errors_after
    total = sum(float(line.rsplit(" ", 1)[1]) for line in errors_after)
    assert total == 220  # every failed stream counted, under one label
    # Roughly flat: counters gain digits, no new series (one 4 kB code alone would be more than this).
    assert len(after) - len(before) < 1024, (len(before), len(after))
    assert all(len(line) < 512 for line in after.splitlines())


@pytest.mark.slow
async def test_models_a_client_names_make_no_series(edge: Edge):
    key = await asyncio.to_thread(edge.new_key, rpm=100_000, tpm=100_000_000)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        for _ in range(20):
            status, _ = await ask(s, edge, key, "chat", stream=False, model="m-" + secrets.token_hex(64))
            assert status == 404
    text = await scrape(edge)
    labelled = [line for line in text.splitlines() if 'model="' in line and not line.startswith("#")]
    values = {line.split('model="', 1)[1].split('"', 1)[0] for line in labelled}
    assert values <= {MODEL, OTHER}, values
