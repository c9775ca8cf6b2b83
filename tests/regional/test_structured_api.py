"""Structured output through a regional node's API on both engines (issue 21): the official openai client's
``parse`` with twenty response models, ``json_object``, vLLM's guided fields on completions, streams, and
the bad schemas (a clear 400 each, nothing queued, the node serving on)."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest
from pydantic import BaseModel

from tests.conftest import MODEL, Node
from tests.regional.structured_models import MODELS

pytestmark = pytest.mark.slow


@pytest.fixture(params=["llama.cpp", "gpu"])
def node(request: pytest.FixtureRequest) -> Node:
    if request.param == "gpu":
        pytest.importorskip("torch")
        return request.getfixturevalue("torch_region")
    return request.getfixturevalue("region")


def client_of(node: Node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": f"{content} Answer in JSON."}]


def test_parse_returns_a_valid_object_for_twenty_schemas(node: Node):
    client = client_of(node)
    for model, question in MODELS:
        try:
            answer = client.chat.completions.parse(
                model=MODEL, messages=ask(question), response_format=model, max_tokens=200, temperature=0
            )
        except openai.LengthFinishReasonError as exc:
            pytest.fail(f"{model.__name__}: {exc.completion.choices[0].message.content!r}")
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", (model.__name__, choice.message.content)
        assert isinstance(choice.message.parsed, model), model.__name__
        model.model_validate_json(choice.message.content)  # what the client parsed is the text sent


def test_json_object_and_a_sampled_schema_stream(node: Node):
    client = client_of(node)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=ask("Describe Lagos."),
        response_format={"type": "json_object"},
        max_tokens=120,
        temperature=0,
    )
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(answer.choices[0].message.content), dict)
    else:
        assert answer.choices[0].message.content.startswith("{")
    model, question = MODELS[1]
    text, finish = "", None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=ask(question),
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": model.model_json_schema(), "strict": True},
        },
        max_tokens=120,
        temperature=0.8,
        seed=11,
        stream=True,
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "stop"
    model.model_validate_json(text)


async def test_the_grammar_build_is_reported_apart_in_server_timing(region: Node):
    """The edge leaves a request's grammar build out of what it learns of the node's speed: the node says
    how long it took, for a structured request alone."""
    plain = {"model": MODEL, "messages": ask("Describe Lagos."), "max_tokens": 2, "stream": True}
    structured = {**plain, "response_format": {"type": "json_object"}}
    timings = []
    async with aiohttp.ClientSession() as s:
        for body in (plain, structured):
            async with s.post(region.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                timings.append(r.headers["Server-Timing"])
                await r.read()
    assert "grammar;" not in timings[0] and "queue;dur=" in timings[0]
    assert float(timings[1].split("grammar;dur=")[1].split(",")[0]) >= 0, timings[1]


def test_guided_fields_on_completions(node: Node):
    client = client_of(node)
    phone = client.completions.create(
        model=MODEL,
        prompt="A phone number in Lagos:",
        max_tokens=30,
        temperature=0,
        extra_body={"guided_regex": r"\+234[0-9]{10}"},
    )
    assert phone.choices[0].finish_reason == "stop"
    assert phone.choices[0].text.startswith("+234") and len(phone.choices[0].text) == 14
    choice = client.completions.create(
        model=MODEL,
        prompt="The capital of Nigeria is",
        max_tokens=10,
        temperature=0,
        extra_body={"guided_choice": ["Lagos", "Abuja", "Kano"]},
    )
    assert choice.choices[0].text in ("Lagos", "Abuja", "Kano")
    # Taken as written (vLLM's meaning): closed here, since an open object lets the model add properties.
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    guided = client.completions.create(
        model=MODEL, prompt="Answer:", max_tokens=20, temperature=0, extra_body={"guided_json": schema}
    )
    assert isinstance(json.loads(guided.choices[0].text)["ok"], bool)


class Item(BaseModel):
    name: str


BAD_FORMATS = {
    "an invalid schema": (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
        "objekt",
    ),
    "a $ref loop": (
        {
            "type": "json_schema",
            "json_schema": {
                "name": "loop",
                "schema": {
                    "$ref": "#/$defs/a",
                    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                },
            },
        },
        "no output",
    ),
    "a dangling $ref": (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}},
        "missing",
    ),
    "an unknown type": ({"type": "xml"}, "response_format"),
    "a bad name": ({"type": "json_schema", "json_schema": {"name": "a name!", "schema": {}}}, "name"),
}


@pytest.mark.parametrize("case", BAD_FORMATS)
async def test_a_bad_response_format_is_a_400_and_the_node_serves_on(region: Node, case: str):
    response_format, named = BAD_FORMATS[case]
    body = {"model": MODEL, "messages": ask("Hi."), "max_tokens": 4, "response_format": response_format}
    async with aiohttp.ClientSession() as session:
        async with session.post(region.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 400, await r.text()
            error = (await r.json())["error"]
        assert named in error["message"] + (error.get("param") or "")
        assert error["type"] == "invalid_request_error"
        async with session.get(region.url + "/health") as r:
            health = await r.json()
        assert health["waiting"] == 0
        ok = {"model": MODEL, "messages": ask("Hi."), "max_tokens": 2}
        async with session.post(region.url + "/v1/chat/completions", json=ok) as r:
            assert r.status == 200


async def test_a_megabyte_schema_and_two_formats_at_once_are_400s(region: Node):
    huge = {
        "type": "object",
        "properties": {f"field_{i}": {"type": "string", "description": "x" * 80} for i in range(10_000)},
    }
    cases = [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "huge", "schema": huge}}},
        {"response_format": {"type": "json_object"}, "guided_regex": "[0-9]+"},
    ]
    async with aiohttp.ClientSession() as session:
        for extra in cases:
            body = {"model": MODEL, "messages": ask("Hi."), "max_tokens": 4, **extra}
            async with session.post(region.url + "/v1/chat/completions", json=body) as r:
                text = await r.text()
                assert r.status in (400, 413), text
                assert "error" in json.loads(text)
