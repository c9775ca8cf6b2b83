"""Do two answers say the same thing? The audit's judge (cache/audit.py): a semantic hit's cached answer
beside the answer the model gave, in the background, to the question actually asked.

Two answers to one question rarely match word for word, so word equality says little; an answer to a
near-miss question often shares most words with the right one and differs in one number or name. The
judge reads a few named signals and weighs them with a logistic model fitted on labelled answer pairs
(cache/data/answer_pairs.jsonl, the ``dev`` half by the same hash split as the question sets; the other half
only measures it, ``nearshore cache-eval --answers``):

- ``cosine``: the two answers' embeddings (the cache's own embedder);
- ``relevance``: how much closer the cached answer is to the question than the fresh one is (an answer to
  another question drifts from the question asked);
- ``overlap`` and ``containment``: shared content words (the verifier's reading: stems, synonyms), over
  both, and over the shorter answer (a short right answer inside a long one);
- ``numbers_disjoint`` / ``numbers_shared``, ``names_disjoint`` / ``names_shared``: both answers give
  numbers (names) and none (some) are in common;
- ``yes_no_opposite``: one opens with yes, the other with no.

The judge says ``agree`` above ``AGREE_AT``, ``disagree`` below ``DISAGREE_AT`` and ``unsure`` between: an
unsure verdict counts for neither side of the measured rate. Its own error on the held-out half is what
the docs quote (measured, not assumed): the share of right answers it calls different (a good entry
evicted, the measured rate too high) and of wrong answers it calls the same (the rate too low).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cache import verify_words as vw
from cache.verify_read import canon

FEATURES = (
    "cosine", "relevance", "overlap", "containment", "numbers_disjoint", "numbers_shared",
    "names_disjoint", "names_shared", "yes_no_opposite",
)  # fmt: skip
# Fitted by `nearshore cache-eval --answers --fit` on the dev half of cache/data/answer_pairs.jsonl with the
# int8 embedder (re-fit after changing the embedder, the features or the verifier's reading of words).
WEIGHTS = {
    "cosine": 1.79, "relevance": 1.42, "overlap": -0.5, "containment": 1.79, "numbers_disjoint": -1.37,
    "numbers_shared": 0.48, "names_disjoint": -1.07, "names_shared": 0.35, "yes_no_opposite": -1.42,
}  # fmt: skip
BIAS = -1.34
AGREE_AT = 0.7
DISAGREE_AT = 0.3

Judgement = Literal["agree", "disagree", "unsure"]
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][^\W\d_]+")
_COMMON = vw.IGNORED | vw.set_of(
    "and or of to in on for with at by it this that be is are was were you your i we they he she them his "
    "her their its as from not no yes"
)


@dataclass(frozen=True, slots=True)
class AnswerVerdict:
    judgement: Judgement
    p_same: float  # the model's probability that the two answers say the same thing
    reason: str  # the strongest signals, for the log


def features(question: str, cached: str, fresh: str, vectors: np.ndarray) -> dict[str, float]:
    """The signals for one pair; ``vectors``: the unit embeddings of question, cached, fresh (rows)."""
    vq, vc, vf = (np.asarray(v, dtype=np.float32) for v in vectors)
    words_c, words_f = _content(cached), _content(fresh)
    shared = words_c & words_f
    numbers_c, numbers_f = _numbers(cached), _numbers(fresh)
    names_c, names_f = _names(cached), _names(fresh)
    return {
        "cosine": float(vc @ vf),
        "relevance": float(vq @ vc) - float(vq @ vf),
        "overlap": len(shared) / max(1, len(words_c | words_f)),
        "containment": len(shared) / max(1, min(len(words_c), len(words_f))),
        "numbers_disjoint": float(bool(numbers_c and numbers_f and not numbers_c & numbers_f)),
        "numbers_shared": float(bool(numbers_c & numbers_f)),
        "names_disjoint": float(bool(names_c and names_f and not names_c & names_f)),
        "names_shared": float(bool(names_c & names_f)),
        "yes_no_opposite": float(_yes_no(cached) * _yes_no(fresh) < 0),
    }


def judge(
    question: str,
    cached: str,
    fresh: str,
    vectors: np.ndarray,
    weights: dict[str, float] | None = None,
    bias: float = BIAS,
) -> AnswerVerdict:
    if _plain(cached) == _plain(fresh):
        return AnswerVerdict("agree", 1.0, "the same text")
    weights = weights or WEIGHTS
    signals = features(question, cached, fresh, vectors)
    z = bias + sum(weights[name] * value for name, value in signals.items())
    p = 1.0 / (1.0 + math.exp(-z))
    judgement: Judgement = "agree" if p >= AGREE_AT else "disagree" if p <= DISAGREE_AT else "unsure"
    strongest = sorted(signals, key=lambda n: -abs(weights[n] * signals[n]))[:3]
    reason = ", ".join(f"{n} {signals[n]:.2f}" for n in strongest)
    return AnswerVerdict(judgement, round(p, 4), reason)


def fit(rows: Sequence[dict[str, float]], same: Sequence[bool], l2: float = 0.5, steps: int = 4000) -> tuple:
    """Logistic weights for ``rows`` of features (deterministic: plain gradient descent from zero)."""
    x = np.array([[r[n] for n in FEATURES] + [1.0] for r in rows])
    y = np.array(same, dtype=float)
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-x @ w))
        w -= 0.5 * (x.T @ (p - y) / len(y) + l2 * w / len(y))
    return {n: round(float(v), 2) for n, v in zip(FEATURES, w[:-1], strict=True)}, round(float(w[-1]), 2)


def _plain(text: str) -> str:
    return " ".join(text.split()).casefold().rstrip(" .!?")


def _content(text: str) -> set[str]:
    return {t.key for t in canon(text[:2000]).tokens if t.key not in _COMMON and len(t.key) > 2}


def _numbers(text: str) -> set[str]:
    return {n.replace(",", ".") for n in _NUMBER.findall(text)}


def _names(text: str) -> set[str]:
    return {n.casefold() for n in _NAME.findall(text)}


def _yes_no(text: str) -> int:
    head = text.strip().casefold()[:4]
    if head.startswith(("yes", "oui")):
        return 1
    if head.startswith(("no", "non")) and not head.startswith("not"):
        return -1
    return 0
