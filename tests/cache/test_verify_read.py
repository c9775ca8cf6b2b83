"""How the verifier reads a question (cache/verify_read.py): its canonical form, compared key by key. Forms
of one question read alike (case, accents, contractions, chat spellings, framings, ignored words, rewrites
of a whole question, numbers, stems, synonyms, moved phrases, possessives, joined words in any order); what
changes the question stays apart (negation, other numbers, whose it is); the language named; the stemmer's
rules; and text that is empty or only punctuation read as nothing, never an error."""

from __future__ import annotations

import pytest

from cache.verify_read import CLAUSE, Canon, Token, canon, stem


def keys(text: str) -> list[str]:
    return [t.key for t in canon(text).tokens]


def phrases(text: str) -> list[tuple[str, list[str]]]:
    return [(lead, [t.key for t in words]) for lead, words in canon(text).phrases]


def same(a: str, b: str) -> bool:
    """The same words and the same phrases, in any order of the phrases (which may move)."""
    return canon(a).keys() == canon(b).keys() and sorted(phrases(a)) == sorted(phrases(b))


def test_a_text_is_read_once_and_its_form_is_a_value():
    a = canon("How do I cook rice?")
    assert canon("How do I cook rice?") is a  # cached: a candidate is compared often
    assert isinstance(a, Canon) and a.language == "en"
    assert a.phrases == (("", (Token("<how-to>", "<how-to>"), Token("cook", "cook"), Token("ric", "rice"))),)
    assert a.tokens == [Token("<how-to>", "<how-to>"), Token("cook", "cook"), Token("ric", "rice")]
    assert a.keys() == {"<how-to>": 1, "cook": 1, "ric": 1}
    with pytest.raises(AttributeError):
        a.language = "fr"  # type: ignore[misc]


def test_the_surface_keeps_the_word_as_written_for_spelling_explanations():
    (token,) = canon("Cafés").tokens
    assert token == Token("caf", "cafes")  # casefolded, accents folded, not stemmed


@pytest.mark.parametrize("text", ["", "   ", "??", "!!! ... ,,,", "\n\n"])
def test_empty_or_only_punctuation_reads_as_nothing(text):
    c = canon(text)
    assert c.phrases == () and c.tokens == [] and not c.keys() and c.language == "en"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # case, accents, curly apostrophes
        ("WHY IS THE SKY BLUE", "why is the sky blue?"),
        ("naïve résumé", "naive resume"),
        ("It’s raining", "it's raining"),
        # contractions and chat spellings
        ("What's the capital of Nigeria?", "What is the capital of Nigeria?"),
        ("hw do u cook rice", "how do you cook rice"),
        ("hw 2 cook rice", "how to cook rice"),
        # framings and politeness
        ("How do I cook rice?", "how to cook rice"),
        ("Please, can you tell me how to cook rice", "How can I cook rice?"),
        ("Hi, how do I reset my password?", "how to reset my password"),
        ("Where can I buy rice in Lagos?", "where to buy rice in Lagos"),
        # whole questions put another way
        ("What does FOMO mean?", "What is the meaning of FOMO"),
        ("define FOMO", "What does FOMO mean?"),
        ("How much does a bag of rice cost?", "What is the price of a bag of rice?"),
        # numbers
        ("two million people", "2m people"),
        ("2 million people", "2,000,000 people"),
        ("the third day", "the 3rd day"),
        ("ten cars", "10 cars"),
        ("1.5m naira", "1,500,000 naira"),
        # stems and synonyms
        ("cooking rice", "cooked rice"),
        ("How do I buy a car?", "How do I purchase a car?"),
        ("How do I reboot my laptop?", "How do I restart my laptop?"),
        # moved phrases, possessives, joined words
        ("In Lagos, where can I buy rice", "Where can I buy rice in Lagos?"),
        ("rice in Lagos for a beginner", "rice for a beginner in Lagos"),
        ("Nigeria's capital", "the capital of Nigeria"),
        ("Africa's longest river", "the longest river of Africa"),
        ("salt and pepper", "pepper and salt"),
        ("Python or Java", "Java or Python"),
        # French
        ("Comment faire une omelette ?", "Comment préparer une omelette"),
        ("Quelle est la capitale de la France ?", "la capitale de la France"),
    ],
)
def test_forms_of_one_question_read_alike(a, b):
    assert same(a, b), (keys(a), keys(b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Why is the sky blue?", "Why isn't the sky blue?"),
        ("I can swim", "I can't swim"),
        ("What can I buy with 100 dollars?", "What can I buy with 1000 dollars?"),
        ("the first day", "the second day"),
        ("what is my name", "what is your name"),
        (
            "How do I move files from my phone to my laptop?",
            "How do I move files to my phone from my laptop?",
        ),
        ("Is Lagos bigger than Abuja?", "Is Lagos big than Abuja?"),  # never -er
        ("version 1.2.3", "version 1.2.4"),
    ],
)
def test_what_changes_the_question_stays_apart(a, b):
    assert not same(a, b), (keys(a), keys(b))


