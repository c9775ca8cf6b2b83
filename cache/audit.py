"""The live audit's bookkeeping: which semantic hits are audited, the false-hit rate they measure (per
partition and overall, with its interval), which entries are wrong, and which partitions may serve
semantic hits at all.

A calibration promises a rate on the sets it was measured on; a deployment asks its own questions. So the
edge audits some of its own semantic hits: the answer the region was already computing for the request
(it races the lookup) is let finish in the background, never sent or billed to the tenant, and judged
against the cached answer (cache/answer_compare.py). Audited: every one of a partition's first
``first_hits`` semantic hits, then a share ``share`` of them. Free verdicts come too: a hit that lost the race
to the region's first byte, and a would-be hit in a partition whose semantic level is off, are judged
against the answer the client got.

- An entry judged wrong is evicted, and its question's threshold rises above the similarity it was wrongly
  served at (vCache learns a threshold per entry): when the answer to that question is stored again, a
  question as far from it as that one is no longer served from it.
- The pair judge's threshold is learned per partition from the verdicts on what it scored
  (:mod:`cache.audit_judge`): closed above a candidate found wrong, opened as far down as the partition's
  own right verdicts prove the target. Candidates the judge turned down are judged for free (``explored``)
  and count only there, never in the partition's measured rate: they were never served.
- ``target_false_hit_rate`` is an operating limit: when the lower end of a partition's 95% interval, over
  its last ``window`` verdicts, is above the target, the partition serves exact hits only; its would-be
  hits are still judged (for free), and when the lower end is back within the target, they are served again.

Everything here is in memory, one book per edge process: pure bookkeeping, tested without an edge. Where a
city's edges share their cache (cache/city_share.py), each edge's decided verdicts are told to the others
(``Verdict``), whose books record them too (``told``): a partition one edge found wrong stops serving
semantic hits on every edge, and an entry's raised threshold holds everywhere; each edge's own totals
(``audited``, ``wrong``, ``counts``) stay its own audits.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from cache.audit_judge import JudgeEvidence

Mode = Literal["sampled", "raced", "shadow", "explored"]
Z95 = 1.959964
THRESHOLD_STEP = 0.01  # how far above a wrong hit's similarity its question's threshold is raised
_MAX_PARTITIONS = 100_000  # partitions remembered (least recently audited forgotten first)
_MAX_RAISED = 100_000  # questions whose threshold was raised, remembered


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k in n (95% by default); (0, 1) for none."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


class Verdict(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One decided verdict, as an edge tells the city's other edges (the arguments of ``record``)."""

    partition: str
    exact: str
    similarity: float
    judgement: Literal["agree", "disagree"]
    mode: Mode
    judged: float | None = None


@dataclass(slots=True)
class _Partition:
    verdicts: deque[bool] = field(default_factory=deque)  # True: wrong; the last `window` decided ones
    hits: int = 0  # semantic hits served
    off: bool = False


@dataclass(frozen=True, slots=True)
class Recorded:
    """What one verdict changed: the entry to evict, the partition switched off or back on."""

    evict: bool
    switched: Literal["off", "on", ""]


@dataclass(frozen=True, slots=True)
class Rate:
    wrong: int
    audited: int
    lower: float
    upper: float

    @property
    def measured(self) -> float:
        return self.wrong / self.audited if self.audited else 0.0


