"""What the tool-call tests share: two tools with bounded parameter schemas, an OpenAI client of a node, a
one-message conversation, and the check of an answer's calls against the schemas."""

from __future__ import annotations

import json

import jsonschema
import openai

from tests.conftest import Node

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
CONVERT = {
    "type": "function",
    "function": {
        "name": "convert",
        "description": "Convert an amount of money.",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
                "source": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "target": {"type": "string", "pattern": "^[A-Z]{3}$"},
            },
            "required": ["amount", "source", "target"],
        },
    },
}
TOOLS = [WEATHER, CONVERT]
# The weather tool as the Responses API writes a function tool: flat, no "function" wrapper.
WEATHER_TOOL = {"type": "function", **WEATHER["function"]}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def client_of(node: Node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def valid_calls(message, allowed: set[str], cut: bool = False) -> list[tuple[str, dict]]:
    """The calls, each checked; ``cut``: max_tokens ended the answer, so its last call may be unfinished."""
    calls = []
    for call in (message.tool_calls or [])[: -1 if cut else None]:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        calls.append((call.function.name, arguments))
    return calls
