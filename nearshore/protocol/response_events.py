"""A chat completion's answer said as the Responses API's: the ``response`` object of a unary answer, and
the typed events of a stream, recoded from chat's SSE chunks as they pass.

The stream's events are those the official client parses, in its order: ``response.created`` and
``response.in_progress`` before anything else; per output item ``response.output_item.added``, its parts
(``response.content_part.added``, ``response.output_text.delta``... ``response.output_text.done``,
``response.content_part.done``; or a function call's ``response.function_call_arguments.delta``...
``.done``) and ``response.output_item.done``; then ``response.completed`` (or ``response.incomplete`` when
``max_output_tokens`` cut it) with the whole response and its usage. A chat error event becomes an
``error`` event and ``response.failed``. SSE comments (heartbeats) pass through unchanged.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import msgspec

from nearshore.protocol import sse
from nearshore.protocol.responses import ResponsesRequest
from nearshore.protocol.schemas import Usage, json_encoder


def new_id(prefix: str) -> str:
    """An id no one can guess (a stored response is fetched by it)."""
    return f"{prefix}_{secrets.token_hex(16)}"


class ResponseFrame:
    """What every object of one response carries: its id, creation time and model, and the request's
    settings said back as OpenAI says them (its defaults where the request named none)."""

    def __init__(
        self, request: ResponsesRequest, model: str, *, response_id: str = "", store: bool | None = None
    ):
        self.id = response_id or new_id("resp")
        self.created_at = int(time.time())
        self.model = model
        self.request = request
        self.store = request.store if store is None else store

    def object(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        incomplete: str | None = None,
    ) -> dict[str, Any]:
        r = self.request
        text_format = msgspec.to_builtins(r.text.format) if r.text and r.text.format else {"type": "text"}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "metadata": r.metadata or {},
            "model": self.model,
            "output": output,
            "parallel_tool_calls": r.parallel_tool_calls if r.parallel_tool_calls is not None else True,
            "previous_response_id": r.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": self.store,
            "temperature": r.temperature if r.temperature is not None else 1.0,
            "text": {"format": text_format},
            "tool_choice": r.tool_choice if r.tool_choice is not None else "auto",
            "tools": [{"strict": None, "description": None, "parameters": None, **t} for t in r.tools or ()],
            "top_p": r.top_p if r.top_p is not None else 1.0,
            "truncation": r.truncation or "disabled",
            "usage": usage,
            "user": r.user,
        }


def usage_of(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.prompt_tokens_details.cached_tokens,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [part]}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def _ending(finish_reason: str) -> tuple[str, str | None]:
    """A response's status and why it is incomplete, from chat's finish reason."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if finish_reason == "content_filter":
        return "incomplete", "content_filter"
    return "completed", None


# --- a unary answer ------------------------------------------------------------------------------------


class _Function(msgspec.Struct):
    name: str = ""
    arguments: str = ""


class _Call(msgspec.Struct):
    id: str = ""
    function: _Function = msgspec.field(default_factory=_Function)


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_Call] | None = None


class _Choice(msgspec.Struct):
    message: _Message
    finish_reason: str | None = None


class _Completion(msgspec.Struct):
    choices: list[_Choice]
    usage: Usage | None = None


_completion_decoder = msgspec.json.Decoder(_Completion)


def whole_response(frame: ResponseFrame, chat_answer: bytes) -> dict[str, Any]:
    """The ``response`` object of a unary chat answer (its first choice: a response has one)."""
    answer = _completion_decoder.decode(chat_answer)
    choice = answer.choices[0]
    status, incomplete = _ending(choice.finish_reason or "stop")
    output = []
    if choice.message.content or not choice.message.tool_calls:
        output.append(message_item(new_id("msg"), choice.message.content or "", status))
    for call in choice.message.tool_calls or ():
        fn = call.function
        output.append(call_item(new_id("fc"), call.id or new_id("call"), fn.name, fn.arguments, status))
    usage = usage_of(answer.usage) if answer.usage is not None else None
    return frame.object(status, output, usage, incomplete=incomplete)


