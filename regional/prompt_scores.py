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
from dataclasses import dataclass

import numpy as np

from regional.engine import Logprobs

# Scored positions kept in all. Each is kept as numbers in arrays (an id and a float64 log-probability for
# the token and each alternative: 252 bytes at logprobs=20, so 16.5 MB at this bound), never as Python
# objects (about 2.7 KB a position at logprobs=20: the node's memory grew by that per scored request).
MAX_POSITIONS = 65536


@dataclass(frozen=True, slots=True)
class _Entry:
    tokens: np.ndarray  # int64 [n]: the prompt
    top_n: int
    ids: np.ndarray  # int64 [n - 1, 1 + top_n]: the token scored, then its alternatives (-1: none)
    logprobs: np.ndarray  # float64 [n - 1, 1 + top_n]

    @classmethod
    def of(cls, tokens: np.ndarray, top_n: int, scores: list[Logprobs]) -> _Entry:
        ids = np.full((len(scores), 1 + top_n), -1, dtype=np.int64)
        logprobs = np.zeros((len(scores), 1 + top_n), dtype=np.float64)
        for row, score in enumerate(scores):
            ids[row, 0] = score.token_id
            logprobs[row, 0] = np.nan if score.logprob is None else score.logprob
            for k, (token_id, logprob) in enumerate(score.top[:top_n], start=1):
                ids[row, k], logprobs[row, k] = token_id, logprob
        return cls(tokens, top_n, ids, logprobs)

    @property
    def positions(self) -> int:
        return len(self.ids)

    def scores(self, count: int, top_n: int) -> list[Logprobs]:
        """The first ``count`` positions' scores, with ``top_n`` alternatives each."""
        ids, logprobs = self.ids[:count].tolist(), self.logprobs[:count].tolist()
        return [
            Logprobs(
                row_ids[0],
                None if row_lps[0] != row_lps[0] else row_lps[0],  # (NaN: none)
                [
                    (t, lp)
                    for t, lp in zip(row_ids[1 : 1 + top_n], row_lps[1 : 1 + top_n], strict=True)
                    if t >= 0
                ],
            )
            for row_ids, row_lps in zip(ids, logprobs, strict=True)
        ]


class PromptScores:
    def __init__(self, max_positions: int = MAX_POSITIONS) -> None:
        self.max_positions = max_positions
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._positions = 0
        self._next_id = 0

    def lookup(self, prompt: list[int], top_n: int) -> list[Logprobs]:
        """Scores of ``prompt``'s leading tokens from the entry sharing most of them (entry i scores
        token i + 1), with ``top_n`` alternatives each; empty when none shares two tokens."""
        tokens = np.asarray(prompt, dtype=np.int64)
        best_id, best_len = -1, 1
        for entry_id, entry in self._entries.items():
            if entry.top_n < top_n:
                continue
            shared = _common_prefix_len(entry.tokens, tokens)
            if shared > best_len:
                best_id, best_len = entry_id, shared
        if best_id < 0:
            return []
        self._entries.move_to_end(best_id)
        # Tokens 1..shared-1 are predicted from shared tokens alone.
        return self._entries[best_id].scores(best_len - 1, top_n)

    def store(self, prompt: list[int], top_n: int, scores: list[Logprobs]) -> None:
        """A prompt whose every token after the first was scored (``scores[i]`` scores token i + 1)."""
        if len(scores) != len(prompt) - 1 or not scores or len(scores) > self.max_positions:
            return
        tokens = np.asarray(prompt, dtype=np.int64)
        for entry_id, entry in list(self._entries.items()):
            # The same prompt again, or one this one covers: the new entry replaces it.
            if (
                entry.top_n <= top_n
                and len(entry.tokens) <= len(tokens)
                and _common_prefix_len(entry.tokens, tokens) == len(entry.tokens)
            ):
                self._drop(entry_id)
        self._entries[self._next_id] = _Entry.of(tokens, top_n, scores)
        self._next_id += 1
        self._positions += len(scores)
        while self._positions > self.max_positions:
            self._drop(next(iter(self._entries)))

    def _drop(self, entry_id: int) -> None:
        self._positions -= self._entries.pop(entry_id).positions

    def __len__(self) -> int:
        return len(self._entries)


def _common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
