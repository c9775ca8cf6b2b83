"""Log-probabilities over one row of logits, in numpy.

They are of the distribution the model produced: the log-softmax of the raw logits, before temperature,
penalties, top-k/top-p/min-p (vLLM's default, ``logprobs_mode = "raw_logprobs"``), so they score the
text and not the sampling settings. Gemma's vocabulary has 262k entries: the top N come from one
partition, and only those N are sorted.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from regional.engine import Logprobs
from regional.scheduler import StepPlan


def log_normaliser(row: np.ndarray) -> float:
    """log(sum(exp(row))), computed stably: a token's logprob is its logit minus this."""
    peak = float(row.max())
    total = np.exp(np.subtract(row, peak, dtype=np.float32)).sum(dtype=np.float64)
    return peak + float(np.log(total))


def top_tokens(row: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` likeliest token ids, likeliest first (ties: the lower id first, as argmax picks)."""
    n = min(n, row.shape[0])
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    ids = np.argpartition(row, -n)[-n:]
    return ids[np.lexsort((ids, -row[ids]))]


# As vLLM: a logprob is never below this, so a -inf logit still gives a number JSON can carry.
LOGPROB_FLOOR = -9999.0


def position_logprobs(row: np.ndarray, token: int, top_n: int) -> Logprobs:
    """The logprob of ``token`` under ``row`` and the ``top_n`` likeliest tokens' logprobs."""
    normaliser = log_normaliser(row)

    def logprob(t: int) -> float:
        return max(float(row[t]) - normaliser, LOGPROB_FLOOR)

    return Logprobs(token, logprob(token), [(int(t), logprob(int(t))) for t in top_tokens(row, top_n)])


def score_prompt_rows(plan: StepPlan, logits: Callable[[int], np.ndarray]) -> list[list[Logprobs]]:
    """For each run of prompt rows in ``plan`` (``logits(row)`` reads a row after the model ran), the
    log-probabilities of the prompt tokens those rows predict."""
    scores = []
    for seq, first_row, num_rows in plan.prompt_rows:
        top_n = seq.request.prompt_logprobs or 0
        position = plan.positions[first_row]
        predicted = seq.prompt[position + 1 : position + 1 + num_rows]
        scores.append([position_logprobs(logits(first_row + i), t, top_n) for i, t in enumerate(predicted)])
    return scores
