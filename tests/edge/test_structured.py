"""Structured output, tool calls and several choices through an edge (issue 21): the official openai client
over HTTPS, unchanged; each answer billed once in the ledger; a structured answer cached only whole and
valid, a tool or multi-choice answer never; tool definitions counted as prompt tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import openai
import pytest

from tests.conftest import MODEL, Node
from tests.edge.test_region import client as https_client
from tests.edge_fixtures import Edge, start_edge
from tests.regional.structured_models import MODELS
from tests.tool_calls_shared import SCHEMAS, TOOLS, valid_calls

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, region: Node) -> Iterator[Edge]:
    e = start_edge(tmp_path_factory.mktemp("edge-structured"), [("london", region.url)])
    yield e
    e.stop()


def client(edge: Edge) -> openai.OpenAI:
    return https_client(edge, edge.new_key())


def cache_header(c: openai.OpenAI, **asked) -> str:
    raw = c.chat.completions.with_raw_response.create(**asked)
    return raw.headers.get("x-nearshore-cache", "")


def rows_for(edge: Edge, count: int) -> list[dict]:
    return edge.ledger_rows_once(count, timeout_s=5.0)


def test_parse_through_the_edge_and_a_structured_answer_is_cached_whole(edge: Edge):
    c = client(edge)
    for model, question in MODELS[:5]:
        answer = c.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": f"{question} Answer in JSON."}],
            response_format=model,
            max_tokens=200,
            temperature=0,
        )
        assert isinstance(answer.choices[0].message.parsed, model)
    assert {r["output"] for r in rows_for(edge, 5)[-5:]} == {"json_schema"}  # parse() sends a json_schema
    model, question = MODELS[0]
    asked = dict(
        model=MODEL,
        messages=[{"role": "user", "content": f"{question} Answer in JSON, once more."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": model.model_json_schema()},
        },
        max_tokens=200,
        temperature=0,
    )
    assert cache_header(c, **asked) == "MISS"
    time.sleep(0.3)  # the store is written after the answer
    assert cache_header(c, **asked) == "HIT"
    # Cut short inside the JSON: not stored, so the next ask goes to the region again.
    cut = {**asked, "messages": [{"role": "user", "content": "Another city, in JSON."}], "max_tokens": 3}
    assert cache_header(c, **cut) == "MISS"
    time.sleep(0.3)
    assert cache_header(c, **cut) == "MISS"


def test_tool_calls_stream_through_the_edge_are_billed_and_never_cached(edge: Edge):
    c = client(edge)
    before = len(edge.ledger_rows())
    asked = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Lagos?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=120,
        temperature=0,
    )
    whole = c.chat.completions.create(**asked)
    assert whole.choices[0].finish_reason == "tool_calls"
    valid_calls(whole.choices[0].message, {"get_weather"})
    arguments, name, finish = "", None, None
    for chunk in c.chat.completions.create(**asked, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                name = delta.function.name or name
                arguments += delta.function.arguments or ""
    assert finish == "tool_calls" and name == "get_weather"
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments
    json.loads(arguments)
    assert cache_header(c, **asked) == ""  # a request that offers tools is not looked up, nor stored
    rows = rows_for(edge, before + 3)
    assert len(rows) == before + 3  # each request billed once
    assert [(r["output"], r["choices"]) for r in rows[before:]] == [("tools", 1)] * 3  # what shaped them
    plain = c.chat.completions.create(model=MODEL, messages=asked["messages"], max_tokens=1)
    assert whole.usage.prompt_tokens > plain.usage.prompt_tokens + 40  # the tools are prompt tokens
    assert set(SCHEMAS) == {"get_weather", "convert"}


def test_three_choices_through_the_edge(edge: Edge):
    c = client(edge)
    before = len(edge.ledger_rows())
    asked = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a fruit."}],
        max_tokens=6,
        n=3,
        temperature=1.0,
        seed=3,
    )
    answer = c.chat.completions.create(**asked)
    assert [ch.index for ch in answer.choices] == [0, 1, 2]
    streamed: dict[int, str] = {}
    for chunk in c.chat.completions.create(**asked, stream=True):
        for ch in chunk.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + (ch.delta.content or "")
    assert sorted(streamed) == [0, 1, 2]
    billed = rows_for(edge, before + 2)[before:]
    assert [(r["choices"], r["output"]) for r in billed] == [(3, ""), (3, "")]
    assert billed[0]["completion_tokens"] == answer.usage.completion_tokens  # every choice's tokens
