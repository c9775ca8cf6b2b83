"""Every bad input gets an OpenAI-shaped error with the right status, and the node keeps serving."""

from __future__ import annotations

import aiohttp
import pytest

from tests.conftest import MODEL, Node

pytestmark = pytest.mark.slow

GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


async def send(
    node: Node,
    body: bytes,
    content_type: str = "application/json",
    path: str = "/v1/chat/completions",
    method: str = "POST",
) -> tuple[int, dict, dict]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, node.url + path, data=body, headers={"Content-Type": content_type}) as r,
    ):
        return r.status, r.headers.copy(), await r.json(content_type=None)


def js(payload: dict) -> bytes:
    import json

    return json.dumps(payload).encode()


CASES = [
    ("malformed json", b'{"model": "gemma-3-270m", "messages": [', 400, "invalid_json", None),
    ("not an object", b"[1, 2]", 400, None, None),
    ("wrong type", js({**GOOD, "temperature": "hot"}), 400, None, "temperature"),
    ("unknown field", js({**GOOD, "frobnicate": True}), 400, None, "frobnicate"),
    (
        "unknown nested field",
        js({**GOOD, "messages": [{"role": "user", "content": "x", "mood": 1}]}),
        400,
        None,
        "messages[0].mood",
    ),
    (
        "bad role",
        js({**GOOD, "messages": [{"role": "wizard", "content": "x"}]}),
        400,
        None,
        "messages[0].role",
    ),
    ("empty messages", js({**GOOD, "messages": []}), 400, None, "messages"),
    ("missing messages", js({"model": MODEL}), 400, None, None),
    ("negative max_tokens", js({**GOOD, "max_tokens": -5}), 400, None, "max_tokens"),
    ("zero max_tokens", js({**GOOD, "max_tokens": 0}), 400, None, "max_tokens"),
    ("huge max_tokens", js({**GOOD, "max_tokens": 10**9}), 400, "context_length_exceeded", "max_tokens"),
    ("temperature too high", js({**GOOD, "temperature": 3}), 400, None, "temperature"),
    ("temperature negative", js({**GOOD, "temperature": -0.1}), 400, None, "temperature"),
    ("top_p zero", js({**GOOD, "top_p": 0}), 400, None, "top_p"),
    ("penalty out of range", js({**GOOD, "presence_penalty": 9}), 400, None, "presence_penalty"),
    ("empty stop string", js({**GOOD, "stop": [""]}), 400, None, "stop[0]"),
    ("n above 128", js({**GOOD, "n": 129}), 400, None, "n"),
    (
        "tool message without its call",
        js({**GOOD, "messages": [{"role": "tool", "content": "x"}]}),
        400,
        None,
        "messages.[0].tool_call_id",
    ),
    (
        "image part",
        js({**GOOD, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
        400,
        None,
        None,
    ),
    ("unknown model", js({**GOOD, "model": "gpt-9"}), 404, "model_not_found", "model"),
    (
        "invalid utf-8",
        b'{"model": "gemma-3-270m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        400,
        None,
        None,
    ),
]


@pytest.mark.parametrize(("name", "body", "status", "code", "param"), CASES, ids=[c[0] for c in CASES])
async def test_bad_chat_request(region: Node, name, body, status, code, param):
    got, _, payload = await send(region, body)
    assert got == status, payload
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    if code:
        assert error["code"] == code
    if param:
        assert error["param"] == param


async def test_wrong_content_type_is_415(region: Node):
    status, _, payload = await send(region, js(GOOD), content_type="text/plain")
    assert status == 415 and payload["error"]["code"] == "unsupported_media_type"


async def test_body_over_limit_is_413(region: Node):
    big = js({**GOOD, "messages": [{"role": "user", "content": "x" * 70_000}]})
    status, _, payload = await send(region, big)
    assert status == 413 and payload["error"]["code"] == "request_too_large"


async def test_bad_completion_prompt(region: Node):
    status, _, payload = await send(region, js({"model": MODEL, "prompt": ""}), path="/v1/completions")
    assert status == 400 and payload["error"]["param"] == "prompt"


async def test_unknown_route_and_method(region: Node):
    status, _, payload = await send(region, b"", path="/v1/nothing-here")
    assert status == 404 and payload["error"]["type"] == "invalid_request_error"
    status, _, payload = await send(region, b"", method="GET")
    assert status == 405 and "error" in payload


async def test_node_still_serves_after_bad_inputs(region: Node):
    for _, body, *_ in CASES:
        await send(region, body)
    status, _, payload = await send(region, js(GOOD))
    assert status == 200 and payload["usage"]["completion_tokens"] == 2


async def test_bad_inputs_do_not_disturb_another_users_stream(region: Node):
    import asyncio
    import json

    from nearshore.protocol.sse import iter_data

    payload = {
        **GOOD,
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    async def streamed() -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(region.url + "/v1/chat/completions", json=payload) as r,
        ):
            text, finish, tokens = "", None, 0
            async for data in iter_data(r.content):
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    text += choice["delta"].get("content") or ""
                    finish = choice["finish_reason"] or finish
            return tokens, finish

    async def abuse() -> None:
        for _, body, *_ in CASES:
            await send(region, body)

    (tokens, finish), _ = await asyncio.gather(streamed(), abuse())
    assert finish in ("length", "stop") and tokens >= 1
