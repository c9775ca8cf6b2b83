"""Prompt token counts at the edge, for TPM reservations before a request leaves.

With a GGUF configured (and llama-cpp-python installed) the count is exact for the Gemma turn format,
from a vocabulary-only load (no weights). Otherwise it is an estimate: one token per 3 bytes of UTF-8,
plus 4 tokens of framing per chat message. Either way the reservation is settled to the region's exact
usage when the response ends, so an estimate only shifts when a tight TPM limit bites.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from nearshore.protocol.chat_format import gemma_turns
from nearshore.protocol.schemas import ChatMessage

BYTES_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 4


class TokenCounter(Protocol):
    exact: bool

    def count_chat(self, messages: Sequence[ChatMessage]) -> int: ...

    def count_text(self, text: str) -> int: ...


class EstimatingCounter:
    exact = False

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        return sum(self.count_text(m.text()) + TOKENS_PER_MESSAGE for m in messages) + 2

    def count_text(self, text: str) -> int:
        return math.ceil(len(text.encode()) / BYTES_PER_TOKEN) + 1


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

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        return self.count_text(gemma_turns(messages))

    def count_text(self, text: str) -> int:
        data = text.encode()
        # With n_tokens_max = 0, llama_tokenize returns minus the number of tokens it would write.
        buf = (self._llama.llama_token * 1)()
        n = self._llama.llama_tokenize(self._vocab, data, len(data), buf, 0, True, True)
        return -n if n < 0 else n


def make_counter(gguf: str) -> TokenCounter:
    return GgufCounter(gguf) if gguf else EstimatingCounter()
