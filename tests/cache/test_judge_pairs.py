"""The pairs made from intent datasets: what the filters keep apart, where negatives come from, and that the
output is the same bytes on every run (no git or dataset needed)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from cache.judge_pairs import (
    Candidate,
    content_words,
    finalize,
    jsonl_gz,
    make_pairs,
    may_be_same,
    slot_signature,
    unique_utterances,
)
from cache.judge_pairs_sources import PairRules, Utterance

ROOT = Path(__file__).resolve().parents[2]

# Two domains; in "banking" two intents share words ("card"), so each is the other's near miss.
TEXTS = {
    ("banking", "card_arrival"): [
        "when will my card arrive",
        "how long until my card arrives",
        "my card has not arrived yet",
        "when does my card arrive",
        "is my card going to arrive soon",
        "has my card arrived",
        "when will my replacement card arrive",
    ],
    ("banking", "lost_card"): [
        "i lost my card",
        "my card is lost",
        "what do i do about a lost card",
        "my card was lost yesterday",
        "how to report my lost card",
        "lost card what now",
        "i lost my replacement card",
    ],
    ("travel", "lost_luggage"): [
        "my luggage is lost",
        "the airline lost my luggage",
        "how do i report lost luggage",
        "lost luggage what now",
        "i lost my luggage on the flight",
    ],
    ("travel", "flight_delay"): [
        "is my flight delayed",
        "my flight is delayed what now",
        "how late is my flight",
        "flight delayed how long",
        "will my flight be delayed",
    ],
}


def utterances() -> list[Utterance]:
    return [
        Utterance(f"{intent}:{n}", text, intent, domain)
        for (domain, intent), texts in TEXTS.items()
        for n, text in enumerate(texts)
    ]


def candidate(text: str, entities: frozenset[tuple[str, str]] = frozenset()) -> Candidate:
    # The intent-rare words are left out so that each test sees one filter alone.
    return Candidate(
        Utterance(text, text, "intent", "domain", entities),
        content_words(text),
        slot_signature(text),
        frozenset(),
    )


def test_the_slot_signature_keeps_numbers_currencies_and_names_but_not_i_or_the_first_word():
    assert slot_signature("Can I send 100 euros to Lagos?") == {"100", "euros", "lagos"}
    assert slot_signature("Send it to Amaka, I'm told USD works") == {"amaka", "usd"}
    assert slot_signature("How do I get my card?") == frozenset()


def test_a_different_number_name_or_currency_blocks_a_positive():
    assert may_be_same(candidate("can I send money to Lagos"), candidate("can I send money to Lagos please"))
    assert not may_be_same(candidate("can I send money to Lagos"), candidate("can I send money to Abuja"))
    assert not may_be_same(candidate("send 100 euros"), candidate("send 200 euros"))
    assert not may_be_same(candidate("send money in euros"), candidate("send money in pounds"))


def test_a_contrast_word_on_one_side_only_blocks_a_positive():
    assert may_be_same(candidate("when will my card arrive"), candidate("when does my card arrive"))
    assert not may_be_same(candidate("when will my card arrive"), candidate("when will my new card arrive"))
    assert not may_be_same(candidate("turn the lights on"), candidate("turn the lights off"))
    assert not may_be_same(candidate("change my pin"), candidate("give me my pin number"))


def test_a_positive_needs_a_shared_word_and_if_asked_the_same_entities():
    assert not may_be_same(candidate("where is it"), candidate("what about that"))
    at_nine = candidate("wake me up", frozenset({("time", "nine am")}))
    at_ten = candidate("wake me up", frozenset({("time", "ten am")}))
    assert may_be_same(at_nine, at_ten) and not may_be_same(at_nine, at_ten, same_entities=True)


def test_a_text_under_two_intents_is_dropped_and_repeats_keep_the_first():
    kept = unique_utterances(
        [
            Utterance("1", "  Where is  my card ", "card_arrival", "banking"),
            Utterance("2", "where is my card", "card_arrival", "banking"),
            Utterance("3", "is it lost", "lost_card", "banking"),
            Utterance("4", "Is it lost", "card_arrival", "banking"),
        ]
    )
    assert [(u.id, u.text) for u in kept] == [("1", "Where is my card")]


def test_positives_share_an_intent_and_negatives_a_domain_with_another_intent():
    rows = make_pairs("synthetic", utterances(), PairRules())
    domain_of = {u.id: u.domain for u in utterances()}
    positives = [row for row in rows if row["label"] == 1]
    negatives = [row for row in rows if row["label"] == 0]
    assert positives and {row["domain"] for row in negatives} == {"banking", "travel"}
    assert all(row["intent_a"] == row["intent_b"] for row in positives)
    for row in negatives:
        assert row["intent_a"] != row["intent_b"]
        assert domain_of[row["id_a"]] == domain_of[row["id_b"]] == row["domain"]
    assert len(negatives) <= 1.25 * len(positives) + len({u.domain for u in utterances()})


def test_never_same_intents_give_no_positives_and_confusable_intents_no_negatives():
    rules = PairRules(never_same=frozenset({"card_arrival"}), confusable=(("lost_card", "card_arrival"),))
    rows = make_pairs("synthetic", utterances(), rules)
    assert not any(row["label"] == 1 and row["intent_a"] == "card_arrival" for row in rows)
    assert not any(row["label"] == 0 and row["domain"] == "banking" for row in rows)


def test_finalize_drops_self_pairs_and_repeats_in_either_order():
    rows = [
        {"a": "Is my card lost", "b": "is my card  lost", "label": 1},
        {"a": "when will it come", "b": "where is it", "label": 0},
        {"a": "Where is it", "b": "When will it come", "label": 0},
    ]
    assert [(row["a"], row["b"]) for row in finalize("synthetic", rows)] == [
        ("when will it come", "where is it")
    ]


def test_the_output_is_the_same_bytes_whatever_the_hash_seed():
    script = (
        "import hashlib;"
        "from cache.judge_pairs import finalize, jsonl_gz, make_pairs;"
        "from cache.judge_pairs_sources import PairRules;"
        "from tests.cache.test_judge_pairs import utterances;"
        "rows = finalize('synthetic', make_pairs('synthetic', utterances(), PairRules()));"
        "print(hashlib.sha256(jsonl_gz(rows)).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    here = jsonl_gz(finalize("synthetic", make_pairs("synthetic", utterances(), PairRules())))
    assert digests == {hashlib.sha256(here).hexdigest() + "\n"}
