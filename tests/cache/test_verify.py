"""The verifier explains every difference or refuses: what it explains (case, spelling, contractions,
framings, moved phrases, synonyms from its table, number forms, the place of "not"), and the kinds of
difference it was never given a list for, which it refuses by the general rule and names."""

from __future__ import annotations

import pytest

from cache.verify import MAX_COMPARED_CHARS, canon, semantic_allowed, verify


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        # two arguments swapped with no from / to between them
        ("Does coffee raise blood pressure?", "Does blood pressure raise coffee?", "order"),
        ("Is a tomato a fruit?", "Is a fruit a tomato?", "order"),
        (
            "How do I move files from my phone to my laptop?",
            "How do I move files from my laptop to my phone?",
            "order",
        ),
        ("Is Lagos bigger than Abuja?", "Is Abuja bigger than Lagos?", "order"),
        # opposites no table lists
        ("How do I tighten a bicycle chain?", "How do I loosen a bicycle chain?", "words"),
        ("Why is my dough too sticky?", "Why is my dough too crumbly?", "words"),
        ("What is the warmest month in Nairobi?", "What is the coolest month in Nairobi?", "words"),
        ("What is the largest city in Kenya?", "What is the second largest city in Kenya?", "numbers"),
        ("What is the largest city in Kenya?", "What is the smallest city in Kenya?", "words"),
        # a qualifier on one side only: audience, condition, constraint
        ("How much paracetamol can I take?", "How much paracetamol can I take during pregnancy?", "words"),
        ("What is the dose of ibuprofen?", "What is the dose of ibuprofen for a child?", "words"),
        ("How do I bake bread?", "How do I bake bread without an oven?", "negation"),
        ("What should I wear to the interview?", "What should I wear to the interview if it rains?", "words"),
        # another member of a kind
        ("Convert 30 Celsius to Kelvin", "Convert 30 Celsius to Fahrenheit", "units"),
        ("How do I write a cover letter?", "How do I write a poem?", "words"),
        ("How do I read a CSV file in Python?", "How do I read a CSV file in Rust?", "words"),
        ("How do I open a Wema bank account?", "How do I open a GTBank account?", "words"),
        # quantifiers, modals, tense
        ("Do all snakes lay eggs?", "Do some snakes lay eggs?", "words"),
        ("Can I take ibuprofen with food?", "Should I take ibuprofen with food?", "words"),
        ("Who is the president of Ghana?", "Who was the president of Ghana?", "words"),
        # numbers, negation, language
        ("What can I buy with 100 dollars?", "What can I buy with 1000 dollars?", "numbers"),
        ("What is 8 + 7?", "What is 8 - 7?", "words"),
        ("Why is the sky blue?", "Why isn't the sky blue?", "negation"),
        ("Is it safe to drink tap water in London?", "Is it unsafe to drink tap water in London?", "words"),
        ("What is the capital of France?", "Quelle est la capitale de la France ?", "language"),
        # Nigerian Pidgin particles and French
        ("How I fit register for JAMB?", "How I no fit register for JAMB?", "negation"),
        ("Wetin dey cause malaria?", "Wetin don cause malaria?", "words"),
        ("Comment acheter une voiture ?", "Comment vendre une voiture ?", "words"),
        ("Quel est le plus grand pays d'Afrique ?", "Quel est le plus petit pays d'Afrique ?", "words"),
        ("Quels aliments éviter pendant la grossesse ?", "Quels aliments éviter ?", "words"),
    ],
)
def test_a_difference_nothing_explains_is_a_miss_that_names_it(a, b, why):
    verdict = verify(a, b)
    assert not verdict.ok and verdict.reason.startswith(why), verdict
    assert not verify(b, a).ok


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("what is the capital of kenya", "What is the capital of Kenya?"),
        ("WHO WROTE PURPLE HIBISCUS", "Who wrote Purple Hibiscus?"),
        ("Why can't my laptop connect to Wi-Fi?", "Why can my laptop not connect to wifi?"),
        ("Why doesn't my phone charge?", "Why does my phone not charge?"),
        ("What's the boiling point of water?", "What is the boiling point of water?"),
        ("How do I reset my password?", "How can I reset my password?"),
        ("How to cook egusi soup", "How do you cook egusi soup?"),
        ("Please tell me how to make ofada stew.", "How do I make ofada stew?"),
        ("Hi, could you explain what a credit score is?", "What is a credit score?"),
        ("In Lagos, where can I buy a cheap phone?", "Where can I buy a cheap phone in Lagos?"),
        ("During pregnancy, which foods should I avoid?", "Which foods should I avoid during pregnancy?"),
        ("symptoms of malaria", "What are the symptoms of malaria?"),
        ("What is Nigeria's capital?", "What is the capital of Nigeria?"),
        ("What is the best colour for a kitchen?", "What is the best color for a kitchen?"),
        ("How do I improve my credit scor?", "How do I improve my credit score?"),
        ("How do I buy a car?", "How do I purchase a car?"),
        ("What is 10k in naira?", "What is 10,000 in naira?"),
        ("What is three plus four?", "What is 3 plus 4?"),
        ("Is 1.5m naira a good salary?", "Is 1.5 million naira a good salary?"),
        ("Which is better, Python or Java?", "Which is better, Java or Python?"),
        ("what does inflation mean", "What is the meaning of inflation?"),
        ("hw do i check my mtn data balance pls", "How do I check my MTN data balance?"),
        ("Abeg, how I fit cook jollof rice?", "How I fit cook jollof rice?"),
        ("Quelle est la capitale du Sénégal ?", "quelle est la capitale du senegal"),
        (
            "Pendant la grossesse, quels aliments faut-il éviter ?",
            "Quels aliments faut-il éviter pendant la grossesse ?",
        ),
    ],
)
def test_differences_it_explains_pass(a, b):
    assert verify(a, b).ok, verify(a, b)
    assert verify(b, a).ok, verify(b, a)