class AuditBook:
    def __init__(
        self,
        target: float,
        share: float = 0.05,
        first_hits: int = 20,
        window: int = 200,
        rng: random.Random | None = None,
    ) -> None:
        self.target = target
        self.share = share
        self.first_hits = first_hits
        self.window = window
        self.rng = rng or random.Random()
        self._partitions: OrderedDict[str, _Partition] = OrderedDict()
        self._raised: OrderedDict[str, float] = OrderedDict()  # exact key -> the threshold it needs
        self.judged = JudgeEvidence(target)  # the pair judge's threshold per partition, learned
        self.wrong = 0  # every decided verdict since start
        self.audited = 0
        self.counts: dict[tuple[Mode, str], int] = {}  # (mode, judgement) -> verdicts, for /metrics

    # --- serving ---------------------------------------------------------------------------------------

    def serves_semantic(self, partition: str) -> bool:
        p = self._partitions.get(partition)
        return p is None or not p.off

    def should_audit(self, partition: str) -> bool:
        """Whether the hit about to be served is audited (and counts it as served)."""
        p = self._partition(partition)
        p.hits += 1
        return p.hits <= self.first_hits or self.rng.random() < self.share

    def threshold_for(self, exact: str) -> float:
        """The lowest similarity at which an entry for this question may be served (0: the cache's own)."""
        return self._raised.get(exact, 0.0)

    def judge_threshold(self, partition: str, calibrated: float) -> float:
        """The judge's probability a candidate needs in this partition (``calibrated``: the shipped one)."""
        return self.judged.threshold(partition, calibrated)

    # --- verdicts --------------------------------------------------------------------------------------

    def record(
        self,
        partition: str,
        exact: str,
        similarity: float,
        judgement: str,
        mode: Mode,
        judged: float | None = None,
        told: bool = False,
    ) -> Recorded:
        """One verdict on a served (held, or explored) hit; ``judged``: the pair judge's probability when
        the judge scored it; ``told``: another edge of the city reached it (it counts for the partition and
        the entry, not in this edge's own totals)."""
        if not told:
            self.counts[mode, judgement] = self.counts.get((mode, judgement), 0) + 1
        if judgement not in ("agree", "disagree"):
            return Recorded(False, "")
        wrong = judgement == "disagree"
        if judged is not None:
            self.judged.record(partition, judged, wrong)
        if mode == "explored":  # never served: evidence for the judge only
            return Recorded(False, "")
        if not told:
            self.audited += 1
            self.wrong += wrong
        p = self._partition(partition)
        p.verdicts.append(wrong)
        while len(p.verdicts) > self.window:
            p.verdicts.popleft()
        if wrong:
            self._raise(exact, similarity + THRESHOLD_STEP)
        lower, _ = wilson(sum(p.verdicts), len(p.verdicts))
        switched: Literal["off", "on", ""] = ""
        if not p.off and lower > self.target:
            p.off, switched = True, "off"
        elif p.off and lower <= self.target:
            p.off, switched = False, "on"
        return Recorded(wrong, switched)

    def rate(self, partition: str | None = None) -> Rate:
        """The measured false-hit rate and its 95% interval: overall (every verdict since start) or a
        partition's (its window)."""
        if partition is None:
            wrong, n = self.wrong, self.audited
        else:
            p = self._partitions.get(partition)
            wrong, n = (sum(p.verdicts), len(p.verdicts)) if p is not None else (0, 0)
        lower, upper = wilson(wrong, n)
        return Rate(wrong, n, lower, upper)

    @property
    def partitions_off(self) -> int:
        return sum(p.off for p in self._partitions.values())

    # --- inside ----------------------------------------------------------------------------------------

    def _partition(self, partition: str) -> _Partition:
        p = self._partitions.get(partition)
        if p is None:
            p = self._partitions[partition] = _Partition()
            if len(self._partitions) > _MAX_PARTITIONS:
                self._forget_one()
        else:
            self._partitions.move_to_end(partition)
        return p

    def _forget_one(self) -> None:
        """The least recently used partition that serves semantic hits is forgotten (one switched off is
        kept: forgetting it would switch it back on)."""
        for name, p in self._partitions.items():
            if not p.off:
                del self._partitions[name]
                return

    def _raise(self, exact: str, threshold: float) -> None:
        self._raised[exact] = min(1.0, max(threshold, self._raised.get(exact, 0.0)))
        self._raised.move_to_end(exact)
        while len(self._raised) > _MAX_RAISED:
            self._raised.popitem(last=False)
