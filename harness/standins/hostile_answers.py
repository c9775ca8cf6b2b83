"""The bytes of a correct answer, shaped as the regional node shapes it, with whatever usage it claims.

The hostile region's modes build on these: a lie about usage is a correct answer with a false usage
dict; an endless stream repeats a correct token event. Payloads come from the protocol's own Structs,
so the shape follows the region's; they are written by the standard ``json`` module because a lie may be
an integer past int64, which msgspec refuses to encode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from nearshore.protocol import sse
from nearshore.protocol.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    Usage,
)

WORD = " token"
PROMPT_TOKENS = 10


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def encode(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _builtins(struct: msgspec.Struct, claimed_usage: dict[str, Any] | None = None) -> dict[str, Any]:
    payload = msgspec.to_builtins(struct)
    if claimed_usage is not None:
        payload["usage"] = claimed_usage
    return payload


@dataclass
class Answer:
    """One request's answer: chat or text completion, under the id the region would give it."""

    chat: bool
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.request_id}"

    def unary(self, text: str, claimed_usage: dict[str, Any]) -> bytes:
        """The whole non-streamed answer as a JSON body."""
        if self.chat:
            choice = ChatChoice(0, AssistantMessage(text), "length")
            struct: msgspec.Struct = ChatCompletion(
                self.id, self.created, self.model, [choice], Usage.of(0, 0)
            )
        else:
            struct = Completion(self.id, self.created, self.model, [CompletionChoice(0, text, "length")])
        return encode(_builtins(struct, claimed_usage))

    def _event(self, struct: msgspec.Struct, claimed_usage: dict[str, Any] | None = None) -> bytes:
        return b"data: " + encode(_builtins(struct, claimed_usage)) + b"\n\n"

    def _chat_chunk(self, delta: ChatDelta, finish: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(self.id, self.created, self.model, [ChatChunkChoice(0, delta, finish)])

    def first_event(self) -> bytes:
        """The chat stream opens with the assistant's role; a text completion stream has no opener."""
        return self._event(self._chat_chunk(ChatDelta(role="assistant", content=""))) if self.chat else b""

    def token_event(self, text: str = WORD) -> bytes:
        if self.chat:
            return self._event(self._chat_chunk(ChatDelta(content=text)))
        return self._event(Completion(self.id, self.created, self.model, [CompletionChoice(0, text, None)]))

    def end_event(self) -> bytes:
        if self.chat:
            return self._event(self._chat_chunk(ChatDelta(), "length"))
        return self._event(Completion(self.id, self.created, self.model, [CompletionChoice(0, "", "length")]))

    def usage_event(self, claimed_usage: dict[str, Any]) -> bytes:
        if self.chat:
            return self._event(ChatCompletionChunk(self.id, self.created, self.model, []), claimed_usage)
        return self._event(Completion(self.id, self.created, self.model, []), claimed_usage)

    def stream(
        self, num_tokens: int, claimed_usage: dict[str, Any], include_usage: bool, first_text: str = WORD
    ) -> list[bytes]:
        """Every event of a streamed answer of ``num_tokens`` token events, ``[DONE]`` last."""
        events = [self.first_event()] if self.chat else []
        if num_tokens > 0:
            events.append(self.token_event(first_text))
            events += [self.token_event()] * (num_tokens - 1)
        events.append(self.end_event())
        if include_usage:
            events.append(self.usage_event(claimed_usage))
        events.append(sse.DONE)
        return events
