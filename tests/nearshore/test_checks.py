"""The request rules no schema can say (nearshore/protocol/checks.py), on bodies decoded as the edge and the
region decode them: schemas of bounded size, stream_options only with a stream, top_logprobs only with
logprobs, max_tokens 0 only with echo, the tool rules; each refusal an OpenAI-shaped 400 naming its
``param``."""

from __future__ import annotations

import re

import msgspec
import pytest

from nearshore.protocol.checks import MAX_SCHEMA_BYTES, check_supported, check_tools
from nearshore.protocol.errors import INVALID_REQUEST, ApiError
from nearshore.protocol.schemas import chat_request_decoder, completion_request_decoder

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return chat_request_decoder.decode(msgspec.json.encode({"model": "m", "messages": MESSAGES, **fields}))


def completion(**fields):
    return completion_request_decoder.decode(msgspec.json.encode({"model": "m", "prompt": "hi", **fields}))


def refusal(body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        check_supported(body)
    return caught.value


@pytest.mark.parametrize(
    "body",
    [
        chat(),
        chat(n=1, stream=True, stream_options={"include_usage": True}),
        chat(logprobs=True, top_logprobs=5),
        chat(logprobs=True),
        chat(logprobs=False),
        completion(),
        completion(max_tokens=0, echo=True),
        completion(max_tokens=1),
        completion(logprobs=3, echo=True, max_tokens=0),
        completion(stream=True, stream_options={"include_usage": False}),
    ],
)
def test_supported_requests_pass(body):
    assert check_supported(body) is None


def test_openais_chat_labels_are_taken_within_its_bounds():
    """Fields OpenAI's chat API takes that change nothing a model writes: a client (an SDK, a framework) may
    send them, and a provider in a region's place gets them (tests/edge/test_provider.py)."""
    body = chat(
        metadata={"team": "search"},
        store=False,
        service_tier="auto",
        safety_identifier="hashed-user",
        prompt_cache_key="faq",
        modalities=["text"],
    )
    assert check_supported(body) is None and body.metadata == {"team": "search"}
    for fields, param in [
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata[...]"),
        ({"modalities": ["text", "audio"]}, "modalities[1]"),
        ({"safety_identifier": "x" * 257}, "safety_identifier"),
    ]:
        with pytest.raises(msgspec.ValidationError, match=r"\$\." + re.escape(param)):
            chat(**fields)


@pytest.mark.parametrize("make", [chat, completion])
def test_several_choices_pass_and_oversized_schemas_are_refused(make):
    assert check_supported(make(n=3)) is None
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}
    fmt = {"type": "json_schema", "json_schema": {"name": "huge", "schema": huge}}
    error = refusal(make(response_format=fmt))
    assert error.kind is INVALID_REQUEST and error.param == "response_format"
    assert f"at most {MAX_SCHEMA_BYTES}" in error.message


CALL = {"name": "a", "arguments": "{}"}


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [tool("a"), tool("a")]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "31 C"}]}, "messages.[0].tool_call_id"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "a", "arguments": "{}"}}
                        ],
                    }
                ]
            },
            "messages.[0].tool_calls",
        ),
    ],
)
def test_tool_rules_the_schema_cannot_say(extra: dict, param: str):
    with pytest.raises(ApiError) as caught:
        check_tools(chat(**extra))
    assert caught.value.kind is INVALID_REQUEST and caught.value.param == param
    assert check_tools(chat(tools=[tool("a"), tool("b")], tool_choice="required")) is None


@pytest.mark.parametrize("make", [chat, completion])
def test_stream_options_without_a_stream_is_refused(make):
    for body in (make(stream_options={"include_usage": True}), make(stream=False, stream_options={})):
        error = refusal(body)
        assert error.kind is INVALID_REQUEST and error.param == "stream_options"
        assert error.message == "stream_options is only allowed with stream=true."


@pytest.mark.parametrize("logprobs", [None, False])
def test_top_logprobs_without_logprobs_is_refused_in_chat(logprobs):
    fields = {"top_logprobs": 2} if logprobs is None else {"top_logprobs": 2, "logprobs": logprobs}
    error = refusal(chat(**fields))
    assert error.kind is INVALID_REQUEST and error.param == "top_logprobs" and error.status == 400


def test_top_logprobs_zero_still_needs_logprobs():
    assert refusal(chat(top_logprobs=0)).param == "top_logprobs"
    assert check_supported(chat(top_logprobs=0, logprobs=True)) is None


def test_max_tokens_zero_without_echo_is_refused_for_completions():
    error = refusal(completion(max_tokens=0))
    assert error.kind is INVALID_REQUEST and error.param == "max_tokens"
    assert "echo=true" in error.message
    assert refusal(completion(max_tokens=0, echo=False)).param == "max_tokens"


def test_the_first_rule_broken_is_the_one_named():
    assert refusal(chat(n=3, stream_options={}, top_logprobs=1)).param == "stream_options"
    assert refusal(completion(stream_options={}, max_tokens=0)).param == "stream_options"
