"""The live audit's bookkeeping (which hits are audited, the measured rate, evictions, partitions switched
off and back on) and its judge of two answers, without an edge."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cache import answer_compare
from cache.audit import THRESHOLD_STEP, AuditBook, wilson


def test_a_partitions_first_hits_are_all_audited_then_a_share():
    book = AuditBook(0.01, share=0.1, first_hits=5, rng=random.Random(7))
    assert all(book.should_audit("p") for _ in range(5))
    later = [book.should_audit("p") for _ in range(2000)]
    assert 0.07 < sum(later) / len(later) < 0.13
    assert book.should_audit("q")  # another partition has its own first hits


def test_a_wrong_verdict_evicts_raises_the_questions_threshold_and_switches_the_partition_off():
    book = AuditBook(0.01, first_hits=20, window=200)
    assert book.serves_semantic("p") and book.threshold_for("e1") == 0.0
    recorded = book.record("p", "e1", 0.83, "disagree", "sampled")
    assert recorded.evict and recorded.switched == "off"  # 1 wrong in 1: the lower bound is 0.21
    assert not book.serves_semantic("p") and book.serves_semantic("other")
    assert book.threshold_for("e1") == pytest.approx(0.83 + THRESHOLD_STEP)
    assert book.partitions_off == 1
    rate = book.rate()
    assert (rate.wrong, rate.audited) == (1, 1) and rate.lower > 0.2


def test_agreeing_verdicts_bring_a_partition_back_and_unsure_ones_count_for_neither_side():
    book = AuditBook(0.01, window=200)
    book.record("p", "e1", 0.9, "disagree", "sampled")
    for _ in range(10):
        assert book.record("p", "e2", 0.9, "unsure", "shadow").switched == ""
    assert book.rate("p").audited == 1
    switched = [book.record("p", "e2", 0.9, "agree", "shadow").switched for _ in range(40)]
    assert "on" in switched and book.serves_semantic("p")
    back = switched.index("on") + 1
    assert wilson(1, back + 1)[0] <= 0.01 < wilson(1, back)[0]  # the first count whose lower end is in
    assert book.counts["shadow", "unsure"] == 10


def test_the_rate_of_a_partition_is_over_its_window_and_the_overall_rate_over_everything():
    book = AuditBook(0.5, window=10)
    for i in range(30):
        book.record("p", f"e{i}", 0.9, "disagree" if i < 10 else "agree", "sampled")
    assert book.rate("p").wrong == 0 and book.rate("p").audited == 10
    overall = book.rate()
    assert (overall.wrong, overall.audited) == (10, 30)
    lo, hi = wilson(10, 30)
    assert (overall.lower, overall.upper) == (lo, hi) and overall.measured == pytest.approx(1 / 3)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def test_the_judge_weighs_named_signals_and_says_unsure_between_its_bounds():
    rng = np.random.default_rng(1)
    q = _unit(rng.standard_normal(16))
    near = _unit(q + 0.1 * rng.standard_normal(16))
    far = _unit(rng.standard_normal(16))
    same = answer_compare.judge(
        "q", "Abuja is the capital.", "abuja is the capital", np.stack([q, near, near])
    )
    assert same.judgement == "agree" and same.p_same == 1.0
    right = answer_compare.judge(
        "What is the capital of Nigeria?",
        "The capital of Nigeria is Abuja, since 1991.",
        "Abuja has been Nigeria's capital since 1991.",
        np.stack([q, near, _unit(near + 0.05 * rng.standard_normal(16))]),
    )
    wrong = answer_compare.judge(
        "What is the capital of Nigeria?",
        "The capital of Ghana is Accra, on the coast.",
        "Abuja has been Nigeria's capital since 1991.",
        np.stack([q, far, near]),
    )
    assert right.judgement == "agree" and wrong.judgement == "disagree", (right, wrong)
    assert "cosine" in wrong.reason or "relevance" in wrong.reason
    signals = answer_compare.features("q", "Yes, 5 times.", "No, 7 times.", np.stack([q, q, q]))
    assert signals["yes_no_opposite"] == 1.0 and signals["numbers_disjoint"] == 1.0


def test_fitting_recovers_a_separable_rule():
    rows, labels = [], []
    for i in range(200):
        good = i % 2 == 0
        row = dict.fromkeys(answer_compare.FEATURES, 0.0)
        row["cosine"] = 0.8 if good else 0.2
        rows.append(row)
        labels.append(good)
    weights, bias = answer_compare.fit(rows, labels)
    assert weights["cosine"] > 2 and bias < 0
