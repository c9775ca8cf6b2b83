"""Log-probabilities in OpenAI's two wire shapes: chat's ``logprobs.content`` entries and the legacy
completions' parallel lists (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from nearshore.protocol.schemas import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from regional.engine import Logprobs

# The most distinct tokens whose names are kept (a name is a few dozen bytes; the vocabulary has 262k).
NAMES_CACHED = 32768


class TokenNames:
    """A token's name on the wire and its bytes: its text, or as OpenAI spells a piece that is not whole
    UTF-8 (part of a character), ``bytes:\\xe2\\x80``."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self._piece = piece
        self.name = functools.lru_cache(maxsize=NAMES_CACHED)(self._name)

    def _name(self, token: int) -> tuple[str, list[int]]:
        raw = self._piece(token)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return text, list(raw)


def chat_logprobs(scored: Iterable[Logprobs], names: TokenNames) -> ChatLogprobs:
    content = []
    for position in scored:
        token, raw = names.name(position.token_id)
        top = []
        for alternative, logprob in position.top:
            name, alternative_raw = names.name(alternative)
            top.append(TopLogprob(name, logprob, alternative_raw))
        # A sampled token's logprob is never None (only the first prompt token's is).
        content.append(ChatTokenLogprob(token, position.logprob or 0.0, raw, top))
    return ChatLogprobs(content)


class CompletionLogprobsWriter:
    """One choice's legacy log-probabilities, chunk after chunk: ``text_offset`` runs on across chunks.

    As vLLM counts it, a token's offset is the sum of the lengths of the names before it, from 0 (the
    echoed prompt's first token included), so it matches the choice's text wherever names are text.
    """

    def __init__(self, names: TokenNames) -> None:
        self.names = names
        self.offset = 0

    def render(self, scored: Iterable[Logprobs]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for position in scored:
            token = self.names.name(position.token_id)[0]
            out.tokens.append(token)
            out.token_logprobs.append(position.logprob)
            if position.logprob is None:  # the first prompt token: nothing predicts it
                out.top_logprobs.append(None)
            else:
                # As OpenAI's legacy API: the top N, and the chosen token's even when it is not among them.
                top = {self.names.name(t)[0]: logprob for t, logprob in position.top}
                top.setdefault(token, position.logprob)
                out.top_logprobs.append(top)
            out.text_offset.append(self.offset)
            self.offset += len(token)
        return out
