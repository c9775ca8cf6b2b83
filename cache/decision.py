"""Whether a semantic candidate may answer a question: the verifier's certain vetoes, then the pair judge.

The verifier (:mod:`cache.verify`) explains differences word by word. When it explains every one, the
candidate is served: nothing the judge could add. When it refuses, its reason says why, and only some
reasons are certain: a different number, unit or negation, verbatim text (code), a text too long to read,
another language, the same words in another order (swapped roles), or a named thing on one side that the
other does not name (:func:`named_difference`). Those stay vetoes. The rest (``words: ...``: words on one
side that no table explains, how people actually reword a question) go to the judge
(:class:`cache.judge.PairJudge`), which reads both questions together; its probability must reach the
threshold the operator's target false-hit rate maps to (``JUDGE_CALIBRATION``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cache.audit_judge import NEVER
from cache.verify import verify

# The verifier's reasons the judge may overrule: words on one side that no table explains.
JUDGED_REASONS = ("words:",)
_NAME = re.compile(r"(?<![\w'’])([A-Z][\w'’.-]*[A-Za-z0-9])")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;\"“(]\s*|\n\s*)$")
_NOT_NAMES = frozenset(
    {"i", "i'm", "i've", "i'd", "i'll", "ok", "okay", "pls", "plz", "please", "hi", "hello"}
)


@dataclass(frozen=True, slots=True)
class Decision:
    ok: bool
    reason: str = ""  # why not (the verifier's veto, or the judge's probability under the threshold)
    judged: float | None = None  # the judge's probability, when it was asked


def named_words(text: str) -> set[str]:
    """Words written as names (capitalised inside a sentence, or acronyms), casefolded, possessives off."""
    out = set()
    for match in _NAME.finditer(text):
        word = match.group(1)
        before = text[: match.start(1)]
        if _SENTENCE_START.search(before) and not (len(word) > 1 and word.isupper()):
            continue  # a sentence's first word is capitalised whatever it is
        key = re.sub(r"['’]s$", "", word).casefold().rstrip(".")
        if key and key not in _NOT_NAMES:
            out.add(key)
    return out


def named_difference(a: str, b: str) -> str:
    """A name one question has and the other never mentions (in any case), or ""."""
    folded_a, folded_b = _words(a), _words(b)
    for name in sorted(named_words(a)):
        if name not in folded_b:
            return name
    for name in sorted(named_words(b)):
        if name not in folded_a:
            return name
    return ""


def _words(text: str) -> set[str]:
    """Every word, casefolded, as written and without its possessive or a trailing full stop."""
    words = re.findall(r"[\w'’.-]+", text.casefold())
    return {re.sub(r"['’]s$", "", w) for w in words} | {w.rstrip(".") for w in words}


Judge = Callable[[Sequence[tuple[str, str]]], "Sequence[float]"]
log = logging.getLogger("nearshore.cache")

# (judge threshold, false-hit rate on hard negatives: the worst public set's, the upper end of its 95% Wilson
# interval), as `nearshore cache-eval --calibrate-judge` measures it through the whole check (cosine
# threshold, vetoes, judge) on each public set's calibration slice (cache/judge_data.py: never trained on;
# MRPC, STS-B, PAWS-Wiki, SICK, banking77, CLINC150, HWU64), non-increasing; the lowest threshold within the
# operator's target is used. The promise is per set, so each slice is held to it on its own: slices of a
# few hundred negatives cannot prove 1% or 2% (the worst stays at 4.0% however sure the judge must be), so
# at those targets the calibration never lets the judge serve, and only a partition's own audited traffic
# does (cache/audit_judge.py); 5% uses 0.99, 10% 0.77. Measured with the judge in int8, the shipped file;
# re-measure after retraining it or changing the verifier.
JUDGE_CALIBRATION: Sequence[tuple[float, float]] = (
    (0.50, 0.3757),
    (0.60, 0.1829),
    (0.70, 0.1101),
    (0.77, 0.1000),
    (0.85, 0.0967),
    (0.90, 0.0832),
    (0.92, 0.0764),
    (0.95, 0.0660),
    (0.97, 0.0590),
    (0.98, 0.0518),
    (0.99, 0.0401),
)


def judge_threshold_for(target_false_hit_rate: float) -> float:
    for threshold, false_hits in sorted(JUDGE_CALIBRATION):
        if false_hits <= target_false_hit_rate:
            return threshold
    return NEVER  # nothing meets the target: the judge never says yes


def semantic_check(
    enabled: bool, path: str, target_false_hit_rate: float, learns: bool = False, threshold: float = 0.0
) -> SemanticCheck:
    """The check an edge (or cache-eval) runs: the judge at ``path`` ("" = the shipped one) when enabled,
    at ``threshold`` (0: the calibrated one for the target). A judge that can never say yes there is still
    loaded where the live audit ``learns`` a partition's own threshold (cache/audit_judge.py); otherwise it
    is not loaded nor asked."""
    threshold = threshold or judge_threshold_for(target_false_hit_rate)
    if not enabled or (threshold >= NEVER and not learns):
        return SemanticCheck()
    from cache.judge import JUDGE_FILE, PairJudge  # numpy, tokenizers, onnxruntime: only when judging

    file = Path(path).expanduser() if path else JUDGE_FILE
    return SemanticCheck(lambda: PairJudge(file).same, threshold)


class SemanticCheck:
    """``check(query, cached) -> Decision``, called in the cache's worker thread (never on the event loop).
    The judge is loaded on its first use, or ahead of it by the cache's first semantic lookup (an edge
    whose cache is off or exact-only never holds it); without one (none configured, or it failed to
    load), the verifier alone decides."""

    def __init__(self, load_judge: Callable[[], Judge] | None = None, threshold: float = 1.0) -> None:
        self.load_judge = load_judge
        self.threshold = threshold
        self.failure = ""  # why the judge could not be loaded, for /health
        self._judge: Judge | None = None
        self._lock = threading.Lock()

    @property
    def judge_loaded(self) -> bool:
        return self._judge is not None

    def judge(self) -> Judge | None:
        if self._judge is not None or self.load_judge is None:
            return self._judge
        with self._lock:
            if self._judge is None and self.load_judge is not None:
                try:
                    self._judge = self.load_judge()
                except Exception as exc:  # a missing or damaged file: the verifier alone decides
                    self.failure = f"the pair judge could not be loaded: {exc}"[:300]
                    log.warning("cache: %s; the verifier alone decides", self.failure)
                    self.load_judge = None
        return self._judge

    def __call__(
        self, query: str, cached: str, threshold: float | None = None, ask_judge: bool = True
    ) -> Decision:
        """``threshold``: the judge's own here (the live audit's for a partition), else the calibrated one;
        ``ask_judge`` False: the verifier alone (a lookup that has asked the judge enough)."""
        verdict = verify(query, cached)
        if verdict.ok:
            return Decision(True)
        judging = ask_judge and (self.load_judge is not None or self._judge is not None)
        if not judging or not verdict.reason.startswith(JUDGED_REASONS):
            return Decision(False, verdict.reason)
        if name := named_difference(query, cached):
            return Decision(False, f"names: {name} on one side")
        judge = self.judge()
        if judge is None:
            return Decision(False, verdict.reason)
        p = float(judge([(query, cached)])[0])
        threshold = self.threshold if threshold is None else threshold
        if p >= threshold:
            return Decision(True, judged=p)
        return Decision(False, f"judge: {p:.3f} < {threshold:.3f} ({verdict.reason})", judged=p)
