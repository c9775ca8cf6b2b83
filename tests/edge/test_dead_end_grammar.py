"""A grammar the model cannot follow is the client's 400, never the region's 500 (issue 34, N9): a schema
no value meets, one that cannot be compiled, or one whose every value runs on forever (a required ``$ref``
back into itself) is refused by the region before a sequence is queued, naming the field; the edge passes the
400 on without retrying it, the replica is never counted as failing, and the region logs no traceback. A
grammar that dead-ends only after some tokens is that request's error too: a 400 for an answer not yet sent,
an ``invalid_request_error`` event for a stream under way.

A real edge in front of a real llama.cpp node."""

from __future__ import annotations

import json
from collections.abc import Iterator

import aiohttp
import openai
import pytest

from tests.conftest import MODEL, Node, start_region
from tests.edge.test_region import client
from tests.edge_fixtures import Edge, start_edge

pytestmark = pytest.mark.slow

ENGINE = {"max_sequences": 2, "max_waiting": 4, "kv_cache_tokens": 2048, "context_window": 512}
MESSAGES = [{"role": "user", "content": "Describe Lagos as JSON."}]
# Every value of it opens an object that must hold another: the output is forced and never ends.
ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
ENDLESS_LIST = {"type": "array", "items": {"$ref": "#"}, "minItems": 1}
CHAIN = {"type": "object", "properties": {"next": {"$ref": "#/$defs/link"}}, "required": ["next"]}
# A free choice first (true or false), then the endless chain: it dead-ends after a few tokens.
LATE = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "then": {"$ref": "#/$defs/link"}},
    "required": ["ok", "then"],
    "$defs": {"link": CHAIN},
}
DEAD_ENDS = [
    ("guided_json", ENDLESS),
    ("guided_json", ENDLESS_LIST),
    ("response_format", {"$ref": "#/$defs/link", "$defs": {"link": CHAIN}}),
    ("tools", ENDLESS),
    ("guided_json", {"type": "string", "enum": []}),
    ("guided_json", {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1}),
    ("response_format", {"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}}),
    ("guided_regex", "[^\\s\\S]"),
]


def asked(param: str, grammar: object) -> dict:
    """The body's part that asks for ``grammar`` through ``param``."""
    if param == "response_format":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": grammar}}}
    if param == "tools":
        tool = {"type": "function", "function": {"name": "f", "parameters": grammar}}
        return {"tools": [tool], "tool_choice": "required"}
    return {param: grammar}


@pytest.fixture(scope="module")
def node_and_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Edge]]:
    node = start_region(
        tmp_path_factory.mktemp("grammar-region"), engine=ENGINE, embeddings={"enabled": False}
    )
    try:
        edge = start_edge(
            tmp_path_factory.mktemp("grammar-edge"),
            [("london", node.url)],
            cache={"enabled": False},
            upstream={"ttft_timeout_s": 120.0},  # a node on a busy CPU may be slow, never wrong
        )
    except Exception:
        node.process.stop()
        raise
    yield node, edge
    edge.stop()
    node.process.stop()


def ask(c: openai.OpenAI, max_tokens: int = 2, **extra: object):
    return c.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=max_tokens, temperature=0, extra_body=extra or None
    )


def region_log(node: Node) -> str:
    return node.process.log_path.read_text(errors="replace")


def failovers(edge: Edge) -> list[str]:
    import urllib.request

    with urllib.request.urlopen(edge.metrics_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith("nearshore_edge:upstream_failovers_total") and not line.endswith(" 0.0")
    ]


def test_dead_end_grammars_are_400s_naming_the_field_and_bench_no_one(node_and_edge):
    node, edge = node_and_edge
    c = client(edge, edge.new_key())
    for param, grammar in DEAD_ENDS:
        with pytest.raises(openai.BadRequestError) as raised:
            ask(c, **asked(param, grammar))
        error = raised.value.response.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param), error
        assert raised.value.response.headers["x-nearshore-region"] == "london"
    # The unary answer that dead-ends after a few tokens was not sent yet: a 400 as well.
    with pytest.raises(openai.BadRequestError) as raised:
        ask(c, max_tokens=24, guided_json=LATE)
    error = raised.value.response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "guided_json"), error
    assert not failovers(edge)  # nothing was retried elsewhere or counted against the replica
    for _ in range(4):  # more than the failures in a row that would eject the one replica
        assert ask(c).choices[0].message.content is not None
    assert ask(c, guided_json={"type": "object", "properties": {"city": {"type": "string"}}}).choices
    assert "Traceback" not in region_log(node)


async def test_a_stream_whose_grammar_dead_ends_ends_with_the_requests_error(node_and_edge):
    node, edge = node_and_edge
    key = edge.new_key()
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
        "guided_json": LATE,
    }
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(edge.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        assert r.status == 200  # its first tokens went out before the grammar dead-ended
        events = [e[6:] for e in (await r.read()).split(b"\n\n") if e.startswith(b"data: ")]
    errors = [json.loads(e)["error"] for e in events if e != b"[DONE]" and b'"error"' in e]
    assert len(errors) == 1, events
    assert (errors[0]["type"], errors[0]["param"]) == ("invalid_request_error", "guided_json"), errors
    assert not failovers(edge)
    c = client(edge, key)
    assert ask(c).choices[0].message.content is not None
    assert "Traceback" not in region_log(node)
