"""The Responses API said as chat and back (nearshore/protocol/responses.py, response_events.py): a request's
items as chat messages, its settings as chat's, refusals by name; a chat stream recoded into the typed
events in the order the official client accumulates them, whatever way the chat bytes arrive."""

from __future__ import annotations

import json

import msgspec
import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from nearshore.protocol import sse
from nearshore.protocol.errors import UPSTREAM_UNAVAILABLE, ApiError
from nearshore.protocol.response_events import ResponseEvents, ResponseFrame, whole_response
from nearshore.protocol.responses import (
    FunctionCallItem,
    Message,
    chat_request,
    input_items,
    responses_request_decoder,
)
from nearshore.protocol.schemas import (
    ChatCompletionRequest,
    JsonSchemaResponseFormat,
    NamedToolChoice,
    Usage,
    json_encoder,
)

EVENTS = TypeAdapter(ResponseStreamEvent)


def request(**fields: object):
    return responses_request_decoder.decode(json.dumps({"model": "m", **fields}))


def chat_of(**fields: object) -> ChatCompletionRequest:
    r = request(**fields)
    return chat_request(r, [], input_items(r))


def refusal(**fields: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        chat_of(**fields)
    return caught.value


def test_text_input_and_instructions_are_a_system_and_a_user_message():
    chat = chat_of(input="Hi", instructions="Be brief.", max_output_tokens=7, temperature=0.2, top_p=0.5)
    assert [(m.role, m.content) for m in chat.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.stream) == (7, 0.2, 0.5, False)
    assert chat.stream_options is None


def test_items_become_messages_calls_and_tool_answers_in_order():
    chat = chat_of(
        input=[
            {"role": "developer", "content": "Use tools."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather "},
                    {"type": "input_text", "text": "in Lagos?"},
                ],
            },
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Lagos"}'},
            {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city":"Abuja"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "31 C"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "29 C"}],
            },
        ],
        stream=True,
    )
    roles = [m.role for m in chat.messages]
    assert roles == ["developer", "user", "assistant", "tool", "tool"]
    assert chat.messages[1].content == "Weather in Lagos?"
    assistant = chat.messages[2]
    assert assistant.content == "Checking." and [c.id for c in assistant.tool_calls] == ["c1", "c2"]
    assert [(m.tool_call_id, m.content) for m in chat.messages[3:]] == [("c1", "31 C"), ("c2", "29 C")]
    assert chat.stream and chat.stream_options.include_usage  # the usage goes in response.completed


