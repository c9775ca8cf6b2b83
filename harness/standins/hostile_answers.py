"""The bytes of a correct answer, shaped as the regional node shapes it, with whatever usage it claims.

The hostile region's modes build on these: a lie about usage is a correct answer with a false usage
dict; an endless stream repeats a correct token event. Payloads come from the protocol's own builder
(nearshore/protocol/answers.py), so the shape is the region's; they are written by the standard ``json``
module because a lie may be an integer past int64, which msgspec refuses to encode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgspec

from nearshore.protocol import sse
from nearshore.protocol.answers import Answer as Shape
from nearshore.protocol.answers import answer_for
from nearshore.protocol.schemas import Usage

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
        payload["usage"] = claimed_usage  # in the usage field's place: the bytes keep the region's order
    return payload


@dataclass
class Answer:
    """One request's answer: chat or text completion, under the id the region would give it."""

    chat: bool
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @cached_property
    def shape(self) -> Shape:
        return answer_for(self.chat, self.request_id, self.model, created=self.created)

    @property
    def id(self) -> str:
        return self.shape.id

    def unary(self, text: str, claimed_usage: dict[str, Any]) -> bytes:
        """The whole non-streamed answer as a JSON body."""
        return encode(_builtins(self.shape.whole(text, "length", Usage.of(0, 0)), claimed_usage))

    def _event(self, struct: msgspec.Struct, claimed_usage: dict[str, Any] | None = None) -> bytes:
        return b"data: " + encode(_builtins(struct, claimed_usage)) + b"\n\n"

    def first_event(self) -> bytes:
        """The chat stream opens with the assistant's role; a text completion stream has no opener."""
        opener = self.shape.opener()
        return b"" if opener is None else self._event(opener)

    def token_event(self, text: str = WORD) -> bytes:
        return self._event(self.shape.content(text))

    def end_event(self) -> bytes:
        return self._event(self.shape.finish("length"))

    def usage_event(self, claimed_usage: dict[str, Any]) -> bytes:
        return self._event(self.shape.usage(Usage.of(0, 0)), claimed_usage)

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
