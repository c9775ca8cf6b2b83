"""What shaped an answer, as the ledger records it (``output_shape`` on the request schemas, issue 21)."""

from __future__ import annotations

import msgspec
import pytest

from nearshore.protocol.schemas import ChatCompletionRequest, CompletionRequest

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("fields", "shape"),
    [
        ({}, ""),
        ({"response_format": {"type": "text"}}, ""),
        ({"response_format": {"type": "json_object"}}, "json_object"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}},
            "json_schema",
        ),
        ({"guided_regex": "[0-9]+"}, "guided_regex"),
        ({"guided_choice": ["yes", "no"]}, "guided_choice"),
        ({"tools": TOOLS}, "tools"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tools"),
        ({"tools": TOOLS, "tool_choice": "none", "response_format": {"type": "json_object"}}, "json_object"),
    ],
)
def test_a_chat_requests_output_shape(fields: dict, shape: str):
    body = msgspec.json.decode(
        msgspec.json.encode({"model": "m", "messages": MESSAGES, **fields}), type=ChatCompletionRequest
    )
    assert body.output_shape() == shape


def test_a_completion_requests_output_shape():
    def shape(**fields) -> str:
        raw = msgspec.json.encode({"model": "m", "prompt": "hi", **fields})
        return msgspec.json.decode(raw, type=CompletionRequest).output_shape()

    assert shape() == "" and shape(guided_json={"type": "object"}) == "guided_json"
    assert shape(guided_grammar="start: /a+/") == "guided_grammar"
