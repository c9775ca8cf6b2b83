"""The Responses API (issue 32) through a real edge over HTTPS in front of a real region, with the official
openai client unchanged: create (unary, streamed, with a tool, with a json_schema format, continuing a
stored response), retrieve, input items, delete; each billed once as chat is; stored responses seen only by
their tenant; bad input refused by name while the edge keeps serving. And the region's own /v1/responses."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import agents
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import MODEL, Node
from tests.edge.test_region import client as https_client
from tests.edge_fixtures import Edge, edge_over_pacer, start_edge, start_hostile
from tests.tool_calls_shared import WEATHER, WEATHER_TOOL

pytestmark = pytest.mark.slow


class Capital(BaseModel):
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, region: Node) -> Iterator[Edge]:
    e = start_edge(tmp_path_factory.mktemp("edge-responses"), [("london", region.url)])
    yield e
    e.stop()


def rows_after(edge: Edge, before: int, count: int) -> list[dict]:
    return edge.ledger_rows_once(before + count)[before:]


def test_unary_and_streamed_responses_are_billed_once_as_chat_is(edge: Edge):
    c = https_client(edge, edge.new_key())
    before = len(edge.ledger_rows())
    r = c.responses.create(
        model=MODEL,
        instructions="Answer briefly.",
        input="Name a colour.",
        max_output_tokens=12,
        temperature=0,
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.instructions == "Answer briefly." and r.max_output_tokens == 12
    assert r.usage is not None and 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens

    events = list(
        c.responses.create(
            model=MODEL, input="Name a fruit.", max_output_tokens=12, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text
    assert {e.response.id for e in events if hasattr(e, "response")} == {final.id}

    rows = rows_after(edge, before, 2)
    for answer, row in zip((r, final), rows, strict=True):
        assert row["status"] == "ok" and row["model"] == MODEL and row["cost_usd"] > 0
        assert (row["prompt_tokens"], row["completion_tokens"]) == (
            answer.usage.input_tokens,
            answer.usage.output_tokens,
        )


def test_a_streamed_tool_call_and_its_output_continue_a_stored_conversation(edge: Edge):
    c = https_client(edge, edge.new_key())
    events = list(
        c.responses.create(
            model=MODEL,
            input="What is the weather in Lagos?",
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=60,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    first = events[-1].response
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["function"]["parameters"])
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == calls[0].arguments

    answer = c.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "31 C, humid"}],
        max_output_tokens=16,
        temperature=0,
    )
    assert answer.previous_response_id == first.id and answer.output_text
    listed = c.responses.input_items.list(answer.id, order="asc").data
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output"]
    assert listed[1].call_id == calls[0].call_id == listed[2].call_id
    assert listed[1].id == calls[0].id  # the call keeps the id it had in the first response's output
    again = c.responses.input_items.list(answer.id).data  # newest first, the same ids
    assert [i.id for i in reversed(again)] == [i.id for i in listed] and len({i.id for i in listed}) == 3
    # The continued turn carries the whole conversation (its tools are the request's own: none here).
    alone = c.responses.create(model=MODEL, input="31 C, humid", max_output_tokens=1)
    assert answer.usage.input_tokens > alone.usage.input_tokens + 10


def test_a_json_schema_format_parses_unary_and_streamed(edge: Edge):
    c = https_client(edge, edge.new_key())
    asked = dict(model=MODEL, input="The capital of France, as JSON.", max_output_tokens=60, temperature=0)
    parsed = c.responses.parse(text_format=Capital, **asked)
    assert isinstance(parsed.output_parsed, Capital)
    assert parsed.text.format.type == "json_schema"
    with c.responses.stream(text_format=Capital, **asked) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.status == "completed" and isinstance(final.output_parsed, Capital)


def test_tools_beside_a_json_schema_format_answer_a_call_or_that_json(edge: Edge):
    """OpenAI lets a request offer tools and shape its text (the Agents SDK sends both for an agent with
    tools and an output type): the answer is a valid call, or text in the format's schema."""
    c = https_client(edge, edge.new_key())
    schema = Capital.model_json_schema()
    answers = [
        c.responses.create(
            model=MODEL,
            input=question,
            tools=[WEATHER_TOOL],
            text={"format": {"type": "json_schema", "name": "capital", "schema": schema}},
            parallel_tool_calls=False,  # one call, then the answer ends (else more calls may follow)
            max_output_tokens=80,
            temperature=0,
        )
        for question in ("The capital of France?", "What is the weather in Lagos?")
    ]
    for answer in answers:
        assert answer.status == "completed", answer.output
        [item] = answer.output
        if item.type == "function_call":
            jsonschema.validate(json.loads(item.arguments), WEATHER["function"]["parameters"])
        else:
            Capital.model_validate_json(answer.output_text)