# --- a stream ----------------------------------------------------------------------------------------


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_CallDelta] | None = None


class _CallDelta(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: _FunctionDelta | None = None


class _FunctionDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ChunkChoice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_ChunkChoice] = msgspec.field(default_factory=list)
    usage: Usage | None = None
    error: dict[str, Any] | None = None


_chunk_decoder = msgspec.json.Decoder(_Chunk)


class _OpenMessage:
    def __init__(self, index: int) -> None:
        self.id = new_id("msg")
        self.index = index
        self.text: list[str] = []


class _OpenCall:
    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.id = new_id("fc")
        self.index = index
        self.call_id = call_id
        self.name = name
        self.arguments: list[str] = []


class ResponseEvents:
    """Recodes one chat stream, as its bytes pass, into the Responses API's events.

    :meth:`recode` takes what a chat stream would write (whole SSE events, a comment, ``[DONE]``) and returns
    what the client gets instead. :meth:`conclude` fixes the final response (with the usage billed) before
    ``[DONE]`` arrives, so a caller can store it first; ``[DONE]`` then writes the items' ends and
    ``response.completed`` with it."""

    def __init__(self, frame: ResponseFrame) -> None:
        self.frame = frame
        self.final: dict[str, Any] | None = None  # the response as it ended (concluded)
        self.failure: dict[str, Any] | None = None
        self._sequence = 0
        self._started = False
        self._ended = False
        self._output: list[tuple[int, dict[str, Any]]] = []  # the items closed so far, by output index
        self._message: _OpenMessage | None = None
        self._calls: dict[int, _OpenCall] = {}  # by the chat delta's index
        self._items = 0
        self._finish_reason = ""
        self._usage: Usage | None = None
        self._parser = sse.SseParser()

    @property
    def ended(self) -> bool:
        return self._ended

    def recode(self, data: bytes) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._started = True
            frame = self.frame.object("in_progress", [])
            out += [
                self._event("response.created", response=frame),
                self._event("response.in_progress", response=frame),
            ]
        for block in self._parser.blocks(data):
            if block.startswith(b":"):
                out.append(block + b"\n\n")
                continue
            payload = sse.event_data(block)
            if payload is None or self._ended:
                continue
            if payload.strip() == sse.DONE_DATA:
                out += self._end()
                continue
            try:
                chunk = _chunk_decoder.decode(payload)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue  # a chat stream's writer checked it: nothing here to say of it
            out += self._chunk(chunk)
        return b"".join(out)

    def conclude(self, usage: Usage | None) -> dict[str, Any]:
        """The response as the stream ends it (its items closed in order, the usage billed); the same
        object ``response.completed`` will carry."""
        if self.final is None:
            if usage is not None:
                self._usage = usage
            self.final = self._final()
        return self.final

    # --- chat's events, one by one ---

    def _chunk(self, chunk: _Chunk) -> list[bytes]:
        if chunk.error is not None:
            return self._fail(chunk.error)
        if chunk.usage is not None:
            self._usage = chunk.usage
        out: list[bytes] = []
        for choice in chunk.choices[:1]:  # a response has one choice
            delta = choice.delta
            if delta is not None and delta.content:
                out += self._text(delta.content)
            for call in (delta.tool_calls if delta is not None else None) or ():
                out += self._call(call)
            if choice.finish_reason:
                self._finish_reason = choice.finish_reason
        return out

    def _text(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        message = self._message
        if message is None:
            out += self._close_calls()
            message = self._message = _OpenMessage(self._next_index())
            item = message_item(message.id, "", "in_progress")
            item["content"] = []
            out.append(self._event("response.output_item.added", output_index=message.index, item=item))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._part_event("response.content_part.added", message, part=part))
        message.text.append(text)
        out.append(self._part_event("response.output_text.delta", message, delta=text, logprobs=[]))
        return out

    def _call(self, delta: _CallDelta) -> list[bytes]:
        out: list[bytes] = []
        call = self._calls.get(delta.index)
        function = delta.function or _FunctionDelta()
        if call is None:
            out += self._close_message()  # calls stay open: a stream may interleave their arguments
            call = _OpenCall(self._next_index(), delta.id or new_id("call"), function.name or "")
            self._calls[delta.index] = call
            item = call_item(call.id, call.call_id, call.name, "", "in_progress")
            out.append(self._event("response.output_item.added", output_index=call.index, item=item))
        if function.arguments:
            call.arguments.append(function.arguments)
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=call.id,
                    output_index=call.index,
                    delta=function.arguments,
                )
            )
        return out

    def _end(self) -> list[bytes]:
        out = self._close_message() + self._close_calls()
        final = self.conclude(None)
        self._ended = True
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=final)]

    def _fail(self, error: dict[str, Any]) -> list[bytes]:
        body = error if isinstance(error, dict) else {}
        code, message = body.get("code") or body.get("type") or "server_error", body.get("message") or ""
        # The response's error code is one of OpenAI's few; the error event keeps the edge's own.
        kind = "rate_limit_exceeded" if "rate_limit" in str(body.get("type")) else "server_error"
        self.failure = {"code": kind, "message": message}
        self.final = self.frame.object("failed", [item for _, item in self._output], error=self.failure)
        self._ended = True
        return [
            self._event("error", code=code, message=message, param=body.get("param")),
            self._event("response.failed", response=self.final),
        ]

    # --- items closed, in order ---

    def _close_message(self) -> list[bytes]:
        message, self._message = self._message, None
        if message is None:
            return []
        text = "".join(message.text)
        status, _ = _ending(self._finish_reason)
        item = message_item(message.id, text, status)
        self._output.append((message.index, item))
        return [
            self._part_event("response.output_text.done", message, text=text, logprobs=[]),
            self._part_event("response.content_part.done", message, part=item["content"][0]),
            self._event("response.output_item.done", output_index=message.index, item=item),
        ]

    def _close_calls(self) -> list[bytes]:
        out = []
        status, _ = _ending(self._finish_reason)  # a call max_output_tokens cut is incomplete
        for call in self._calls.values():
            arguments = "".join(call.arguments)
            item = call_item(call.id, call.call_id, call.name, arguments, status)
            self._output.append((call.index, item))
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=call.id,
                    output_index=call.index,
                    name=call.name,
                    arguments=arguments,
                )
            )
            out.append(self._event("response.output_item.done", output_index=call.index, item=item))
        self._calls.clear()
        return out

    def _final(self) -> dict[str, Any]:
        """The response whole: every item the stream opened (those still open as they are now)."""
        status, incomplete = _ending(self._finish_reason)
        output = list(self._output)
        if (m := self._message) is not None:
            output.append((m.index, message_item(m.id, "".join(m.text), status)))
        for c in self._calls.values():
            output.append((c.index, call_item(c.id, c.call_id, c.name, "".join(c.arguments), status)))
        output.sort(key=lambda indexed: indexed[0])
        usage = usage_of(self._usage) if self._usage is not None else None
        return self.frame.object(status, [item for _, item in output], usage, incomplete=incomplete)

    # --- framing ---

    def _next_index(self) -> int:
        index = self._items
        self._items += 1
        return index

    def _part_event(self, kind: str, message: _OpenMessage, **fields: Any) -> bytes:
        return self._event(kind, item_id=message.id, output_index=message.index, content_index=0, **fields)

    def _event(self, kind: str, **fields: Any) -> bytes:
        fields["type"] = kind
        fields["sequence_number"] = self._sequence
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + json_encoder.encode(fields) + b"\n\n"
