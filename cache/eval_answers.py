"""``nearshore cache-eval --answers``: how often the audit's judge (cache/answer_compare.py) is wrong, on
labelled answer pairs (cache/data/answer_pairs.jsonl: a question, a cached and a fresh answer, and whether
the cached one answers it).

The pairs are split by the same hash as the question sets (cache/negatives.py: ``split_of``): the judge's
weights are fitted on ``dev`` (``--fit`` prints them), its error is reported on both and quoted from
``test``. Two errors matter, and are reported apart: a right answer judged different (a false alarm: a good
entry evicted, the measured false-hit rate too high) and a wrong answer judged the same (a miss: the rate
too low); ``unsure`` verdicts count for neither.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from cache import answer_compare
from cache.embedder import Embedder, embedded_model_dir, load_embedder
from cache.negatives import split_of
from cache.settings import CacheSettings

ANSWER_PAIRS = Path(__file__).resolve().parent / "data" / "answer_pairs.jsonl"


class AnswerPair(msgspec.Struct):
    question: str
    cached: str
    fresh: str
    same: bool
    kind: str = ""
    lang: str = "en"

    @property
    def split(self) -> str:
        return split_of(self.question + "\0" + self.cached)


def load(path: Path = ANSWER_PAIRS) -> list[AnswerPair]:
    decoder = msgspec.json.Decoder(AnswerPair)
    return [decoder.decode(line) for line in path.read_bytes().splitlines() if line.strip()]


def evaluate_judge(pairs: list[AnswerPair] | None = None, embedder: Embedder | None = None) -> dict:
    pairs = pairs if pairs is not None else load()
    if embedder is None:
        settings = CacheSettings()
        embedder = load_embedder(str(embedded_model_dir()), backend=settings.embedder_backend)
    texts = list(dict.fromkeys(t for p in pairs for t in (p.question, p.cached, p.fresh)))
    vectors = dict(zip(texts, embedder.embed(texts), strict=True))

    def stack(p: AnswerPair) -> np.ndarray:
        return np.stack([vectors[p.question], vectors[p.cached], vectors[p.fresh]])

    dev = [p for p in pairs if p.split == "dev"]
    rows = [answer_compare.features(p.question, p.cached, p.fresh, stack(p)) for p in dev]
    fitted, bias = answer_compare.fit(rows, [p.same for p in dev])
    report: dict = {
        "pairs": len(pairs),
        "weights_in_use": answer_compare.WEIGHTS,
        "bias_in_use": answer_compare.BIAS,
        "fitted_on_dev": {"weights": fitted, "bias": bias},
        "bounds": {"agree_at": answer_compare.AGREE_AT, "disagree_at": answer_compare.DISAGREE_AT},
        "splits": {},
    }
    for split in ("dev", "test"):
        part = [p for p in pairs if p.split == split]
        verdicts = [answer_compare.judge(p.question, p.cached, p.fresh, stack(p)).judgement for p in part]
        right = [v for p, v in zip(part, verdicts, strict=True) if p.same]
        wrong = [v for p, v in zip(part, verdicts, strict=True) if not p.same]
        report["splits"][split] = {
            "right_answers": len(right),
            "false_alarms": right.count("disagree"),  # a right answer judged different
            "right_unsure": right.count("unsure"),
            "wrong_answers": len(wrong),
            "misses": wrong.count("agree"),  # a wrong answer judged the same
            "wrong_unsure": wrong.count("unsure"),
        }
    return report


def format_judge(r: dict) -> str:
    lines = [
        f"cache-eval --answers: the audit's judge on {r['pairs']} labelled answer pairs (agree at p >= "
        f"{r['bounds']['agree_at']}, disagree at p <= {r['bounds']['disagree_at']}, unsure between)"
    ]
    for split, s in r["splits"].items():
        lines.append(
            f"  {split:<5} right answers judged different {s['false_alarms']}/{s['right_answers']} "
            f"(unsure {s['right_unsure']}); wrong answers judged the same {s['misses']}/{s['wrong_answers']} "
            f"(unsure {s['wrong_unsure']})"
        )
    fitted = r["fitted_on_dev"]
    lines.append(f"  fitted on dev: {fitted['weights']}, bias {fitted['bias']}")
    return "\n".join(lines)
