"""Prompt log-probabilities already computed, kept for the next prompt that starts the same way.

A scored prompt (completions with ``echo`` and ``logprobs``) needs the logits of every position, so the KV
prefix cache alone cannot spare it any work: a position whose KV is reused has no logits this time. But a
position's scores depend only on the tokens up to it, so a prompt that shares its first tokens with one
scored before can take those scores from here and its KV from the prefix cache, and score only the rest.

Entries are whole scored prompts, least recently used first out, bounded by their positions in all; an
entry with ``top_n`` alternatives serves any request for as many or fewer.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from regional.engine import Logprobs

# Scored positions kept in all: ~21 (id, logprob) pairs each at logprobs=20, a few MB at this bound.
MAX_POSITIONS = 65536


class PromptScores:
    def __init__(self, max_positions: int = MAX_POSITIONS) -> None:
        self.max_positions = max_positions
        self._entries: OrderedDict[int, tuple[np.ndarray, int, list[Logprobs]]] = OrderedDict()
        self._positions = 0
        self._next_id = 0

    def lookup(self, prompt: list[int], top_n: int) -> list[Logprobs]:
        """Scores of ``prompt``'s leading tokens from the entry sharing most of them (entry i scores
        token i + 1), with ``top_n`` alternatives each; empty when none shares two tokens."""
        tokens = np.asarray(prompt, dtype=np.int64)
        best_id, best_len = -1, 1
        for entry_id, (known, known_top, _) in self._entries.items():
            if known_top < top_n:
                continue
            shared = _common_prefix_len(known, tokens)
            if shared > best_len:
                best_id, best_len = entry_id, shared
        if best_id < 0:
            return []
        self._entries.move_to_end(best_id)
        _, known_top, scores = self._entries[best_id]
        # Tokens 1..shared-1 are predicted from shared tokens alone.
        kept = scores[: best_len - 1]
        if known_top == top_n:
            return list(kept)
        return [Logprobs(s.token_id, s.logprob, s.top[:top_n]) for s in kept]

    def store(self, prompt: list[int], top_n: int, scores: list[Logprobs]) -> None:
        """A prompt whose every token after the first was scored (``scores[i]`` scores token i + 1)."""
        if len(scores) != len(prompt) - 1 or not scores or len(scores) > self.max_positions:
            return
        tokens = np.asarray(prompt, dtype=np.int64)
        for entry_id, (known, known_top, _) in list(self._entries.items()):
            # The same prompt again, or one this one covers: the new entry replaces it.
            if (
                known_top <= top_n
                and len(known) <= len(tokens)
                and _common_prefix_len(known, tokens) == len(known)
            ):
                self._drop(entry_id)
        self._entries[self._next_id] = (tokens, top_n, scores)
        self._next_id += 1
        self._positions += len(scores)
        while self._positions > self.max_positions:
            self._drop(next(iter(self._entries)))

    def _drop(self, entry_id: int) -> None:
        _, _, scores = self._entries.pop(entry_id)
        self._positions -= len(scores)

    def __len__(self) -> int:
        return len(self._entries)


def _common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
