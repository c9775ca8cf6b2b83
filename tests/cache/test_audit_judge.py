"""The pair judge's threshold per partition, learned from the audit's verdicts (cache/audit_judge.py)."""

from __future__ import annotations

from cache.audit import AuditBook
from cache.audit_judge import EXPLORE_FROM, NEVER, JudgeEvidence, right_enough


def test_how_many_right_verdicts_prove_a_target():
    assert not right_enough(0, 1.0)
    assert not right_enough(380, 0.01) and right_enough(381, 0.01)
    assert not right_enough(72, 0.05) and right_enough(73, 0.05)
    assert not right_enough(10**9, 0.0)


def test_a_partition_opens_only_as_far_as_its_own_right_verdicts_prove():
    evidence = JudgeEvidence(target=0.05)
    for _ in range(60):
        evidence.record("p", 0.97, wrong=False)
    assert evidence.threshold("p", NEVER) == NEVER  # 60 right of 60 do not prove 5%
    for _ in range(13):
        evidence.record("p", 0.80, wrong=False)
    assert evidence.threshold("p", NEVER) == 0.80  # 73 at 0.80 or above
    assert evidence.threshold("p", 0.70) == 0.70  # never above the calibrated one
    assert evidence.threshold("other", NEVER) == NEVER
    assert evidence.counts(NEVER) == (1, 0)


def test_a_wrong_verdict_closes_the_partition_above_it_and_only_evidence_above_counts():
    evidence = JudgeEvidence(target=0.05)
    for _ in range(100):
        evidence.record("p", 0.80, wrong=False)
    assert evidence.threshold("p", NEVER) == 0.80
    evidence.record("p", 0.90, wrong=True)  # a misleading family at 0.90: closed above it
    assert evidence.threshold("p", NEVER) == NEVER  # nothing proved above the wrong one
    assert 0.90 < evidence.threshold("p", 0.5) <= 0.91  # above the calibrated one too
    assert evidence.counts(0.5) == (0, 1)
    for _ in range(72):
        evidence.record("p", 0.95, wrong=False)
    assert evidence.threshold("p", NEVER) == NEVER  # the right ones under the floor no longer count
    evidence.record("p", 0.96, wrong=False)
    assert evidence.threshold("p", NEVER) == 0.95


def test_explored_verdicts_teach_the_judge_but_never_count_as_served_hits():
    book = AuditBook(target=0.05, window=10)
    for i in range(10):
        recorded = book.record("p", f"e{i}", 0.7, "disagree", "explored", judged=EXPLORE_FROM + 0.1)
        assert not recorded.evict and not recorded.switched
    assert book.serves_semantic("p") and book.rate("p").audited == 0 and book.audited == 0
    assert book.judge_threshold("p", 0.5) > 0.6
    for i in range(73):
        book.record("q", f"f{i}", 0.7, "agree", "explored", judged=0.99)
    book.record("q", "g", 0.7, "unsure", "explored", judged=0.5)  # unsure: no evidence either way
    assert book.judge_threshold("q", NEVER) == 0.99
    assert book.counts["explored", "agree"] == 73