def test_a_difference_anywhere_in_a_long_text_counts_and_a_text_too_long_is_exact_only():
    tail = " ".join(f"step {i}: keep the old settings" for i in range(40))
    planted = f"How do I reset my password? {tail}"
    assert not verify("How do I reset my password?", planted).ok
    huge = "How do I reset my password? " + "x " * MAX_COMPARED_CHARS
    assert not semantic_allowed(huge) and verify(huge, huge + "y").reason.startswith("length")
    assert semantic_allowed("How do I reset my password?")


def test_code_and_indented_text_are_never_semantic_hits():
    one = "Why does this fail?\n```\nfor i in range(3):\n    print(i)\n```"
    two = "Why does this fail?\n```\nfor i in range(3):\nprint(i)\n```"
    assert not semantic_allowed(one) and not semantic_allowed(two)
    assert verify(one, two).reason.startswith("verbatim")


def test_a_quoted_part_spaced_otherwise_than_by_single_spaces_is_never_a_semantic_hit():
    """Issue 34, N12: the verifier compares words, so it cannot see a quoted part's own spacing."""
    spaced, plain = "keep every space: 'a      b'", "keep every space: 'a b'"
    assert not semantic_allowed(spaced) and semantic_allowed(plain)
    assert verify(plain, spaced).reason.startswith("verbatim")
    assert not semantic_allowed('Reverse "  x"') and not semantic_allowed("Reverse \u201cx\u00a0y\u201d")
    # Apostrophes and inch marks quote nothing; a quoted part spaced as prose is prose.
    for text in (
        "What's the  students' favourite  book?",
        'A 5" screen  or a 7" one?',
        "Is 'rock n roll' a genre?",
    ):
        assert semantic_allowed(text), text


def test_the_prose_shortcut_says_what_the_code_pattern_says():
    """Texts without any character a code marker needs skip the pattern: on every shipped question, and on
    each with every marker put at its start, middle and end, the shortcut and the pattern agree."""
    import json
    from pathlib import Path

    from cache.verify import _CODE, is_prose

    data = Path(__file__).resolve().parents[2] / "cache" / "data"
    questions = [
        text
        for file in sorted(data.rglob("*.jsonl"))
        for line in file.read_text().splitlines()
        if line.strip()
        for key, text in json.loads(line).items()
        if key in ("a", "b") and isinstance(text, str)
    ]
    assert len(questions) > 1000
    markers = ["```", "`x`", "\n  y", "{", ";", "=>", "->", "==", "!=", "&&", "||", "::", "print(", "def f("]
    markers += ["import ", "from ", "#include ", "$ ", ">>> ", "SELECT", "DELETE", "a\nb\nc\n", "from"]
    texts = list(questions)
    for marker in markers:
        for q in questions[::25]:
            texts += [marker + q, q[: len(q) // 2] + marker + q[len(q) // 2 :], q + marker, "  " + marker + q]
    for text in texts:
        is_prose.cache_clear()
        assert is_prose(text) == (_CODE.search(text) is None), text


def test_the_canonical_form_reads_framings_numbers_stems_and_phrases():
    form = canon("How can I send 50kg of maize from Kano to Lagos?")
    assert form.language == "en"
    assert form.phrases[0] == ("", tuple(form.phrases[0][1]))
    keys = [t.key for t in form.tokens]
    assert keys[:1] == ["<how-to>"] and "50" in keys and "kg" in keys
    assert {lead for lead, _ in form.phrases} >= {"from", "to"}
    assert canon("Quelle est la capitale de la France ?").language == "fr"
    assert canon("日本の首都はどこですか").language.startswith("script:")


def test_the_word_list_is_built_once_into_a_file_and_read_from_it(tmp_path):
    from cache import dictionary

    path = dictionary.build(tmp_path / "words.npy")
    words = dictionary._read(path)
    assert words is not None and len(words) > 200_000
    assert "receive" in words and "recieve" not in words and "nigeria" in words
    assert dictionary._read(tmp_path / "missing.npy") is None
