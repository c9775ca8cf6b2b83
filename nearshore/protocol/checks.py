"""Rules on a request that its schema cannot say, checked alike by the edge and the region."""

from __future__ import annotations

from nearshore.protocol.errors import INVALID_REQUEST, ApiError
from nearshore.protocol.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonSchemaResponseFormat,
    json_encoder,
)


def check_tools(body: ChatCompletionRequest) -> None:
    """The tool rules its schema cannot say: distinct function names, a choice only with tools, tool
    answers that say which call they answer."""
    names = [t.function.name for t in body.tools or ()]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise ApiError(
            INVALID_REQUEST, f"Two tools are named {duplicate!r}: names must differ.", param="tools"
        )
    if body.tool_choice is not None and not body.tools:
        raise ApiError(
            INVALID_REQUEST, "tool_choice is only allowed when tools are specified.", param="tool_choice"
        )
    for i, m in enumerate(body.messages):
        if m.role == "tool" and not m.tool_call_id:
            raise ApiError(
                INVALID_REQUEST,
                "A message with role 'tool' needs the tool_call_id of the call it answers.",
                param=f"messages.[{i}].tool_call_id",
            )
        if m.tool_calls and m.role != "assistant":
            raise ApiError(
                INVALID_REQUEST,
                "Only assistant messages carry tool_calls.",
                param=f"messages.[{i}].tool_calls",
            )


# The most JSON a request's schemas may take, response_format's and the tools' parameters together: they
# are compiled for every request that sends them, so their size is work the node does before anything runs.
MAX_SCHEMA_BYTES = 64 * 1024


def check_schema_sizes(body: ChatCompletionRequest | CompletionRequest) -> None:
    schemas: list[object] = []
    fmt = body.response_format
    if isinstance(fmt, JsonSchemaResponseFormat) and fmt.json_schema.schema is not None:
        schemas.append(fmt.json_schema.schema)
    if body.guided_json is not None:
        schemas.append(body.guided_json)
    if isinstance(body, ChatCompletionRequest):
        schemas += [t.function.parameters for t in body.tools or () if t.function.parameters is not None]
    size = sum(len(json_encoder.encode(s)) for s in schemas)
    if size > MAX_SCHEMA_BYTES:
        param = "tools" if isinstance(body, ChatCompletionRequest) and body.tools else "response_format"
        raise ApiError(
            INVALID_REQUEST,
            f"The request's JSON schemas take {size} bytes; at most {MAX_SCHEMA_BYTES} are accepted.",
            param=param,
        )


def check_supported(body: ChatCompletionRequest | CompletionRequest) -> None:
    """Raise the OpenAI-shaped 400 for what no Nearshore server does: usage off-stream; and for fields
    that only mean something with another: top_logprobs without logprobs, max_tokens 0 without echo."""
    check_schema_sizes(body)
    if isinstance(body, ChatCompletionRequest):
        check_tools(body)
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            INVALID_REQUEST, "stream_options is only allowed with stream=true.", param="stream_options"
        )
    if isinstance(body, ChatCompletionRequest) and body.top_logprobs is not None and not body.logprobs:
        raise ApiError(
            INVALID_REQUEST, "top_logprobs is only allowed with logprobs=true.", param="top_logprobs"
        )
    if isinstance(body, CompletionRequest) and body.max_tokens == 0 and not body.echo:
        raise ApiError(
            INVALID_REQUEST,
            "max_tokens=0 is only allowed with echo=true (it scores the prompt and generates nothing).",
            param="max_tokens",
        )
