"""OpenAI's answer objects, built one way for every producer: the region, the edge's cache replies, the
stand-ins (pacer, hostile) and the load generator's self-test server.

A :class:`ChatAnswer` (``/v1/chat/completions``) or :class:`TextAnswer` (``/v1/completions``) holds what
all of one answer's objects share (id, created, model) and builds the whole answer or each stream chunk as
the schema Structs; ``sse.event`` frames a chunk. The bytes follow the Structs' field order, so a change
here changes every producer's wire at once: tests/nearshore/answer_bytes.json pins the bytes they sent.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import ClassVar, Self

from nearshore.protocol.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    FinishReason,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)


class _Ids:
    """What every object of one answer carries: its id, creation time (seconds) and model."""

    __slots__ = ("created", "id", "index", "model")
    prefix: ClassVar[str]  # of the id the region gives a request's answer

    def __init__(self, id: str, model: str, *, created: int | None = None, index: int = 0) -> None:
        self.id = id
        self.model = model
        self.created = int(time.time()) if created is None else created
        self.index = index  # which choice (n > 1) this builder's choices are

    def choice(self, index: int) -> Self:
        """The builder of another choice of the same answer (same id, time and model)."""
        return type(self)(self.id, self.model, created=self.created, index=index)

    @classmethod
    def for_request(cls, request_id: str, model: str, *, created: int | None = None) -> Self:
        """The answer to the request ``request_id``, under the id the region gives it."""
        return cls(f"{cls.prefix}-{request_id}", model, created=created)


class ChatAnswer(_Ids):
    """A chat completion: the whole ``chat.completion`` or its ``chat.completion.chunk`` events."""

    __slots__ = ()
    prefix = "chatcmpl"

    def whole(
        self,
        text: str | None,
        finish: FinishReason,
        usage: Usage,
        logprobs: ChatLogprobs | None = None,
        tool_calls: list[ToolCall] | None = None,
    ) -> ChatCompletion:
        """The answer; with ``tool_calls``, ``text`` is the content beside them (None: none)."""
        message = AssistantMessage(text, tool_calls=tool_calls) if tool_calls else AssistantMessage(text)
        choice = ChatChoice(self.index, message, finish, logprobs)
        return ChatCompletion(self.id, self.created, self.model, [choice], usage)

    def tool_call_opened(self, index: int, call_id: str, name: str) -> ChatCompletionChunk:
        """A streamed call's first chunk: its index, id, type and name, and no arguments yet."""
        delta = ToolCallDelta(index, call_id, "function", FunctionCallDelta(name=name, arguments=""))
        return self._chunk(ChatDelta(tool_calls=[delta]))

    def tool_call_arguments(self, index: int, fragment: str) -> ChatCompletionChunk:
        """More of call ``index``'s arguments: joined, the fragments are its arguments exactly."""
        return self._chunk(
            ChatDelta(tool_calls=[ToolCallDelta(index, function=FunctionCallDelta(arguments=fragment))])
        )

    def opener(self) -> ChatCompletionChunk:
        """The stream's first chunk, before any text: the assistant's role, with an empty content."""
        return self._chunk(ChatDelta(role="assistant", content=""))

    def content(self, text: str, logprobs: ChatLogprobs | None = None) -> ChatCompletionChunk:
        # Once per token, so built inline: one call fewer than through _chunk (~10% of the chunk's cost).
        choice = ChatChunkChoice(self.index, ChatDelta(content=text), None, logprobs)
        return ChatCompletionChunk(self.id, self.created, self.model, [choice])

    def finish(self, reason: FinishReason) -> ChatCompletionChunk:
        return self._chunk(ChatDelta(), reason)

    def usage(self, usage: Usage) -> ChatCompletionChunk:
        """The last chunk, when the client asked for it (``stream_options.include_usage``): no choices."""
        return ChatCompletionChunk(self.id, self.created, self.model, [], usage=usage)

    def _chunk(
        self, delta: ChatDelta, finish: FinishReason | None = None, logprobs: ChatLogprobs | None = None
    ) -> ChatCompletionChunk:
        choice = ChatChunkChoice(self.index, delta, finish, logprobs)
        return ChatCompletionChunk(self.id, self.created, self.model, [choice])


class TextAnswer(_Ids):
    """A legacy completion: the whole ``text_completion`` or its stream's chunks (the same object)."""

    __slots__ = ()
    prefix = "cmpl"

    def whole(
        self, text: str, finish: FinishReason, usage: Usage, logprobs: CompletionLogprobs | None = None
    ) -> Completion:
        choice = CompletionChoice(self.index, text, finish, logprobs)
        return Completion(self.id, self.created, self.model, [choice], usage=usage)

    def opener(self) -> None:
        """A text completion's stream has no opener: its first chunk carries text."""
        return None

    def content(self, text: str, logprobs: CompletionLogprobs | None = None) -> Completion:
        choice = CompletionChoice(self.index, text, None, logprobs)
        return Completion(self.id, self.created, self.model, [choice])

    def finish(self, reason: FinishReason) -> Completion:
        return Completion(self.id, self.created, self.model, [CompletionChoice(self.index, "", reason)])

    def usage(self, usage: Usage) -> Completion:
        return Completion(self.id, self.created, self.model, [], usage=usage)


Answer = ChatAnswer | TextAnswer


def answer_for(chat: bool, request_id: str, model: str, *, created: int | None = None) -> Answer:
    """The answer to one request of either endpoint (``chat``: /v1/chat/completions)."""
    kind = ChatAnswer if chat else TextAnswer
    return kind.for_request(request_id, model, created=created)


def stream_chunks(
    answer: Answer, pieces: Iterable[str], finish: FinishReason, usage: Usage | None = None
) -> list[ChatCompletionChunk | Completion]:
    """Every chunk of a stream whose text is known whole, in the region's order: the opener (chat), one
    content chunk per piece, the finish, then the usage when the client asked for it. ``[DONE]`` is the
    caller's to send: the edge sends it only once the usage is billed."""
    opener = answer.opener()
    chunks: list[ChatCompletionChunk | Completion] = [] if opener is None else [opener]
    chunks += [answer.content(piece) for piece in pieces]
    chunks.append(answer.finish(finish))
    if usage is not None:
        chunks.append(answer.usage(usage))
    return chunks
