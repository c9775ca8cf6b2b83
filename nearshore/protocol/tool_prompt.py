"""Tools in the conversation, for a model family whose chat template has no tool format of its own (neither
the embedded Gemma's turn format nor SmolLM2's ChatML template has one): the project's tool format, written
out as plain messages before the template renders them, whichever template that is (the Hermes style that
ChatML models such as Qwen2.5 are trained on: a Gemma turn or a ChatML ``<|im_start|>`` turn holds it alike).

- The tools are described at the top of the system text: what a call looks like, then one line of JSON
  per function (name, description, parameters).
- A call the model makes is ``<tool_call>`` + ``{"name": ..., "arguments": {...}}`` + ``</tool_call>``, one
  block per call (:data:`CALL_OPEN`, :data:`CALL_CLOSE`); an assistant message's ``tool_calls`` in the
  history are written back in that form, so the model sees its own calls as it made them.
- A tool's answer (``role: "tool"``) is a user turn ``<tool_response>`` + its content + ``</tool_response>``;
  answers in a row share one turn (Gemma's turns must alternate; ChatML's need not, and lose nothing).

Shared by the region (which renders and tokenizes the prompt) and the edge (which counts its tokens: tool
definitions are prompt tokens).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import msgspec

from nearshore.protocol.schemas import ChatMessage, Tool, ToolCall, ToolChoice

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"


def tools_offered(tools: Sequence[Tool] | None, choice: ToolChoice | None) -> bool:
    """Whether the model is told about the tools: it is unless there are none or the choice is "none"."""
    return bool(tools) and choice != "none"


def preamble(tools: Sequence[Tool], parallel: bool) -> str:
    lines = [
        "You can call functions. To call one, answer with only this, nothing before or after it:",
        f'{CALL_OPEN}\n{{"name": "<function name>", "arguments": {{<its arguments as JSON>}}}}\n{CALL_CLOSE}',
        "Several calls are several such blocks, one after another."
        if parallel
        else "Call at most one function at a time.",
        f"A function's result comes back as {RESPONSE_OPEN}...{RESPONSE_CLOSE}. The functions:",
    ]
    for tool in tools:
        f = tool.function
        entry: dict[str, object] = {"name": f.name}
        if f.description:
            entry["description"] = f.description
        entry["parameters"] = (
            f.parameters if f.parameters is not None else {"type": "object", "properties": {}}
        )
        lines.append(json.dumps(entry, ensure_ascii=False))
    return "\n".join(lines)


def call_text(call: ToolCall) -> str:
    """One call as the model writes it."""
    try:
        arguments = json.loads(call.function.arguments) if call.function.arguments.strip() else {}
    except ValueError:
        arguments = call.function.arguments  # as the client sent it: the model sees what it was told
    body = json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def prompt_messages(
    messages: Sequence[ChatMessage],
    tools: Sequence[Tool] | None = None,
    choice: ToolChoice | None = None,
    parallel: bool = True,
) -> list[ChatMessage]:
    """``messages`` as the chat template reads them: the tool format written out (see the module's
    docstring); without tools and tool messages, the messages themselves."""
    has_tool_parts = any(m.role == "tool" or m.tool_calls for m in messages)
    offered = tools_offered(tools, choice)
    if not offered and not has_tool_parts:
        return list(messages)
    out: list[ChatMessage] = []
    for m in messages:
        if m.role == "tool":
            answer = f"{RESPONSE_OPEN}\n{m.text()}\n{RESPONSE_CLOSE}"
            if out and out[-1].role == "user":  # answers in a row (or after the user's turn) share it
                out[-1] = msgspec.structs.replace(out[-1], content=f"{out[-1].text()}\n{answer}")
            else:
                out.append(ChatMessage(role="user", content=answer))
        elif m.role == "assistant" and m.tool_calls:
            calls = "\n".join(call_text(call) for call in m.tool_calls)
            text = f"{m.text()}\n{calls}" if m.text() else calls
            out.append(ChatMessage(role="assistant", content=text, name=m.name))
        else:
            out.append(m)
    if offered:
        assert tools is not None
        intro = preamble(tools, parallel)
        if out and out[0].role in ("system", "developer"):
            out[0] = msgspec.structs.replace(out[0], content=f"{intro}\n\n{out[0].text()}")
        else:
            out.insert(0, ChatMessage(role="system", content=intro))
    return out
