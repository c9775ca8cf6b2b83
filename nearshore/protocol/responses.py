"""The Responses API's request (``POST /v1/responses``), read and said again as a chat completion request.

Edges and regions serve ``/v1/responses`` over their chat path: the request's ``instructions``, its
``input`` (text, or items: messages, function calls and their outputs) after a stored conversation's items,
its function tools, ``tool_choice``, ``text.format`` and ``max_output_tokens`` become one
:class:`~nearshore.protocol.schemas.ChatCompletionRequest`; the answer goes back the other way
(:mod:`nearshore.protocol.response_events`). Input items are normalised to one typed shape
(:data:`Item`) before anything else reads them: that shape is what a stored response keeps and what
``input_items`` lists. What the served models cannot do (images, files, built-in tools, reasoning effort,
background runs) is a 400 that names the field, never silently dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from nearshore.protocol.errors import INVALID_REQUEST, UNSUPPORTED_PARAMETER, ApiError, split_error_path
from nearshore.protocol.schemas import (
    MAX_MESSAGES,
    MAX_TOOLS,
    ChatCompletionRequest,
    ChatMessage,
    EndUser,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaResponseFormat,
    MaxTokens,
    Metadata,
    ModelName,
    NamedFunction,
    NamedToolChoice,
    PromptCacheKey,
    ResponseFormat,
    ServiceTier,
    StreamOptions,
    Temperature,
    TextFormat,
    Tool,
    ToolCall,
    ToolChoice,
    TopP,
)

T = TypeVar("T")

ResponseId = Annotated[str, Meta(min_length=1, max_length=128)]


# --- the request -----------------------------------------------------------------------------------------


class TextFormatSpec(Struct, forbid_unknown_fields=True, kw_only=True):
    """``text.format``: "text", "json_object", or "json_schema" with its name and schema (flat, unlike
    chat's ``response_format.json_schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    name: FunctionName | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextOptions(Struct, forbid_unknown_fields=True, kw_only=True):
    format: TextFormatSpec | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesStreamOptions(Struct, forbid_unknown_fields=True, kw_only=True):
    include_obfuscation: bool | None = None  # OpenAI pads deltas against length side channels; none here


class Reasoning(Struct, forbid_unknown_fields=True, kw_only=True):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    model: ModelName
    input: str | Annotated[list[dict[str, Any]], Meta(max_length=MAX_MESSAGES)] | None = None
    instructions: str | None = None
    tools: Annotated[list[dict[str, Any]], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool = True  # OpenAI's default: a response is kept unless the client says not to
    previous_response_id: ResponseId | None = None
    metadata: Metadata | None = None
    user: EndUser | None = None
    safety_identifier: EndUser | None = None
    prompt_cache_key: PromptCacheKey | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: Annotated[list[str], Meta(max_length=16)] | None = None
    background: bool | None = None
    service_tier: ServiceTier | None = None
    reasoning: Reasoning | None = None

    def check_supported(self) -> None:
        """What the served models cannot do, refused by name."""
        if self.background:
            raise _unsupported(
                "background", "responses run while the request is open; none run in the background"
            )
        if self.reasoning is not None and self.reasoning.effort not in (None, "none", "minimal"):
            raise _unsupported("reasoning.effort", "the served models do not reason before they answer")
        for name in self.include or ():
            raise _unsupported("include", f"nothing extra can be included ({name!r})")


responses_request_decoder = msgspec.json.Decoder(ResponsesRequest)


# --- input items, normalised ----------------------------------------------------------------------------


class InputText(Struct, tag="input_text", tag_field="type", forbid_unknown_fields=True):
    text: str


class OutputText(Struct, tag="output_text", tag_field="type", forbid_unknown_fields=True):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class Refusal(Struct, tag="refusal", tag_field="type", forbid_unknown_fields=True):
    refusal: str


Part = InputText | OutputText | Refusal
_TEXT_PARTS = ("input_text", "output_text", "refusal")


class Message(Struct, tag="message", tag_field="type", forbid_unknown_fields=True, kw_only=True):
    role: Literal["user", "system", "developer", "assistant"]
    content: list[Part]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return "".join(p.refusal if isinstance(p, Refusal) else p.text for p in self.content)


class FunctionCallItem(
    Struct, tag="function_call", tag_field="type", forbid_unknown_fields=True, kw_only=True
):
    call_id: Annotated[str, Meta(min_length=1)]
    name: FunctionName
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(
    Struct, tag="function_call_output", tag_field="type", forbid_unknown_fields=True, kw_only=True
):
    call_id: Annotated[str, Meta(min_length=1)]
    output: str
    id: str | None = None
    status: str | None = None


Item = Message | FunctionCallItem | FunctionCallOutput
items_decoder = msgspec.json.Decoder(list[Item])


def input_items(request: ResponsesRequest) -> list[Item]:
    """The request's ``input`` as items: a string is one user message; a message without ``type`` is a
    message; its content as a string is one text part. Reasoning items (another model's thoughts) are
    dropped: nothing here reads them."""
    if request.input is None:
        return []
    if isinstance(request.input, str):
        return [Message(role="user", content=[InputText(request.input)])]
    items: list[Item] = []
    for i, raw in enumerate(request.input):
        param = f"input[{i}]"
        kind = raw.get("type", "message" if "role" in raw else None)
        if kind == "reasoning":
            continue
        if kind == "message":
            items.append(_message(raw, param))
        elif kind == "function_call":
            items.append(_convert(raw, FunctionCallItem, param))
        elif kind == "function_call_output":
            output = raw.get("output")
            if isinstance(output, list):  # text parts: their text, joined
                raw = {**raw, "output": "".join(_parts(output, f"{param}.output"))}
            items.append(_convert(raw, FunctionCallOutput, param))
        elif kind is None:
            raise ApiError(INVALID_REQUEST, f"{param}: an input item needs a type or a role.", param=param)
        else:
            raise _unsupported(f"{param}.type", f"input items of type {kind!r} are not served here")
    return items


def _message(raw: dict[str, Any], param: str) -> Message:
    content = raw.get("content")
    if isinstance(content, str):
        part = "output_text" if raw.get("role") == "assistant" else "input_text"
        raw = {**raw, "content": [{"type": part, "text": content}]}
    elif isinstance(content, list):
        for j, piece in enumerate(content):
            kind = piece.get("type") if isinstance(piece, dict) else None
            if kind not in _TEXT_PARTS:
                where = f"{param}.content[{j}]"
                raise _unsupported(
                    f"{where}.type", f"content of type {kind!r} is not served: the models read text"
                )
    return _convert({**raw, "type": "message"}, Message, param)


def _parts(parts: list[Any], param: str) -> list[str]:
    texts = []
    for j, piece in enumerate(parts):
        if not isinstance(piece, dict) or piece.get("type") not in _TEXT_PARTS:
            raise _unsupported(f"{param}[{j}]", "only text parts are served")
        texts.append(str(piece.get("text") or piece.get("refusal") or ""))
    return texts


def _convert(raw: object, kind: type[T], param: str) -> T:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        text, path = split_error_path(str(exc))
        where = f"{param}.{path}" if path else param
        if text.startswith("Object contains unknown field") and "`" in text:
            where = f"{where}.{text.split('`')[1]}"
            raise ApiError(
                INVALID_REQUEST, f"Unrecognized request argument supplied: {where}", param=where
            ) from None
        raise ApiError(INVALID_REQUEST, f"Invalid request: {text} ({where})", param=where) from None


def _unsupported(param: str, why: str) -> ApiError:
    return ApiError(UNSUPPORTED_PARAMETER, f"{param} is not supported: {why}.", param=param)


# --- said as a chat completion request ---------------------------------------------------------------------


def chat_messages(instructions: str | None, items: list[Item]) -> list[ChatMessage]:
    """The conversation as chat messages: the instructions as the system message first; a run of function
    calls as one assistant message's tool calls (with the assistant's text before them, if any); each
    call's output as a tool message."""
    messages = [ChatMessage("system", instructions)] if instructions else []
    for item in items:
        if isinstance(item, Message):
            messages.append(ChatMessage(item.role, item.text()))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(item.call_id, FunctionCall(item.name, item.arguments))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                # "" rather than null: some servers (llama-cpp-python's) refuse a call without content
                messages.append(ChatMessage("assistant", "", tool_calls=[call]))
        else:
            messages.append(ChatMessage("tool", item.output, tool_call_id=item.call_id))
    return messages


def chat_request(request: ResponsesRequest, earlier: list[Item], items: list[Item]) -> ChatCompletionRequest:
    """The chat completion request that answers ``request``: ``earlier`` is the stored conversation it
    continues (``previous_response_id``), ``items`` its own input. A streamed one asks for the usage chunk:
    the final ``response.completed`` carries the usage."""
    request.check_supported()
    messages = chat_messages(request.instructions, [*earlier, *items])
    if not messages:
        raise ApiError(INVALID_REQUEST, "input: a response needs some input.", param="input")
    if len(messages) > MAX_MESSAGES:
        raise ApiError(
            INVALID_REQUEST, f"input: the conversation has more than {MAX_MESSAGES} messages.", param="input"
        )
    return ChatCompletionRequest(
        model=request.model,
        messages=messages,
        max_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        stream=request.stream,
        stream_options=StreamOptions(include_usage=True) if request.stream else None,
        user=request.user or request.safety_identifier,
        response_format=_response_format(request.text),
        tools=[_tool(t, f"tools[{i}]") for i, t in enumerate(request.tools)] if request.tools else None,
        tool_choice=_tool_choice(request.tool_choice),
        parallel_tool_calls=request.parallel_tool_calls,
    )


def _response_format(text: TextOptions | None) -> ResponseFormat | None:
    spec = text.format if text is not None else None
    if spec is None or spec.type == "text":
        return None if spec is None else TextFormat()
    if spec.type == "json_object":
        return JsonObjectFormat()
    if spec.name is None:
        raise ApiError(
            INVALID_REQUEST, "text.format.name: a json_schema format needs a name.", param="text.format.name"
        )
    return JsonSchemaResponseFormat(JsonSchemaFormat(spec.name, spec.schema, spec.description, spec.strict))


class _FunctionTool(Struct, forbid_unknown_fields=True, kw_only=True):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


def _tool(raw: dict[str, Any], param: str) -> Tool:
    if raw.get("type") != "function":
        raise _unsupported(f"{param}.type", f"only function tools are served, not {raw.get('type')!r}")
    tool = _convert(raw, _FunctionTool, param)
    return Tool("function", FunctionDefinition(tool.name, tool.description, tool.parameters, tool.strict))


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    if choice is None or choice in ("none", "auto", "required"):
        return choice  # type: ignore[return-value]
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return NamedToolChoice("function", NamedFunction(choice["name"]))
    raise _unsupported("tool_choice", "it is none, auto, required, or a function by name")
