"""The verifier's checks on what issue 10's evaluation found: opposites one on each side, swapped roles
(from / to, than, the order of names), numbers stuck to units, things of one kind, and the paraphrases that
the first version turned down (every form of "not", greetings, possessives, hyphens, determiners)."""

from __future__ import annotations

import pytest

from cache.verify import facts, verify


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        ("Which fruits are good for diabetics?", "Which fruits are bad for diabetics?", "negation"),
        ("Is it true that vaccines cause autism?", "Is it false that vaccines cause autism?", "negation"),
        ("Which snakes in Kenya are venomous?", "Which snakes in Kenya are non-venomous?", "negation"),
        (
            "Is it normal to feel tired after a vaccine?",
            "Is it abnormal to feel tired after a vaccine?",
            "negation",
        ),
        ("How do I enable dark mode on my iPhone?", "How do I disable dark mode on my iPhone?", "negation"),
        ("How do I turn on Bluetooth on my laptop?", "How do I turn off Bluetooth on my laptop?", "negation"),
        ("How can I make my hair grow?", "How can I make my hair stop growing?", "negation"),
        ("How do I activate my SIM card?", "How do I deactivate my SIM card?", "negation"),
        ("What are the strengths of a democracy?", "What are the weaknesses of a democracy?", "negation"),
        (
            "How do I move files from my phone to my laptop?",
            "How do I move files from my laptop to my phone?",
            "direction",
        ),
        (
            "Why are men taller than women on average?",
            "Why are women taller than men on average?",
            "direction",
        ),
        ("Is Abuja east or west of Lagos?", "Is Lagos east or west of Abuja?", "direction"),
        ("How do I convert a PDF to Word?", "How do I convert a Word document to PDF?", "direction"),
        (
            "Which is healthier, brown rice or white rice?",
            "Which is less healthy, brown rice or white rice?",
            "direction",
        ),
        ("What is the hottest month in Lagos?", "What is the coldest month in Lagos?", "direction"),
        ("How do I upload photos to iCloud?", "How do I download photos from iCloud?", "direction"),
        ("How much does a 50kg bag of rice cost?", "How much does a 25kg bag of rice cost?", "numbers"),
        ("Explain the 2nd law of thermodynamics.", "Explain the 1st law of thermodynamics.", "numbers"),
        ("What is the second largest city in Kenya?", "What is the 3rd largest city in Kenya?", "numbers"),
        ("How do I treat a dog with fleas?", "How do I treat a cat with fleas?", "entities"),
        ("What are the side effects of paracetamol?", "What are the side effects of ibuprofen?", "entities"),
        ("How do I install a ceiling fan?", "How do I repair a ceiling fan?", "entities"),
        ("How many teaspoons are in a tablespoon?", "How many tablespoons are in a teaspoon?", "units"),
        ("Convert 100 km/h to mph", "Convert 100 mph to km/h", "units"),
        ("What are the school holidays in spring?", "What are the school holidays in autumn?", "dates"),
        ("Tell me about Nelson Mandela.", "Niambie kuhusu Nelson Mandela.", "language"),
        ("what is the capital of kenya", "what is the capital of uganda", "entities"),
        ("translate hello to french", "translate hello to spanish", "entities"),
        ("How do I cook yam porridge?", "How do I reheat yam porridge?", "entities"),
        ("How do I write a CV?", "How do I read a CV?", "entities"),
        ("What is 8 + 7?", "What is 8 - 7?", "numbers"),
        ("Is it -3 degrees in Johannesburg?", "Is it 3 degrees in Johannesburg?", "numbers"),
        ("Is 9am a good time for a meeting?", "Is 9pm a good time for a meeting?", "direction"),
        ("How do I cook rice?", "Jinsi ya kupika wali?", "language"),
    ],
)
def test_hard_negatives_found_by_the_evaluation_fail_and_say_why(a, b, why):
    verdict = verify(a, b)
    assert not verdict.ok and verdict.reason.startswith(why), verdict


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Why can't my laptop connect to Wi-Fi?", "Why cannot my laptop connect to Wi-Fi?"),
        ("Why doesn't my phone charge?", "Why does my phone not charge?"),
        (
            "Which African countries have no access to the sea?",
            "Which African countries do not have access to the sea?",
        ),
        ("Good morning! How do I make a budget?", "How do I make a budget?"),
        ("Which is the longest river in Africa?", "What is Africa's longest river?"),
        ("how does mpesa work", "How does M-Pesa work?"),
        ("how far is the moon from earth", "How far is the Moon from the Earth?"),
        ("Lagos to Abuja distance", "What is the distance from Lagos to Abuja?"),
        ("How do I recieve money on PayPal?", "How do I receive money on PayPal?"),
        ("What is the best way to learn Python?", "What's the most effective way to learn Python?"),
        ("Tell me a fun fact about elephants.", "Give me an interesting fact about elephants."),
        ("Where did jazz music originate?", "What is the origin of jazz music?"),
        ("How do I install Python on Windows?", "How can I set up Python on a Windows computer?"),
        ("How do I reboot my router?", "How do I restart my router?"),
        ("Is 1.5m naira a good salary?", "Is 1.5 million naira a good salary?"),
        ("What is 10k in naira?", "What is 10,000 in naira?"),
        ("Is the 10-day forecast reliable?", "Is the 10 day forecast reliable?"),
        ("What is 5+3?", "What is 5 + 3?"),
        ("How do I cook jollof rice?", "How do I prepare jollof rice?"),
        ("How far is Lagos from Abuja?", "how far is lagos from abuja"),
    ],
)
def test_paraphrases_the_first_verifier_turned_down_pass(a, b):
    assert verify(a, b).ok, verify(a, b)


def test_facts_read_units_ordinals_roles_and_languages():
    f = facts("Send 50kg from my farm to the Lagos market on the 2nd of June")
    assert f.numbers == ("50", "2nd") and f.units == ("kg",)
    assert f.sources == {"farm"} and f.targets == {"lagos"} and "june" in f.dates
    assert facts("Quelle est la capitale de la France ?").language == "fr"
    assert facts("jollof rice recipe").language == "en"
    assert facts("日本の首都はどこですか").language.startswith("script:")
