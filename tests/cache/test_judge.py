"""The shipped pair judge (cache/judge.py) as the cache runs it: ONNX Runtime over the trained weights and
the installed model's word embeddings, no torch."""

from __future__ import annotations

import numpy as np
import pytest

from cache.judge import JUDGE_FILE, PairJudge


@pytest.fixture(scope="module")
def judge() -> PairJudge:
    return PairJudge(JUDGE_FILE)


def test_a_rewording_scores_above_another_question(judge: PairJudge):
    same, other = judge.same(
        [
            ("What is the fastest way to learn French?", "How can I learn French quickly?"),
            ("How do I reset my router?", "How do I buy a router?"),
        ]
    )
    assert same > 0.5 > other
    stolen = "How do I block my ATM card? Someone stole my bag."
    reworded, different = judge.same(
        [(stolen, "My bag was stolen, how can I block my card?"), (stolen, "How do I order a new ATM card?")]
    )
    assert reworded > different


def test_both_orders_give_one_answer_and_odd_input_is_judged(judge: PairJudge):
    a, b = "What is the fastest way to learn French?", "How can I learn French quickly?"
    assert judge.same([(a, b)])[0] == pytest.approx(judge.same([(b, a)])[0], abs=1e-6)
    odd = judge.same([("", "?"), ("word " * 2000, "word"), ("é ü 中文 🙂", "\x00\n\t")])
    assert odd.shape == (3,) and np.all((odd >= 0) & (odd <= 1))
    assert judge.same([]).shape == (0,)


def test_int8_keeps_the_fp32_judgement(judge: PairJudge):
    fp32 = PairJudge(JUDGE_FILE, int8=False)
    pairs = [
        ("How do I reset my router?", "What is the way to reset a router?"),
        ("Is Lagos bigger than Abuja?", "Is Abuja bigger than Lagos?"),
        ("best jollof rice recipe", "How do I cook jollof rice?"),
    ]
    assert np.abs(judge.same(pairs) - fp32.same(pairs)).max() < 0.1