def test_stored_responses_are_seen_and_deleted_by_their_tenant_only(edge: Edge):
    mine = https_client(edge, edge.new_key(tenant="acme"))
    theirs = https_client(edge, edge.new_key(tenant="globex"))
    colleague = https_client(edge, edge.new_key(tenant="acme"))
    r = mine.responses.create(model=MODEL, input="Say yes.", max_output_tokens=4)
    assert colleague.responses.retrieve(r.id).output_text == r.output_text  # the tenant's, not the key's
    for ask in (
        lambda: theirs.responses.retrieve(r.id),
        lambda: theirs.responses.input_items.list(r.id),
        lambda: theirs.responses.delete(r.id),
        lambda: theirs.responses.create(
            model=MODEL, input="And?", previous_response_id=r.id, max_output_tokens=4
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            ask()
    assert mine.responses.retrieve(r.id).id == r.id  # the other tenant's delete removed nothing
    mine.responses.delete(r.id)
    for ask in (lambda: mine.responses.retrieve(r.id), lambda: mine.responses.delete(r.id)):
        with pytest.raises(openai.NotFoundError):
            ask()
    unstored = mine.responses.create(model=MODEL, input="Say no.", max_output_tokens=4, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        mine.responses.retrieve(unstored.id)


def test_a_repeated_response_is_answered_by_the_cache_as_a_response(edge: Edge):
    c = https_client(edge, edge.new_key())
    # A structured answer the grammar ended (stop) is stored; a plain one cut by max_output_tokens is not.
    schema = {"type": "json_schema", "name": "capital", "schema": Capital.model_json_schema()}
    asked = dict(model=MODEL, input="Capital of Ghana, JSON.", text={"format": schema}, max_output_tokens=60)
    first = c.responses.create(temperature=0, **asked)
    assert first.status == "completed"
    for _ in range(50):  # the entry is written just after the answer, off the request's path
        raw = c.responses.with_raw_response.create(temperature=0, **asked)
        if raw.headers["x-nearshore-cache"] == "HIT":
            break
        time.sleep(0.1)
    again = raw.parse()
    assert raw.headers["x-nearshore-cache"] == "HIT"
    assert again.output_text == first.output_text and again.id != first.id and again.status == "completed"
    streamed = list(c.responses.create(stream=True, temperature=0, **asked))
    assert streamed[-1].type == "response.completed"
    assert streamed[-1].response.output_text == first.output_text


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input[0]",
        ),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": "hi", "reasoning": {"effort": "high"}}, 400, "reasoning.effort"),
        ({"input": "hi", "background": True}, 400, "background"),
        ({"input": "hi", "frobnicate": 1}, 400, "frobnicate"),
        ({"input": [{"content": "no role"}]}, 400, "input[0]"),
        ({"input": [{"type": "function_call", "call_id": "c"}]}, 400, "input[0]"),
        ({}, 400, "input"),
        ({"input": "hi", "previous_response_id": "resp_missing"}, 404, "previous_response_id"),
        ({"input": "hi", "tool_choice": {"type": "file_search"}}, 400, "tool_choice"),
    ],
)
def test_bad_input_is_refused_by_name_and_not_billed(edge: Edge, fields: dict, status: int, param: str):
    c = https_client(edge, edge.new_key())
    before = len(edge.ledger_rows())
    with pytest.raises(openai.APIStatusError) as caught:
        c.responses.create(model=MODEL, max_output_tokens=4, extra_body=fields)
    error = caught.value.body
    assert caught.value.status_code == status and error["param"].startswith(param), error
    assert error["message"] and error["type"] == "invalid_request_error"
    assert c.responses.create(model=MODEL, input="Still there?", max_output_tokens=2).output_text
    rows = rows_after(edge, before, 1)
    assert len(rows) == 1 and rows[0]["status"] == "ok"  # only the good request was billed


def test_a_conversation_past_its_bound_is_not_continued_and_not_billed(tmp_path, region: Node):
    """Each stored turn holds the whole conversation: past [responses] max_conversation_bytes, continuing it
    is a 400 naming previous_response_id (the chain would grow every request's work and the file)."""
    edge = start_edge(tmp_path, [("london", region.url)], responses={"max_conversation_bytes": 2048})
    try:
        c = https_client(edge, edge.new_key())
        short = c.responses.create(model=MODEL, input="Say yes.", max_output_tokens=2)
        assert c.responses.create(
            model=MODEL, input="Again.", previous_response_id=short.id, max_output_tokens=2
        )
        long = c.responses.create(model=MODEL, input="Lagos " * 400, max_output_tokens=2)
        before = len(edge.ledger_rows())
        with pytest.raises(openai.BadRequestError) as caught:
            c.responses.create(model=MODEL, input="And?", previous_response_id=long.id, max_output_tokens=2)
        error = caught.value.body
        assert error["param"] == "previous_response_id" and "2048" in error["message"], error
        assert len(edge.ledger_rows()) == before  # refused before admission: no row
    finally:
        edge.stop()


