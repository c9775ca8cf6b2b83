"""The semantic check (cache/decision.py): the verifier's certain reasons veto, its unexplained words go to
the pair judge, whose probability must reach the threshold; without a judge the verifier alone decides."""

from __future__ import annotations

from collections.abc import Sequence

from cache.decision import (
    SemanticCheck,
    judge_threshold_for,
    named_difference,
    named_words,
    semantic_check,
)
from cache.judge_data import half


class FakeJudge:
    """Says ``p`` for every pair and remembers what it was asked (the real one: tests/cache/test_judge.py)."""

    def __init__(self, p: float) -> None:
        self.p, self.asked = p, []

    def __call__(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        self.asked += list(pairs)
        return [self.p] * len(pairs)


def test_what_the_verifier_explains_is_served_without_asking_the_judge():
    judge = FakeJudge(0.0)
    check = SemanticCheck(lambda: judge, threshold=0.9)
    assert check("How do I reset my password?", "how can i reset my password").ok
    assert judge.asked == []


def test_certain_differences_veto_and_the_judge_is_never_asked():
    judge = FakeJudge(1.0)
    check = SemanticCheck(lambda: judge, threshold=0.5)
    for query, cached in [
        ("What can I buy with 100 dollars?", "What can I buy with 1000 dollars?"),  # a number
        ("Is it safe to drink tap water?", "Is it not safe to drink tap water?"),  # a negation
        ("What is the capital of France?", "What is the capital of Germany?"),  # a name
        ("How do I write a loop in Python?", "How do I write a loop in Rust?"),  # a name on one side each
        ("```print(1)```", "```print(2)```"),  # code: exact hits only
    ]:
        decision = check(query, cached)
        assert not decision.ok and decision.judged is None, (query, decision)
    assert judge.asked == []


def test_unexplained_words_go_to_the_judge_and_its_threshold_decides():
    query, cached = "hw do i block my atm card asap", "How can I block my debit card immediately?"
    sure, unsure = FakeJudge(0.97), FakeJudge(0.6)
    accepted = SemanticCheck(lambda: sure, threshold=0.9)(query, cached)
    assert accepted.ok and accepted.judged == 0.97 and sure.asked == [(query, cached)]
    refused = SemanticCheck(lambda: unsure, threshold=0.9)(query, cached)
    assert not refused.ok and refused.reason.startswith("judge: 0.600 < 0.900")


def test_a_judge_that_cannot_be_loaded_leaves_the_verifier_alone_and_says_why():
    def broken():
        raise FileNotFoundError("judge.safetensors")

    check = SemanticCheck(broken, threshold=0.5)
    decision = check("hw do i block my atm card asap", "How can I block my debit card immediately?")
    assert not decision.ok and decision.judged is None
    assert "judge.safetensors" in check.failure
    assert check("How do I reset my password?", "how can i reset my password").ok


def test_names_are_capitalised_words_inside_a_sentence_or_acronyms():
    assert named_words("What is the capital of France?") == {"france"}
    assert named_words("Hw do i block my ATM card, someone stole it") == {"atm"}
    assert named_words("Where can I buy Apple's phones? I live in Lagos.") == {"apple", "lagos"}
    assert named_difference("What is the capital of France?", "what's france's capital") == ""
    assert named_difference("weather in Lagos today", "weather today") == "lagos"


def test_the_threshold_follows_the_target_and_nothing_meets_an_impossible_one():
    assert judge_threshold_for(1.0) <= 1.0
    assert judge_threshold_for(0.0) > 1.0  # the judge never says yes


def test_the_public_sets_halves_are_fixed_by_the_pair_either_way_round():
    assert half("A cat sat.", "The cat sat.") == half("The cat sat.", "a cat sat. ")
    halves = [half(f"question {i}", f"other {i}") for i in range(2000)]
    assert {"train", "calibrate", "held-out"} == set(halves)
    assert 0.45 < halves.count("held-out") / len(halves) < 0.55


def test_a_judged_hit_the_audit_finds_wrong_closes_its_partition_above_it():
    from cache.audit import AuditBook

    book = AuditBook(target=0.01)
    assert book.judge_threshold("p", 0.9) == 0.9
    book.record("p", "e1", 0.8, "agree", "sampled", judged=0.93)
    assert book.judge_threshold("p", 0.9) == 0.9  # one right answer proves nothing yet
    book.record("p", "e2", 0.8, "disagree", "sampled", judged=0.95)
    assert 0.95 < book.judge_threshold("p", 0.9) <= 0.96 and book.judge_threshold("q", 0.9) == 0.9
    book.record("p", "e3", 0.8, "disagree", "sampled")  # the verifier's hit: the judge's threshold stays
    assert book.judge_threshold("p", 0.9) <= 0.96
    check = SemanticCheck(lambda: FakeJudge(0.952), threshold=0.9)
    query, cached = "hw do i block my atm card asap", "How can I block my debit card immediately?"
    assert check(query, cached).ok and not check(query, cached, book.judge_threshold("p", 0.9)).ok


def test_the_shipped_check_asks_the_judge_only_where_the_calibration_or_the_audit_lets_it_say_yes():
    # At the default 1% no judge threshold is calibrated within the target: no judge is loaded or asked ...
    default = semantic_check(True, "", 0.01)
    assert default.load_judge is None and default.judge() is None
    # ... unless the live audit learns a partition's own threshold: then it is loaded, at NEVER
    learning = semantic_check(True, "", 0.01, learns=True)
    assert learning.load_judge is not None and learning.threshold > 1.0
    laxer = semantic_check(True, "", 0.05)
    assert laxer.load_judge is not None and laxer.threshold == judge_threshold_for(0.05) < 1.0
    assert semantic_check(False, "", 0.05).load_judge is None
    missing = semantic_check(True, "/nonexistent/judge.safetensors", 0.05)
    assert missing.judge() is None and "judge.safetensors" in missing.failure


def test_a_lookup_that_has_asked_the_judge_enough_lets_the_verifier_alone_decide():
    judge = FakeJudge(1.0)
    check = SemanticCheck(lambda: judge, threshold=0.5)
    query, cached = "hw do i block my atm card asap", "How can I block my debit card immediately?"
    refused = check(query, cached, ask_judge=False)
    assert not refused.ok and refused.judged is None and judge.asked == []
    assert check(query, cached).ok and len(judge.asked) == 1
