"""The pair judge's threshold per partition, learned from the live audit's verdicts (as vCache learns a
threshold per entry): a deployment's own traffic closes the judge where it misleads and opens it where it
is right, with the operator's false-hit bound kept.

Evidence is the audit's verdicts on candidates the judge scored: judged hits that were served (and audited),
and candidates it turned down with at least ``EXPLORE_FROM`` (judged for free against the answer the client
got from the region: they were never served, so they never count in the partition's measured rate).

- **Closing.** A candidate the audit finds wrong raises the partition's floor above its probability: the
  family of rewordings that misled the judge there is not served again, whatever the calibration says.
- **Opening.** Above the floor every verdict is right (each wrong one raised the floor above itself). The
  partition's threshold comes down to the lowest probability ``t`` whose verdicts at ``t`` or above number
  enough that the upper end of their 95% Wilson interval (0 wrong of n) is within the target: n >= 381 at
  1%, 73 at 5%. So a partition is opened only as far as its own audited traffic proves safe.

The threshold used is ``max(floor, min(calibrated, learned))``. Probabilities are counted in hundredths, so a
partition costs a hundred counters however much traffic it sees.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

Z95 = 1.959964
JUDGE_STEP = 0.005  # how far above a wrong candidate's probability its partition's floor is raised
EXPLORE_FROM = 0.5  # a turned-down candidate the judge gave at least this is judged for free
NEVER = 1.01  # a threshold no probability reaches
_BINS = 100
_MAX_PARTITIONS = 100_000


def right_enough(n: int, target: float) -> bool:
    """Whether n verdicts, none wrong, put the upper end of the 95% Wilson interval within ``target``."""
    return n > 0 and Z95 * Z95 / (n + Z95 * Z95) <= target


@dataclass(slots=True)
class _Evidence:
    floor: float = 0.0  # above every candidate found wrong here
    right: list[int] = field(default_factory=lambda: [0] * _BINS)  # found right, by probability (1/100)
    opened: float = NEVER  # what the verdicts prove (worked out on each verdict, read on every lookup)

    def learned(self, target: float) -> float:
        """The lowest probability whose verdicts at or above it prove the target; NEVER without enough."""
        n = 0
        lowest = NEVER
        first = min(_BINS, max(0, int(self.floor * _BINS + 0.999999)))
        for b in range(_BINS - 1, first - 1, -1):
            n += self.right[b]
            if self.right[b] and right_enough(n, target):
                lowest = b / _BINS
        return max(lowest, self.floor)


class JudgeEvidence:
    def __init__(self, target: float) -> None:
        self.target = target
        self._partitions: OrderedDict[str, _Evidence] = OrderedDict()

    def threshold(self, partition: str, calibrated: float) -> float:
        """The judge's threshold for a candidate in ``partition``."""
        evidence = self._partitions.get(partition)
        if evidence is None:
            return calibrated
        return max(evidence.floor, min(calibrated, evidence.opened))

    def record(self, partition: str, probability: float, wrong: bool) -> None:
        evidence = self._partitions.get(partition)
        if evidence is None:
            evidence = self._partitions[partition] = _Evidence()
            while len(self._partitions) > _MAX_PARTITIONS:
                self._forget_one()
        else:
            self._partitions.move_to_end(partition)
        if wrong:
            evidence.floor = min(NEVER, max(evidence.floor, probability + JUDGE_STEP))
        elif probability >= evidence.floor:
            evidence.right[min(_BINS - 1, max(0, int(probability * _BINS)))] += 1
        evidence.opened = evidence.learned(self.target)

    def counts(self, calibrated: float) -> tuple[int, int]:
        """Partitions whose threshold the audit opened below the calibrated one, and closed above it."""
        opened = closed = 0
        for evidence in self._partitions.values():
            threshold = max(evidence.floor, min(calibrated, evidence.opened))
            opened += threshold < calibrated
            closed += threshold > calibrated
        return opened, closed

    def _forget_one(self) -> None:
        """The least recently judged partition that was never closed (forgetting a closed one would open
        it again); the oldest of all when every one is closed."""
        for name, evidence in self._partitions.items():
            if evidence.floor == 0.0:
                del self._partitions[name]
                return
        self._partitions.popitem(last=False)