def test_negation_reads_as_its_own_word():
    assert keys("Why isn't the sky blue?") == ["why", "not", "sky", "blu"]
    assert keys("I can't swim") == ["i", "can", "not", "swim"]


def test_numbers_read_as_digits_with_their_scale_and_currency_after_them():
    assert keys("What is 10k in naira") == ["10000", "naira"]
    assert keys("how much is $5") == ["5", "dollar", "cost"]
    assert keys("I have €20") == ["i", "hav", "20", "euro"]
    assert keys("5%") == ["5", "percent"]
    assert keys("1,500 dollars") == ["1500", "dollar"]
    # A version, a decimal comma, a sign: kept as written, not a number read wrongly.
    assert keys("version 1.2.3") == ["version", "1.2.3"]
    assert keys("3,5 kg") == ["3,5", "kg"]
    assert keys("-5 degrees") == ["-", "5", "degre"]


def test_a_lone_2_or_4_between_words_is_a_word_but_not_before_a_plural():
    assert keys("give it 4 me") == ["giv", "it", "me"] and phrases("give it 4 me")[1] == ("for", ["me"])
    assert keys("2 cups of flour") == ["2", "flour", "cup"]


def test_phrases_open_at_prepositions_and_a_dropped_helper_ends_one():
    assert phrases("rice in Lagos for a beginner") == [("", ["ric"]), ("in", ["lago"]), ("for", ["beginner"])]
    # "to Kenya from Nigeria" ends before "do I need a visa": the helper's place is a clause mark.
    assert phrases("flying to Kenya from Nigeria do I need a visa") == [
        ("", ["fly", "i", "need", "visa"]),
        ("to", ["kenya"]),
        ("from", ["nigeria"]),
    ]
    assert CLAUSE not in keys("flying to Kenya from Nigeria do I need a visa")


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("What is the capital of France?", "en"),
        ("Quelle est la capitale de la France ?", "fr"),
        ("wetin dey happen", "pcm"),
        ("¿Cómo estás? ¿Qué tal el día?", "es"),
        ("Как дела?", "script:CYRILLIC"),
        ("北京是什么", "script:CJK"),
        ("hello", "en"),  # short and nothing listed: English
        ("zxq wvy plk trn", "unknown"),  # four words, none listed
    ],
)
def test_the_language_is_named(text, language):
    assert canon(text).language == language


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("cats", "cat"),
        ("cities", "citi"),
        ("city", "citi"),
        ("buses", "bus"),  # irregular table
        ("running", "run"),
        ("hopping", "hop"),
        ("falling", "fall"),  # a soft double kept
        ("stopped", "stop"),
        ("agreed", "agreed"),  # -eed is no -ed
        ("making", "mak"),
        ("make", "mak"),
        ("bigger", "bigger"),  # never -er
        ("fastest", "fastest"),  # never -est
        ("children", "child"),
        ("go", "go"),  # two letters or less: as it is
        ("10th", "10th"),  # not all letters: as it is
        ("class", "class"),
        ("virus", "virus"),
    ],
)
def test_the_english_stemmer(word, expected):
    assert stem(word, french=False) == expected


def test_the_french_stemmer_cuts_plurals_and_a_final_e_only():
    assert [stem(w, french=True) for w in ("maisons", "prix", "belle", "mangeons", "bus")] == [
        "maison",
        "pri",
        "bell",
        "mangeon",
        "bus",
    ]


def test_automobile_is_a_car_in_english():
    assert same("How do I buy a car?", "How do I buy an automobile?")


def test_a_photo_is_a_picture():
    assert same("How do I crop a photo?", "How do I crop a picture?")


def test_chat_spellings_with_digits_read_as_their_words():
    assert same("see you b4 lunch", "see you before lunch")
    assert same("what is the weather 2day", "what is the weather today")


def test_full_width_latin_is_english():
    assert canon("Ｈｏｗ ｄｏ Ｉ ｃｏｏｋ ｒｉｃｅ?").language == "en"
