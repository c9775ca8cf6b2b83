"""``nearshore cache-eval --calibrate-judge``: the pair judge's threshold for each target false-hit rate.

Measured on the calibration slices of the public sets (cache/judge_data.py: an eighth of each train half,
never trained on) and nothing else: the dev sets were trained on, and the held-out halves, the sealed
sets and outside sets such as Quora's are only ever measured. Each pair goes the way a lookup does: the
cosine threshold, the verifier (its explanations accept, its certain reasons veto), then the judge. For each
judge threshold, the false hits on hard negatives (the upper end of their 95% Wilson interval) and the
paraphrases served; made non-increasing, as the cosine calibration is. ``JUDGE_CALIBRATION`` in
cache/decision.py is what this prints, and the lowest threshold within the operator's target is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cache.audit import wilson
from cache.decision import Decision, SemanticCheck
from cache.embedder import Embedder
from cache.evaluate import EASY_KINDS, Pair
from cache.judge_data import JUDGE_DATA, public_pairs

JUDGE_GRID = (*(round(0.50 + 0.01 * i, 2) for i in range(50)), 0.995, 0.998, 0.999)


@dataclass(frozen=True, slots=True)
class Judged:
    pair: Pair
    similarity: float
    decision: Decision  # with threshold 0: every candidate the vetoes let through is judged

    def hit_at(self, cosine: float, judge: float) -> bool:
        if self.similarity < cosine:
            return False
        d = self.decision
        return d.judged >= judge if d.judged is not None else d.ok


def calibration_pairs() -> list[Pair]:
    return [
        Pair(p.a, p.b, p.label >= 0.5, f"{p.source}-{'same' if p.label >= 0.5 else 'different'}")
        for p in public_pairs(JUDGE_DATA, "calibrate")
    ]


def judge_all(pairs: Sequence[Pair], embedder: Embedder, check: SemanticCheck) -> list[Judged]:
    """Every pair's cosine and decision, the judge asked wherever the vetoes let a pair through."""
    va = embedder.embed([p.a for p in pairs])
    vb = embedder.embed([p.b for p in pairs])
    similarity = np.einsum("ij,ij->i", va, vb)
    judge = check.judge()
    everything = SemanticCheck(None if judge is None else lambda: judge, threshold=0.0)
    return [Judged(p, float(s), everything(p.b, p.a)) for p, s in zip(pairs, similarity, strict=True)]


def judge_curve(
    judged: Sequence[Judged], cosine: float, grid: Sequence[float] = JUDGE_GRID
) -> list[tuple[float, float, float]]:
    """(judge threshold, upper end of the 95% interval of false hits on hard negatives, paraphrase hit
    rate), the false-hit column made non-increasing in the threshold. The promise is per set (at most the
    target on every one), so the false hits are the worst source's: each public set's calibration slice
    on its own, not all of them pooled (a pool of easy negatives would hide one hard set)."""
    hard: dict[str, list[Judged]] = {}
    for j in judged:
        if not j.pair.same and j.pair.kind not in EASY_KINDS:
            hard.setdefault(j.pair.kind.rsplit("-", 1)[0], []).append(j)
    same = [j for j in judged if j.pair.same]
    rows = []
    for t in grid:
        worst = max(
            (wilson(sum(j.hit_at(cosine, t) for j in js), len(js))[1] for js in hard.values()), default=0.0
        )
        hits = sum(j.hit_at(cosine, t) for j in same)
        rows.append((t, worst, hits / len(same) if same else 0.0))
    out, floor = [], 0.0
    for t, rate, hit_rate in reversed(rows):
        floor = max(floor, rate)
        out.append((t, round(floor, 4), round(hit_rate, 4)))
    return sorted(out)


def format_judge_curve(rows: Sequence[tuple[float, float, float]]) -> str:
    lines = ["JUDGE_CALIBRATION (threshold, false hits on hard negatives: 95% upper end; paraphrases hit):"]
    lines += [f"    ({t:.3f}, {rate:.4f}),  # {hits:.1%}" for t, rate, hits in rows]
    return "\n".join(lines)