def test_the_region_answers_responses_itself_and_keeps_none(region: Node):
    c = openai.OpenAI(base_url=region.url + "/v1", api_key="unused", max_retries=0)
    r = c.responses.create(model=MODEL, input="Name a river.", max_output_tokens=8, temperature=0)
    assert r.output_text and r.store is False and r.usage.output_tokens <= 8
    events = list(c.responses.create(model=MODEL, input="Name a river.", max_output_tokens=8, stream=True))
    assert events[0].type == "response.created" and events[-1].response.output_text
    with pytest.raises(openai.BadRequestError) as caught:
        c.responses.create(model=MODEL, input="And?", previous_response_id=r.id)
    assert caught.value.body["code"] == "unsupported_parameter"


def test_a_stream_its_region_cuts_ends_failed_and_is_not_stored(tmp_path):
    """One region, which cuts the stream after 5 of 40 tokens: no replica is left to continue it, so the
    client gets the text it had, an ``error`` event and ``response.failed``; nothing is stored."""
    hostile = start_hostile(tmp_path, name="cutter", tokens=40)
    edge = start_edge(tmp_path / "edge", [("cutter", hostile.url)], cache={"enabled": False})
    edge.extra.append(hostile.process)
    try:
        c = https_client(edge, edge.new_key())
        events = list(c.responses.create(model=MODEL, input="Go on.", user="mode:cut-at:5:40", stream=True))
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds.count("response.output_text.delta") == 5 and kinds[-2:] == ["error", "response.failed"]
        failed = events[-1].response
        assert failed.status == "failed" and failed.error is not None and failed.error.message
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(failed.id)
        # The same edge still answers, unary too, through the same region.
        assert c.responses.create(model=MODEL, input="Again.", user="mode:ok").output_text
        rows = edge.ledger_rows_once(2)
        assert [r["status"] for r in rows] == ["error", "ok"]
    finally:
        edge.stop()


class Report(BaseModel):
    city: str = Field(max_length=20)
    summary: str = Field(max_length=40)


async def test_the_agents_sdk_calls_a_tool_and_answers_in_shape_through_the_edge(edge: Edge):
    """A second client of the Responses API, the OpenAI Agents SDK (it streams every turn): an agent that
    calls a function tool and stops on its result; one whose output is a Pydantic model, run, continued
    with previous_response_id, and streamed."""
    agents.set_tracing_disabled(True)  # its traces would go to OpenAI's API: nowhere, offline
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"31 C and humid in {city}"

    client = openai.AsyncOpenAI(
        base_url=edge.url + "/v1",
        api_key=edge.new_key(),
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(verify=edge.ssl_context()),
    )
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
    settings = agents.ModelSettings(temperature=0, max_tokens=120)
    caller = agents.Agent(
        name="weather",
        instructions="Call the tool.",
        tools=[get_weather],
        tool_use_behavior="stop_on_first_tool",
        model=model,
        model_settings=agents.ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=60),
    )
    called = await agents.Runner.run(caller, "What is the weather in Lagos?", max_turns=3)
    assert asked and called.final_output == f"31 C and humid in {asked[0]}"
    reporter = agents.Agent(
        name="reporter",
        instructions="Report the weather.",
        output_type=Report,
        model=model,
        model_settings=settings,
    )
    first = await agents.Runner.run(reporter, "Lagos: 31 C, humid.")
    assert isinstance(first.final_output, Report)
    then = await agents.Runner.run(reporter, "And Accra?", previous_response_id=first.last_response_id)
    assert isinstance(then.final_output, Report)
    stored = await client.responses.input_items.list(then.last_response_id, order="asc")
    assert [i.role for i in stored.data] == ["user", "assistant", "user"]  # the first turn, carried over
    streamed = agents.Runner.run_streamed(reporter, "Abuja: 29 C, dry.")
    kinds = {event.type async for event in streamed.stream_events()}
    assert "raw_response_event" in kinds and isinstance(streamed.final_output, Report)


def test_a_tenant_past_its_stored_quota_loses_its_oldest_not_another_tenants(tmp_path):
    """[responses] max_tenant_bytes: the store is shared and lies beside the ledger, so a tenant that
    stores without end drops its own oldest responses, and another tenant's stay."""
    # A pacer answers any prompt, however long.
    edge = edge_over_pacer(
        tmp_path, "pacer", {"responses": {"max_tenant_bytes": 1 << 20}}, tokens=2, interval_ms=1
    )
    try:
        other = https_client(edge, edge.new_key(tenant="globex"))
        theirs = other.responses.create(model=MODEL, input="Say yes.", max_output_tokens=2)
        c = https_client(edge, edge.new_key(tenant="acme", tpm=10_000_000))
        # Each stored turn is its input and output as JSON: about 300 KB here; the quota holds three.
        ids = [
            c.responses.create(model=MODEL, input=f"{i} " + "Lagos " * 50_000, max_output_tokens=2).id
            for i in range(5)
        ]
        kept = []
        for response_id in ids:
            with contextlib.suppress(openai.NotFoundError):
                kept.append(c.responses.retrieve(response_id).id)
        assert kept == ids[-len(kept) :] and 2 <= len(kept) <= 3, kept  # the newest, in order
        assert other.responses.retrieve(theirs.id).id == theirs.id
    finally:
        edge.stop()
