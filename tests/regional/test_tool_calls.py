"""Tool calls without a model (issue 21): the prompt's tool format, the grammar of each tool choice walked
token by token with the real vocabulary, and the reader that turns streamed text into content and calls
whose fragments join into exactly the arguments written."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nearshore.protocol.schemas import (
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    Tool,
    ToolCall,
)
from nearshore.protocol.tool_prompt import CALL_CLOSE, CALL_OPEN, prompt_messages
from regional.grammar import GrammarError, GrammarSpec, allowed_bits, allows, check
from regional.structured import SAFE_INTEGER, answer_schema
from regional.tool_calls import CallArguments, CallStarted, ToolCallReader
from regional.tool_grammar import UnknownTool, tool_grammar

WEATHER = Tool(
    "function",
    FunctionDefinition(
        "get_weather",
        "The weather in a city.",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    ),
)
ADD = Tool(
    "function",
    FunctionDefinition(
        "add",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    ),
)
NOW = Tool("function", FunctionDefinition("now"))  # no parameters


def walk(vocabulary, model, asked, text: str):
    spec, trigger = asked
    constraint = vocabulary.constraint(check(spec), trigger)
    for token in model.tokenize(text, add_special=False):
        mask = constraint.mask()
        assert mask is None or allows(mask, token), (text, model.token_piece(token))
        constraint.advance(token)
    return constraint


def pieces(model, vocabulary, mask) -> set[bytes]:
    return {model.token_piece(int(t)) for t in np.flatnonzero(allowed_bits(mask, vocabulary.size))}


def read(text: str, chunk: int, names=frozenset({"get_weather", "add", "now"})):
    reader = ToolCallReader(names)
    events = []
    for i in range(0, len(text), chunk):
        events += reader.feed(text[i : i + chunk])
    events += reader.finish()
    return events, reader


def block(name: str, arguments: object) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


# --- the prompt ---------------------------------------------------------------------------------------


def test_tools_calls_and_answers_are_written_into_the_conversation():
    history = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Lagos and Accra?"),
        ChatMessage(
            role="assistant",
            tool_calls=[
                ToolCall("call_1", FunctionCall("get_weather", '{"city": "Lagos"}')),
                ToolCall("call_2", FunctionCall("get_weather", '{"city":"Accra"}')),
            ],
        ),
        ChatMessage(role="tool", content="31 C", tool_call_id="call_1"),
        ChatMessage(role="tool", content="29 C", tool_call_id="call_2"),
    ]
    out = prompt_messages(history, [WEATHER, ADD], "auto")
    assert [m.role for m in out] == ["system", "user", "assistant", "user"]  # the answers share one turn
    assert out[0].text().endswith("Be brief.") and '"name": "get_weather"' in out[0].text()
    assert out[2].text().count(CALL_OPEN) == 2 and '"city": "Lagos"' in out[2].text()
    assert "31 C" in out[3].text() and "29 C" in out[3].text()
    assert prompt_messages(history[:2], [WEATHER], "none") == history[:2]  # none: not offered


# --- the grammars -------------------------------------------------------------------------------------


def test_required_allows_any_tool_and_parallel_calls(vocabulary, model):
    asked = tool_grammar([WEATHER, ADD], "required", parallel=True)
    assert asked is not None and asked[1] is None
    two = block("get_weather", {"city": "Lagos"}) + "\n" + block("add", {"a": 1, "b": 2})
    assert walk(vocabulary, model, asked, two).accepting
    one = tool_grammar([WEATHER, ADD], "required", parallel=False)
    assert walk(vocabulary, model, one, block("add", {"a": 1, "b": 2})).finished


def test_a_named_choice_allows_only_that_function(vocabulary, model):
    named = tool_grammar([WEATHER, ADD], NamedToolChoice("function", NamedFunction("add")), parallel=True)
    assert walk(vocabulary, model, named, block("add", {"a": 3, "b": 4})).finished
    constraint = vocabulary.constraint(check(named[0]))
    for token in model.tokenize(f'{CALL_OPEN}\n{{"name":"', add_special=False):
        constraint.advance(token)
    allowed = pieces(model, vocabulary, constraint.mask())
    assert any(p.startswith(b"a") for p in allowed) and not any(p.startswith(b"g") for p in allowed)
    with pytest.raises(UnknownTool):
        tool_grammar([WEATHER], NamedToolChoice("function", NamedFunction("nope")), parallel=True)


def test_auto_is_free_until_a_call_opens_then_the_call_is_held(vocabulary, model):
    asked = tool_grammar([WEATHER, NOW], "auto", parallel=False)
    assert asked is not None and asked[1] == CALL_OPEN
    free = walk(vocabulary, model, asked, "It is sunny today.")
    assert free.mask() is None and not free.finished
    called = walk(vocabulary, model, asked, "Let me check.\n" + block("now", {}))
    assert called.finished
    held = walk(vocabulary, model, asked, f"{CALL_OPEN}\n")
    allowed = pieces(model, vocabulary, held.mask())
    assert allowed and all(p.startswith(b"{") for p in allowed)


def test_auto_beside_a_response_format_is_a_call_or_that_json(vocabulary, model):
    shape = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    text = GrammarSpec.json_schema({**shape, "additionalProperties": False})
    asked = tool_grammar([WEATHER, NOW], "auto", parallel=False, text=text)
    assert asked is not None and asked[1] is None  # constrained from the first token
    assert walk(vocabulary, model, asked, block("get_weather", {"city": "Lagos"})).finished
    assert walk(vocabulary, model, asked, '{"city":"Lagos"}').finished
    for free in ("It is sunny.", '{"town":"Lagos"}'):
        with pytest.raises(AssertionError):
            walk(vocabulary, model, asked, free)
    # A required or named call is a call whatever the format (it shapes a later turn's text).
    assert tool_grammar([WEATHER], "required", False, text) == tool_grammar([WEATHER], "required", False)
    with pytest.raises(ValueError, match="regex"):
        tool_grammar([WEATHER], "auto", False, GrammarSpec("regex", "[a-z]+"))


def test_none_and_no_tools_constrain_nothing():
    assert tool_grammar([WEATHER], "none", parallel=True) is None
    assert tool_grammar(None, "auto", parallel=True) is None


def test_a_tool_whose_parameters_cannot_compile_is_refused():
    bad = Tool("function", FunctionDefinition("bad", parameters={"type": "objekt"}))
    spec, _ = tool_grammar([bad], "required", parallel=True)
    with pytest.raises(GrammarError, match="objekt"):
        check(spec)


# --- answer schemas ------------------------------------------------------------------------------------


def test_an_answer_schema_closes_objects_and_bounds_numbers_where_it_says_nothing():
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number", "minimum": 0},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "list": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
        },
        "$defs": {"d": {"type": "object", "properties": {"b": {"type": "boolean"}}}},
    }
    out = answer_schema(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["n"] == {"type": "integer", "minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}
    assert out["properties"]["x"]["minimum"] == 0 and out["properties"]["x"]["multipleOf"] == 1e-9
    assert out["properties"]["open"]["additionalProperties"] is True
    assert out["properties"]["list"]["items"]["additionalProperties"] is False
    assert out["$defs"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the client's schema is left as it was
    # What it allows is what the client's schema allows (multipleOf is checked by the grammar in decimal,
    # not in binary floating point as jsonschema would).
    jsonschema.validate({"n": 3, "x": 0.5, "open": {"any": 1}, "list": [{"a": "b"}]}, schema)


# --- the reader ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
def test_streamed_calls_reassemble_exactly_whatever_the_chunking(chunk: int):
    arguments = {"city": 'Lagos "Eko" {}', "unit": "C"}
    text = block("get_weather", arguments) + "\n" + block("add", {"a": 1, "b": [2, {"c": 3}]})
    events, reader = read(text, chunk)
    started = [e for e in events if isinstance(e, CallStarted)]
    assert [(s.index, s.name) for s in started] == [(0, "get_weather"), (1, "add")]
    joined: dict[int, str] = {}
    for e in events:
        if isinstance(e, CallArguments):
            joined[e.index] = joined.get(e.index, "") + e.fragment
    assert json.loads(joined[0]) == arguments
    assert joined[1] == '{"a":1,"b":[2,{"c":3}]}'
    assert [c.arguments for c in reader.calls] == [joined[0], joined[1]]
    assert not [e for e in events if isinstance(e, str) and e.strip()]


def test_content_before_a_call_a_tag_never_finished_and_a_call_of_no_offered_tool_are_content():
    events, reader = read("Checking now. " + block("now", {}), 4)
    assert "".join(e for e in events if isinstance(e, str)) == "Checking now. "
    assert [c.name for c in reader.calls] == ["now"]
    events, reader = read("I like <tool", 2)
    assert "".join(e for e in events if isinstance(e, str)) == "I like <tool" and not reader.calls
    stranger = block("delete_everything", {})
    events, reader = read(stranger, 5)
    assert "".join(e for e in events if isinstance(e, str)) == stranger and not reader.calls


def test_a_block_in_another_order_is_read_whole_and_a_cut_call_keeps_what_came():
    reordered = f'{CALL_OPEN}\n{{"arguments": {{"a": 1, "b": 2}}, "name": "add"}}\n{CALL_CLOSE}'
    _events, reader = read(reordered, 3)
    assert [(c.name, json.loads(c.arguments)) for c in reader.calls] == [("add", {"a": 1, "b": 2})]
    _events, reader = read(f'{CALL_OPEN}\n{{"name":"add","arguments":{{"a":1,', 3)
    assert reader.calls[0].arguments == '{"a":1,'


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=12), st.booleans()), max_size=4
    ),
    st.integers(min_value=1, max_value=9),
)
def test_any_arguments_reassemble(arguments: dict, chunk: int):
    events, reader = read(block("add", arguments), chunk)
    assert json.loads(reader.calls[0].arguments) == arguments
    joined = "".join(e.fragment for e in events if isinstance(e, CallArguments))
    assert joined == reader.calls[0].arguments
