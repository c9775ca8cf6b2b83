"""Token sampling over one row of logits: penalties, temperature, top-k, min-p, top-p, seeded draws.

Gemma's vocabulary has 262k entries, so nothing here sorts the whole row: greedy is one argmax, top-k
is one partition, and top-p grows a partition until it holds the nucleus.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from regional.engine import SamplingParams
from regional.grammar import allows, masked

SEED_SPACE = 1 << 64


def numpy_seed(seed: int) -> int:
    """Any integer is a valid seed: numpy wants one in [0, 2**64), so seeds are taken modulo 2**64.

    The same seed always gives the same draws; seeds that differ by a multiple of 2**64 are the same seed
    (-1 draws what 2**64 - 1 draws), so int64 seeds are all distinct, as are uint64 seeds.
    """
    return seed % SEED_SPACE


class TokenSampler:
    """Per-sequence sampling state: its random generator and the counts of tokens it produced."""

    __slots__ = ("_prompt_ids", "_rng", "counts", "params")

    def __init__(self, params: SamplingParams, prompt_tokens: Sequence[int] = ()) -> None:
        self.params = params
        self._rng: np.random.Generator | None = None
        self.counts: dict[int, int] = {}
        # The repetition penalty counts the prompt's tokens as seen, as vLLM's and HF's do.
        self._prompt_ids = (
            np.unique(np.asarray(prompt_tokens, dtype=np.int64))
            if params.repetition_penalised
            else np.empty(0, dtype=np.int64)
        )

    @property
    def rng(self) -> np.random.Generator:
        # Made on first use: greedy never needs one, and numpy's unseeded default_rng gathers OS entropy
        # (milliseconds here), which would sit in every request's queue time.
        if self._rng is None:
            seed = self.params.seed if self.params.seed is not None else random.getrandbits(64)
            self._rng = np.random.default_rng(numpy_seed(seed))
        return self._rng

    def sample(self, logits: np.ndarray, mask: np.ndarray | None = None) -> int:
        """Pick the next token from ``logits`` (a read-only view is fine: it is never written), among those
        ``mask`` allows when there is one (a grammar's bitmask, :mod:`regional.grammar`)."""
        params = self.params
        if params.logit_bias:
            logits = biased(logits, params.logit_bias)
        # vLLM's order: the repetition penalty, then the frequency and presence penalties, then the grammar.
        if params.repetition_penalised:
            logits = self._repetition_penalised(logits)
        if params.penalised and self.counts:
            logits = self._penalised(logits)
        if params.greedy:
            token = int(np.argmax(logits))
            # The likeliest token is the masked row's likeliest too when the grammar allows it: the common
            # case costs one bit test, not a pass over the vocabulary.
            if mask is not None and not allows(mask, token):
                token = int(np.argmax(masked(logits, mask)))
        else:
            token = self._draw(logits if mask is None else masked(logits, mask))
        self.counts[token] = self.counts.get(token, 0) + 1
        return token

    def _repetition_penalised(self, logits: np.ndarray) -> np.ndarray:
        # HF's (CTRL's) definition: a seen token's logit is divided by the penalty when positive and
        # multiplied by it when negative, so a penalty > 1 always makes it less likely.
        output_ids = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
        ids = np.union1d(self._prompt_ids, output_ids)
        if ids.shape[0] == 0:
            return logits
        penalty = np.float32(self.params.repetition_penalty)
        seen = logits[ids]
        adjusted = logits.copy()
        adjusted[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
        return adjusted

    def _penalised(self, logits: np.ndarray) -> np.ndarray:
        # OpenAI's definition: subtract count * frequency_penalty + presence_penalty for each seen token.
        ids = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
        seen = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
        adjusted = logits.copy()
        adjusted[ids] -= seen * self.params.frequency_penalty + self.params.presence_penalty
        return adjusted

    def _draw(self, logits: np.ndarray) -> int:
        params = self.params
        if 0 < params.top_k < logits.shape[0]:
            ids = np.argpartition(logits, -params.top_k)[-params.top_k :]
            values = logits[ids]
        else:
            ids = None
            values = logits
        # float32 throughout: exp over the whole vocabulary is the cost here, and the draw needs no more.
        probs = np.subtract(values, values.max(), dtype=np.float32)
        probs *= np.float32(1.0 / params.temperature)
        np.exp(probs, out=probs)
        if params.min_p > 0.0:
            # probs are relative to the likeliest token's (it is exp(0) = 1): keep those >= min_p of it.
            keep = np.flatnonzero(probs >= np.float32(params.min_p))
            probs = probs[keep]
            ids = keep if ids is None else ids[keep]
        if params.top_p < 1.0:
            keep = nucleus(probs, params.top_p * float(probs.sum()))
            probs = probs[keep]
            ids = keep if ids is None else ids[keep]
        cdf = np.cumsum(probs)
        choice = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        choice = min(choice, probs.shape[0] - 1)
        return int(ids[choice]) if ids is not None else choice


def biased(logits: np.ndarray, bias: tuple[tuple[int, float], ...]) -> np.ndarray:
    """A copy of ``logits`` with OpenAI's ``logit_bias`` added."""
    out = logits.copy()
    ids = np.fromiter((token for token, _ in bias), dtype=np.int64, count=len(bias))
    out[ids] += np.fromiter((value for _, value in bias), dtype=np.float32, count=len(bias))
    return out


def nucleus(probs: np.ndarray, mass: float) -> np.ndarray:
    """Indices of the smallest set of most likely entries whose (unnormalised) mass reaches ``mass``."""
    size = probs.shape[0]
    k = min(size, 64)
    while True:
        top = np.argpartition(probs, -k)[-k:] if k < size else np.arange(size)
        if k == size or probs[top].sum() >= mass:
            break
        k = min(size, k * 8)
    top = top[np.argsort(probs[top])[::-1]]
    cut = int(np.searchsorted(np.cumsum(probs[top]), mass, side="left")) + 1
    return top[: min(cut, top.shape[0])]
