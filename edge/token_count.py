"""Prompt token counts at the edge, for TPM and budget reservations before a request leaves.

Two figures per prompt:

- the *ceiling*: a bound no choice of text can beat. Every token of plain text covers at least one byte of
  its UTF-8 (a byte-fallback token covers exactly one), so a prompt has at most as many tokens as bytes, plus
  the chat template's framing (its markers and role names: ``FRAMING_PER_MESSAGE`` per message and
  ``FRAMING_FIXED`` per prompt cover the Gemma turn format, 5 and 4, and ChatML- or Llama-3-style templates).
  Reservations use it, so digits (about a token a byte) cannot slip past a TPM limit, and it caps what a
  region may report as prompt tokens.
- the *estimate*: what is billed when a region reports no usage (a stream cut short): exact with a GGUF
  configured (and llama-cpp-python installed), else one token per 3 bytes plus the framing.

Either way the reservation is settled to the region's (checked) usage when the response ends.

The stages count through the async methods: a long text is tokenized on the tokenizer's own thread (the
vocabulary's C code runs there without the GIL), never on the event loop, each key's texts taking turns
with the others' (:mod:`edge.fair_worker`). One 1 MiB prompt takes the exact tokenizer about 0.4 s; on the
loop, every other user's stream stood still for that long.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Protocol

from edge.fair_worker import FairWorker
from nearshore.protocol.chat_format import gemma_segments
from nearshore.protocol.prompt_segments import text_pieces
from nearshore.protocol.schemas import ChatMessage

BYTES_PER_TOKEN = 3
FRAMING_PER_MESSAGE = 8
FRAMING_FIXED = 32
# The estimate's framing: the Gemma turn format's own (5 tokens a message, 4 a prompt), rounded.
ESTIMATED_FRAMING_PER_MESSAGE = 4
ESTIMATED_FRAMING_FIXED = 2
# Up to this many characters a text is counted where it is asked (well under a millisecond); longer ones go
# to the tokenizer's thread.
INLINE_CHARS = 4096


def chat_ceiling(messages: Sequence[ChatMessage]) -> int:
    """The most tokens these messages can become, whatever their text."""
    text_bytes = sum(_utf8_len(m.text()) + _utf8_len(m.name or "") for m in messages)
    return text_bytes + FRAMING_PER_MESSAGE * len(messages) + FRAMING_FIXED


def text_ceiling(text: str) -> int:
    """The most tokens a raw completion prompt can become (it may hold special tokens: each is >= 1 byte)."""
    return _utf8_len(text) + FRAMING_FIXED


def _utf8_len(text: str) -> int:
    # Lone surrogates cannot be UTF-8; count them as the replacement bytes a tokenizer would see.
    return len(text.encode("utf-8", "surrogatepass"))


class TokenCounter(Protocol):
    exact: bool

    def count_chat(self, messages: Sequence[ChatMessage], *, continue_final: bool = False) -> int:
        """``continue_final``: the request's ``continue_final_message`` (the last turn left open)."""
        ...

    def count_text(self, text: str) -> int: ...

    async def chat_tokens(
        self, messages: Sequence[ChatMessage], *, continue_final: bool = False, owner: str = ""
    ) -> int:
        """:meth:`count_chat`, never holding the event loop for long; ``owner`` (a key's id) takes its turn
        with other owners for the tokenizer's thread."""
        ...

    async def text_tokens(self, text: str, *, owner: str = "") -> int:
        """:meth:`count_text`, as :meth:`chat_tokens` counts."""
        ...

    def close(self) -> None: ...


class EstimatingCounter:
    """One token per BYTES_PER_TOKEN bytes: a length, cheap at any size (a millisecond for 1 MiB)."""

    exact = False

    def count_chat(self, messages: Sequence[ChatMessage], *, continue_final: bool = False) -> int:
        # An open last turn has a little less framing than a closed one: the estimate keeps the closed one's.
        framing = ESTIMATED_FRAMING_PER_MESSAGE * len(messages) + ESTIMATED_FRAMING_FIXED
        return sum(math.ceil(_utf8_len(m.text()) / BYTES_PER_TOKEN) for m in messages) + framing

    def count_text(self, text: str) -> int:
        return math.ceil(_utf8_len(text) / BYTES_PER_TOKEN) + 1

    async def chat_tokens(
        self, messages: Sequence[ChatMessage], *, continue_final: bool = False, owner: str = ""
    ) -> int:
        return self.count_chat(messages, continue_final=continue_final)

    async def text_tokens(self, text: str, *, owner: str = "") -> int:
        return self.count_text(text)

    def close(self) -> None:
        pass


class GgufCounter:
    """Exact counts from the model's own vocabulary (a vocab-only load: a few MB, no weights)."""

    exact = True

    def __init__(self, path: str) -> None:
        import ctypes

        import llama_cpp  # only an edge with a GGUF configured needs llama-cpp-python

        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._llama = llama_cpp
        self._ctypes = ctypes
        self._model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self._model:
            raise ValueError(f"cannot load the vocabulary of {path}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._bos = 1 if llama_cpp.llama_vocab_get_add_bos(self._vocab) else 0
        self._worker: FairWorker[int] = FairWorker("nearshore-tokenizer")

    # Counted as the region tokenizes (regional/prompt_tokens.py): BOS once, message content as plain text,
    # the turn markers and a completions prompt with control tokens, long texts in the same pieces.

    def count_chat(self, messages: Sequence[ChatMessage], *, continue_final: bool = False) -> int:
        segments = gemma_segments(messages, continue_final=continue_final)
        return self._bos + sum(self._count(s.text, s.special) for s in segments)

    def count_text(self, text: str) -> int:
        return self._bos + self._count(text, True)

    async def chat_tokens(
        self, messages: Sequence[ChatMessage], *, continue_final: bool = False, owner: str = ""
    ) -> int:
        if sum(len(m.text()) for m in messages) <= INLINE_CHARS:
            return self.count_chat(messages, continue_final=continue_final)
        return await self._worker.run(
            owner, partial(self.count_chat, messages, continue_final=continue_final)
        )

    async def text_tokens(self, text: str, *, owner: str = "") -> int:
        if len(text) <= INLINE_CHARS:
            return self.count_text(text)
        return await self._worker.run(owner, partial(self.count_text, text))

    def close(self) -> None:
        # A count under way finishes (the vocabulary stays loaded for it); none start.
        self._worker.close()

    def _count(self, text: str, parse_special: bool) -> int:
        # With n_tokens_max = 0, llama_tokenize returns minus the number of tokens it would write.
        buf = (self._llama.llama_token * 1)()
        total = 0
        for piece in text_pieces(text):
            data = piece.encode()
            n = self._llama.llama_tokenize(self._vocab, data, len(data), buf, 0, False, parse_special)
            total += -n if n < 0 else n
        return total


def make_counter(gguf: str) -> TokenCounter:
    return GgufCounter(gguf) if gguf else EstimatingCounter()
