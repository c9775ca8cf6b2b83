"""Prompt segments to token ids, with the work bounded before and while tokenizing.

Tokenizing is the one cost a caller can make the node pay before any limit applies, so:

* a prompt whose UTF-8 length exceeds ``limit_tokens`` x (the longest token's bytes) cannot fit: it is
  refused before a single call to the tokenizer;
* segments are tokenized in order, long ones in pieces, and the count stops once past ``limit_tokens``;
* message content is plain text (``parse_special=False``); only segments marked special parse control
  tokens. The short template markers among them are tokenized once and remembered.

Runs in a worker thread (llama.cpp releases the GIL), never on the event loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nearshore.protocol.prompt_segments import Segment, text_pieces, utf8_length
from regional.engine import PromptTooLong
from regional.llama_model import LlamaModel

MARKER_CHARS = 64  # special segments this short are template markers: worth remembering
MARKERS_KEPT = 1024  # a bound on what is remembered, whatever the template renders


class PromptTokenizer:
    def __init__(self, model: LlamaModel) -> None:
        self._model = model
        self._bos = model.bos_prefix()
        self.longest_token_bytes = model.longest_token_bytes()
        self._markers: dict[str, list[int]] = {}

    def tokenize(self, segments: Sequence[Segment], limit_tokens: int) -> list[int]:
        """BOS once, then each segment's tokens; raises :class:`PromptTooLong` once past ``limit_tokens``."""
        num_bytes = utf8_length(segments)
        if num_bytes > limit_tokens * self.longest_token_bytes:  # fewer tokens than that is impossible
            raise PromptTooLong(math.ceil(num_bytes / self.longest_token_bytes))
        tokens = list(self._bos)
        for segment in segments:
            if segment.special and len(segment.text) <= MARKER_CHARS:
                tokens += self._marker(segment.text)
            else:
                for piece in text_pieces(segment.text):
                    tokens += self._model.tokenize(piece, add_special=False, parse_special=segment.special)
                    if len(tokens) > limit_tokens:
                        raise PromptTooLong(len(tokens))
            if len(tokens) > limit_tokens:
                raise PromptTooLong(len(tokens))
        return tokens

    def _marker(self, text: str) -> list[int]:
        tokens = self._markers.get(text)
        if tokens is None:
            tokens = self._model.tokenize(text, add_special=False, parse_special=True)
            if len(self._markers) < MARKERS_KEPT:
                self._markers[text] = tokens
        return tokens
