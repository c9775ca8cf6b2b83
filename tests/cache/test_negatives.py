"""The hard-negative generator: each transformation changes what is asked, the split is fixed by the seed,
the output is reproducible, and its word tables are not the verifier's."""

from __future__ import annotations

import random

import pytest

from cache import negatives
from cache import negatives_words as gw
from cache import verify_words as vw
from cache.negatives import Seed, generate, split_of


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("antonym", "How do I buy shares?", "How do I sell shares?"),
        ("superlative", "What is the largest lake in Africa?", "What is the smallest lake in Africa?"),
        ("ordinal", "What is the largest lake in Africa?", "What is the second largest lake in Africa?"),
        ("negation", "Is it safe to swim here?", "Is it not safe to swim here?"),
        ("tense", "Who is the president of Kenya?", "Who was the president of Kenya?"),
        ("modal", "Can I take aspirin daily?", "Must I take aspirin daily?"),
        ("swap", "Does coffee affect sleep?", "Does sleep affect coffee?"),
        ("number", "What can I buy with 100 dollars?", "What can I buy with 1000 dollars?"),
    ],
)
def test_each_transformation_changes_what_is_asked(name, text, expected):
    found = negatives.TRANSFORMS[name](text, "en", random.Random(0))
    assert found is not None and found[0] == expected, found


def test_qualifier_sibling_and_person_add_or_replace_a_word_of_their_kind():
    rng = random.Random(1)
    text, changed = negatives.qualifier("How do I treat a cough?", "en", rng)
    assert text.startswith("How do I treat a cough ") and text.endswith("?") and changed
    text, changed = negatives.sibling("How far is it in kilometres?", "en", rng)
    assert "kilometres" not in text and changed[0] == "kilometres"
    text, _ = negatives.person("How do I renew a passport?", "en", rng)
    assert not text.startswith("How do I ") and text.startswith("How does ")


def test_a_swap_never_exchanges_words_whose_order_is_free():
    rng = random.Random(0)
    assert negatives.swap("What is the difference between tea and coffee?", "en", rng) is None
    assert negatives.swap("How do I send money from my bank to my phone?", "en", rng) is None


def test_the_split_is_fixed_by_the_seed_and_the_output_reproduces():
    seeds = [
        Seed(f"How do I cook dish number {i} with rice?", f"How can I cook dish {i} with rice?")
        for i in range(60)
    ]
    first, second = generate(seeds), generate(seeds)
    assert first == second and len(first) > 60
    assert {n.split for n in first} == {"dev", "test"}
    for n in first:
        assert n.split == split_of(seeds[n.seed].a)
    assert split_of("  What Is X? ") == split_of("what is x?")


def test_pidgin_and_french_seeds_get_their_own_negatives():
    pidgin = Seed("How I fit open account?", "How I go take open account?", "pcm")
    french = Seed("Comment acheter une voiture ?", "Comment puis-je acheter une voiture ?", "fr")
    out = generate([pidgin, french])
    kinds = {(n.lang, n.kind) for n in out}
    assert ("fr", "gen-antonym") in kinds and ("pcm", "gen-negation") in kinds


def test_the_generators_tables_never_call_two_words_the_verifier_calls_one():
    # A generated "opposite" or "sibling" that the verifier reads as a synonym would be explained away:
    # the tables would contradict each other. (That the generator's words are mostly not in the verifier's
    # tables at all is what cache-eval's listed / general split reports.)
    def head(word: str) -> str:
        return vw.SYNONYMS.get(word, word)

    for table in gw.ANTONYMS.values():
        for a, b in table.items():
            assert head(a) != head(b), (a, b)
    for groups in gw.SIBLINGS.values():
        for group in groups:
            heads = [head(w) for w in group]
            assert len(set(heads)) == len(heads), group


def test_the_learned_options_candidates_are_word_substitutions_and_its_threshold_admits_no_dev_negative():
    from cache import eval_learned
    from cache.evaluate import Pair

    assert eval_learned.substitution("How do I buy a car?", "How do I sell a car?") == ("buy", "sell")
    assert eval_learned.substitution("How do I buy a car?", "How do I not buy a car?") is None  # negation
    assert eval_learned.substitution("How do I buy a car?", "How can I buy a car?") is None  # explained
    found = [
        eval_learned.Candidate(Pair("a", "b", False, "sibling"), "dev", 0.8),
        eval_learned.Candidate(Pair("a", "c", True), "dev", 0.9),
        eval_learned.Candidate(Pair("a", "d", False, "sibling"), "sealed", 0.85),
    ]
    report = eval_learned.report(found)
    assert report["fitted_threshold"] == pytest.approx(0.8, abs=1e-3)
    assert report["roles"]["dev"] == {
        "refused_paraphrases_seen": 1, "paraphrases_added": 1, "negatives_seen": 1, "false_hits_added": 0
    }  # fmt: skip
    assert report["roles"]["sealed"]["false_hits_added"] == 1