def test_tools_choice_and_format_are_said_as_chat_says_them():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = chat_of(
        input="x",
        tools=[{"type": "function", "name": "f", "description": "d", "parameters": schema, "strict": True}],
        tool_choice={"type": "function", "name": "f"},
        text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
        parallel_tool_calls=False,
    )
    assert chat.tools[0].function.name == "f" and chat.tools[0].function.parameters == schema
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.tool_choice.function.name == "f"
    assert isinstance(chat.response_format, JsonSchemaResponseFormat)
    assert chat.response_format.json_schema.schema == schema and chat.parallel_tool_calls is False
    assert chat_of(input="x", tool_choice="required").tool_choice == "required"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": "x", "extra": 1}]}, "input[0].extra"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"foo": 1}]}, "input[0]"),
        ({"input": "x", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
        ({"input": "x", "tools": [{"type": "mcp", "server_url": "u"}]}, "tools[0].type"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
        ({"input": []}, "input"),
    ],
)
def test_what_cannot_be_served_is_refused_by_name(fields: dict, param: str):
    error = refusal(**fields)
    assert error.status == 400 and error.param == param, error.message


def test_the_request_schema_refuses_unknown_fields_and_bad_values():
    for body, param in (
        (b'{"model":"m","input":"x","nope":1}', "nope"),
        (b'{"model":"m","metadata":{"k":1}}', "metadata"),
    ):
        with pytest.raises(msgspec.ValidationError) as caught:
            responses_request_decoder.decode(body)
        assert param in str(caught.value)


# --- answers -----------------------------------------------------------------------------------------


def frame(**fields: object) -> ResponseFrame:
    return ResponseFrame(request(input="x", **fields), "m")


def test_a_unary_chat_answer_is_a_response_the_client_parses():
    answer = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me check.",
                    "tool_calls": [
                        {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 9,
            "completion_tokens": 4,
            "total_tokens": 13,
            "prompt_tokens_details": {"cached_tokens": 2},
        },
    }
    response = Response.model_validate(
        whole_response(frame(metadata={"a": "b"}), json.dumps(answer).encode())
    )
    assert response.status == "completed" and response.output_text == "Let me check."
    assert [o.type for o in response.output] == ["message", "function_call"]
    assert response.output[1].call_id == "call_9" and response.metadata == {"a": "b"}
    assert (response.usage.input_tokens, response.usage.output_tokens) == (9, 4)
    assert response.usage.input_tokens_details.cached_tokens == 2
    cut = dict(answer, choices=[{"index": 0, "message": {"content": "abc"}, "finish_reason": "length"}])
    incomplete = Response.model_validate(whole_response(frame(), json.dumps(cut).encode()))
    assert incomplete.status == "incomplete" and incomplete.incomplete_details.reason == "max_output_tokens"


def chunk(delta: dict | None = None, finish: str | None = None, **top: object) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + json.dumps({"choices": choices, **top}).encode() + b"\n\n"


def call_delta(index: int, arguments: str, name: str | None = None) -> dict:
    call: dict = {"index": index, "function": {"arguments": arguments}}
    if name:
        call.update(id=f"call_{index}", type="function")
        call["function"]["name"] = name
    return {"tool_calls": [call]}


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    sse.comment("heartbeat"),
    chunk({"content": "lo"}),
    chunk(call_delta(0, "", "f")),
    chunk(call_delta(1, '{"b":', "g")),
    chunk(call_delta(0, '{"a":1}')),  # arguments of two calls interleaved
    chunk(call_delta(1, "2}")),
    chunk({}, "tool_calls"),
    chunk(None, usage={"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}),
]


def events_of(data: bytes) -> list:
    parsed = []
    for payload in sse.parse(data):
        parsed.append(EVENTS.validate_python(json.loads(payload)))
    return parsed


@pytest.mark.parametrize("split", ["as-written", "byte-by-byte", "all-at-once"])
def test_a_chat_stream_is_recoded_into_events_the_client_accumulates(split: str):
    events = ResponseEvents(frame(stream=True))
    whole = b"".join(STREAM) + sse.DONE
    pieces = {"as-written": [*STREAM, sse.DONE], "all-at-once": [whole]}.get(split) or [
        bytes([b]) for b in whole
    ]
    out = b"".join(events.recode(p) for p in pieces)
    assert b": heartbeat\n\n" in out  # a heartbeat still reaches the client
    parsed = events_of(out)
    kinds = [e.type for e in parsed]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in parsed:
        state.handle_event(event)
    final = parsed[-1].response
    assert final.output_text == "Hello" and final.usage.total_tokens == 11
    calls = [(o.name, o.arguments) for o in final.output if o.type == "function_call"]
    assert calls == [("f", '{"a":1}'), ("g", '{"b":2}')]
    assert [o.type for o in final.output] == ["message", "function_call", "function_call"]


def test_the_billed_usage_is_concluded_before_the_end_and_the_end_carries_it():
    events = ResponseEvents(frame(stream=True))
    events.recode(b"".join(STREAM))
    kept = events.conclude(Usage.of(7, 6))  # what the edge billed, which the stored response keeps
    final = events_of(events.recode(sse.DONE))[-1].response
    assert kept["usage"]["input_tokens"] == final.usage.input_tokens == 7
    assert kept["id"] == final.id and kept["output"][0]["content"][0]["text"] == "Hello"
    assert events.recode(chunk({"content": "late"})) == b""  # nothing after the end


def test_an_error_event_fails_the_response_and_ends_the_stream():
    events = ResponseEvents(frame(stream=True))
    out = events.recode(chunk({"content": "Part"}))
    failure = ApiError(UPSTREAM_UNAVAILABLE, "The region failed mid-stream.")
    out += events.recode(sse.error(failure))
    out += events.recode(sse.DONE)
    parsed = events_of(out)
    assert [e.type for e in parsed][-2:] == ["error", "response.failed"]
    assert parsed[-2].code == "upstream_unavailable" and "mid-stream" in parsed[-2].message
    assert parsed[-1].response.status == "failed" and events.failure is not None


def test_items_round_trip_as_stored_json():
    r = request(
        input=[
            {"role": "user", "content": "a"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]
    )
    items = input_items(r)
    assert isinstance(items[0], Message) and isinstance(items[1], FunctionCallItem)
    again = msgspec.json.decode(json_encoder.encode(items), type=list[Message | FunctionCallItem])
    assert again == items
