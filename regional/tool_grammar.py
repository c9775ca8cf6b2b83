"""The grammar of a tool call in the project's tool format (:mod:`nearshore.protocol.tool_prompt`), by
``tool_choice``:

- ``required``: the answer is one call of any of the tools (with ``parallel_tool_calls``, up to
  :data:`MAX_PARALLEL_CALLS` in a row);
- a named function: one call of that function;
- ``auto``: the model writes what it likes until it opens a call (:data:`CALL_OPEN`); from there the call
  is constrained (a lazily triggered grammar, :class:`regional.grammar.LazyConstraint`), so a call the
  model makes always parses;
- ``none``: no tools are offered and nothing is constrained.

Each call is ``{"name": <the function>, "arguments": <its parameters' schema, as an answer's shape>}`` (the
name first, so a stream can name the call before its arguments arrive), so the arguments always parse and
validate against the function's schema.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nearshore.protocol.schemas import NamedToolChoice, Tool, ToolChoice
from nearshore.protocol.tool_prompt import CALL_CLOSE, CALL_OPEN
from regional.grammar import GrammarSpec
from regional.structured import answer_schema

NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
# The most calls in one answer with parallel_tool_calls: unbounded, a small model at a high temperature can
# call and call until max_tokens; bounded, after the last it can only end.
MAX_PARALLEL_CALLS = 8


class UnknownTool(ValueError):
    """A named tool choice names no tool of the request."""


def call_schema(tool: Tool) -> dict[str, Any]:
    parameters = tool.function.parameters if tool.function.parameters is not None else NO_ARGUMENTS
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": answer_schema(parameters)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _calls_schema(tools: Sequence[Tool]) -> dict[str, Any]:
    schema = call_schema(tools[0]) if len(tools) == 1 else {"anyOf": [call_schema(t) for t in tools]}
    return {**schema, "x-guidance": {"whitespace_flexible": False}}


def _lark(tools: Sequence[Tool], parallel: bool, opened: bool) -> str:
    """Calls as a Lark grammar; ``opened``: the first call's opening tag is already written (``auto``)."""
    close = json.dumps("\n" + CALL_CLOSE)
    first = json.dumps("\n" if opened else CALL_OPEN + "\n")
    start = f"start: {first} args {close}"
    if parallel:
        again = json.dumps("\n" + CALL_OPEN + "\n")
        start += f" ({again} args {close})~0..{MAX_PARALLEL_CALLS - 1}"
    return f"{start}\nargs: %json {json.dumps(_calls_schema(tools))}"


def _calls_or_text(tools: Sequence[Tool], parallel: bool, text: GrammarSpec) -> str:
    """Calls (as ``required`` writes them), or the answer's JSON (an object, or the format's schema)."""
    if text.kind not in ("json_schema", "json_object"):
        raise ValueError(f"a {text.kind} format cannot be combined with tools")
    shape = json.loads(text.source) if text.kind == "json_schema" else {"type": "object"}
    if isinstance(shape, dict):
        shape = {**shape, "x-guidance": {"whitespace_flexible": False}}
    calls = _lark(tools, parallel, opened=False).replace("start:", "calls:", 1)
    return f"start: calls | text\ntext: %json {json.dumps(shape)}\n{calls}"


def tool_grammar(
    tools: Sequence[Tool] | None, choice: ToolChoice | None, parallel: bool, text: GrammarSpec | None = None
) -> tuple[GrammarSpec, str | None] | None:
    """The grammar a request's tool choice asks for and its trigger (the text after which it applies; None:
    from the first token), or None when nothing is constrained. ``text``: the JSON the answer's text must
    be (response_format); with ``auto`` the answer is then calls or that JSON, constrained from its first
    token; a required or named call is a call whatever the format (it shapes a later turn's text)."""
    if not tools or choice == "none":
        return None
    if text is not None and choice in (None, "auto"):
        return GrammarSpec("lark", _calls_or_text(tools, parallel, text)), None
    if isinstance(choice, NamedToolChoice):
        named = [t for t in tools if t.function.name == choice.function.name]
        if not named:
            name = choice.function.name
            raise UnknownTool(f"tool_choice names the function {name!r}, which is not in tools")
        return GrammarSpec("lark", _lark(named, False, opened=False)), None
    if choice == "required":
        return GrammarSpec("lark", _lark(tools, parallel, opened=False)), None
    return GrammarSpec("lark", _lark(tools, parallel, opened=True)), CALL_OPEN  # auto
