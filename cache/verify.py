"""The verifier: a semantic hit must say the same thing, not merely sound alike.

Sentence embeddings put "Is it safe to drink tap water in London?" and "... unsafe ..." at cosine 0.99,
Celsius->Fahrenheit beside Fahrenheit->Celsius, 100 dollars beside 1000. So after the similarity threshold a
candidate must pass cheap structural checks, each of which names why it failed:

numbers   the same numbers (digits, number words, 10k / 1.5m), in the same order
negation  the same negation cues (not, never, no, n't, without, ...) and no word that is the other's
          word with a negating prefix (safe / unsafe, legal / illegal)
entities  the same capitalised names and acronyms (London / Paris, USD / EUR)
units     the same units of measure and currencies, in the same order (Celsius -> Fahrenheit)
direction the same direction and comparison words (to / from, before / after, more / less, buy / sell)
          and, when a sentence has "from X to Y", the same X and Y in that order
dates     the same years, months, weekdays and relative days (today, tomorrow, next, last)
language  the same language (script, and the common words of a few languages)

A check is a comparison of small sets extracted once per text (microseconds), so it runs on every hit.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*|[$€£¥₦%°]", re.UNICODE)
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)*)\s*([kKmMbB]n?|thousand|million|billion|%)?(?![\w])")

_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40,
    "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000,
    "million": 1_000_000, "billion": 1_000_000_000, "half": 0.5, "dozen": 12, "first": "1st", "second": "2nd",
    "third": "3rd", "once": 1, "twice": 2, "double": 2, "triple": 3,
}  # fmt: skip
_SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "mn": 1e6, "million": 1e6, "b": 1e9, "bn": 1e9, "billion": 1e9}

_NEGATIONS = _set(
    "not no never none nobody nothing nowhere neither nor without cannot cant can't won't don't doesn't "
    "didn't isn't aren't wasn't weren't shouldn't wouldn't couldn't mustn't hasn't haven't hadn't n't "
    "ne pas nie kein keine nicht nunca nada sin jamais"
)
_NEGATING_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non", "non-", "mis", "a")

_DIRECTION_WORDS = _set(
    "into onto before after above below over under more less most least higher lower bigger smaller "
    "larger greater fewer increase decrease increases decreases rise fall up down buy sell buying selling "
    "import export imports exports north south east west northern southern eastern western left right "
    "first last earliest latest maximum minimum max min older younger oldest youngest faster slower "
    "cheaper dearer expensive cheap hot cold warmer colder heavier lighter longer shorter inbound outbound "
    "send receive sent received borrow lend lent win lose won lost add subtract plus minus multiply divide "
    "vs versus than between"
)
_UNITS = {
    "celsius": "°C", "centigrade": "°C", "°c": "°C", "c°": "°C", "fahrenheit": "°F", "°f": "°F",
    "kelvin": "K",
    "km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km", "kilometres": "km",
    "mile": "mi", "miles": "mi", "mi": "mi", "meter": "m", "meters": "m", "metre": "m", "metres": "m",
    "foot": "ft", "feet": "ft", "ft": "ft", "inch": "in", "inches": "in", "cm": "cm", "centimeter": "cm",
    "centimeters": "cm", "mm": "mm", "yard": "yd", "yards": "yd",
    "kg": "kg", "kilogram": "kg", "kilograms": "kg", "kilo": "kg", "kilos": "kg", "gram": "g", "grams": "g",
    "g": "g", "pound": "lb", "pounds": "lb", "lb": "lb", "lbs": "lb", "ounce": "oz", "ounces": "oz",
    "oz": "oz",
    "ton": "t", "tons": "t", "tonne": "t", "tonnes": "t",
    "liter": "l", "liters": "l", "litre": "l", "litres": "l", "gallon": "gal", "gallons": "gal",
    "ml": "ml", "cup": "cup", "cups": "cup",
    "second": "s", "seconds": "s", "minute": "min", "minutes": "min", "hour": "h", "hours": "h", "day": "d",
    "days": "d", "week": "wk", "weeks": "wk", "month": "mo", "months": "mo", "year": "yr", "years": "yr",
    "mph": "mph", "kph": "kph", "kmh": "kph", "byte": "B", "bytes": "B", "kb": "kB", "mb": "MB", "gb": "GB",
    "tb": "TB", "watt": "W", "watts": "W", "kw": "kW", "kwh": "kWh", "volt": "V", "volts": "V",
    "percent": "%", "%": "%", "$": "USD", "usd": "USD", "dollar": "USD", "dollars": "USD", "€": "EUR",
    "eur": "EUR", "euro": "EUR", "euros": "EUR", "£": "GBP", "gbp": "GBP", "sterling": "GBP", "¥": "JPY",
    "yen": "JPY", "jpy": "JPY", "₦": "NGN", "naira": "NGN", "ngn": "NGN", "cedi": "GHS", "cedis": "GHS",
    "rand": "ZAR", "zar": "ZAR", "shilling": "KES", "shillings": "KES", "kes": "KES", "yuan": "CNY",
    "rupee": "INR", "rupees": "INR", "bitcoin": "BTC", "btc": "BTC",
}  # fmt: skip
_DATE_WORDS = _set(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec "
    "monday tuesday wednesday thursday friday saturday sunday today tomorrow yesterday tonight "
    "morning evening weekend next last ago previous upcoming"
)
# A few languages' commonest words, to tell them apart (other scripts are told apart by script).
_LANGUAGE_WORDS = {
    "en": _set("the is are what how why who which of and to in it for you do does can"),
    "fr": _set("le la les est sont quel quelle comment pourquoi qui des et en pour vous une un du"),
    "es": _set("el la los las es son qué cómo por qué quién de y en para usted una un del"),
    "de": _set("der die das ist sind was wie warum wer und in für sie ein eine nicht mit"),
    "pt": _set("o a os as é são que como por quem de e em para você uma um do da"),
    "yo": _set("ni ti kò jẹ́ bí wo ṣe fún àti"),
    "sw": _set("ni na ya wa kwa la za katika je nini gani"),
}
_FILLER = _set(
    "i a an the please can could would you tell me what whats what's is are was were do does how much many "
    "of for in on at by with about my your our it this that these those be to"
)


@dataclass(frozen=True, slots=True)
class Facts:
    """What one text asserts, in the forms the checks compare."""

    numbers: tuple[str, ...]
    negations: frozenset[str]
    words: frozenset[str]
    entities: frozenset[str]
    units: tuple[str, ...]
    directions: frozenset[str]
    from_to: tuple[str, ...]
    dates: frozenset[str]
    language: str


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""  # which check failed, e.g. "numbers: 100 vs 1000"


@lru_cache(maxsize=65536)
def facts(text: str) -> Facts:
    text = unicodedata.normalize("NFKC", text)
    tokens = _WORD.findall(text)
    lower = [t.lower().replace("’", "'") for t in tokens]
    words = frozenset(lower)
    negations = frozenset(w for w in lower if w in _NEGATIONS or w.endswith("n't"))
    numbers = _numbers(text, lower)
    entities = frozenset(_entities(tokens))
    units = tuple(_UNITS[w] for w in lower if w in _UNITS and w not in ("second", "may"))
    directions = frozenset(w for w in lower if w in _DIRECTION_WORDS)
    dates = frozenset(w for w in lower if w in _DATE_WORDS and w != "may") | frozenset(
        n for n in numbers if len(n) == 4 and n.isdigit() and 1000 < int(n) < 2200
    )
    return Facts(
        numbers=numbers,
        negations=negations,
        words=words,
        entities=entities,
        units=units,
        directions=directions,
        from_to=_from_to(lower),
        dates=dates,
        language=_language(text, lower),
    )


def verify(query: str, cached: str) -> Verdict:
    """Whether a cached answer to ``cached`` may answer ``query``."""
    a, b = facts(query), facts(cached)
    if a.language != b.language:
        return Verdict(False, f"language: {a.language} vs {b.language}")
    if a.numbers != b.numbers:
        return Verdict(False, f"numbers: {' '.join(a.numbers) or '-'} vs {' '.join(b.numbers) or '-'}")
    if a.negations != b.negations:
        return Verdict(False, f"negation: {sorted(a.negations)} vs {sorted(b.negations)}")
    antonym = _prefixed_antonym(a.words, b.words)
    if antonym:
        return Verdict(False, f"negation: {antonym}")
    # A name must be in the other text too, capitalised or not ("france" asks about France).
    missing = (a.entities - b.words) | (b.entities - a.words)
    if missing:
        return Verdict(False, f"entities: {sorted(missing)}")
    if a.units != b.units:
        return Verdict(False, f"units: {' '.join(a.units) or '-'} vs {' '.join(b.units) or '-'}")
    if a.directions != b.directions:
        return Verdict(False, f"direction: {sorted(a.directions ^ b.directions)}")
    if a.from_to != b.from_to:
        return Verdict(False, f"direction: {a.from_to} vs {b.from_to}")
    if a.dates != b.dates:
        return Verdict(False, f"dates: {sorted(a.dates ^ b.dates)}")
    return Verdict(True)


def _numbers(text: str, lower: list[str]) -> tuple[str, ...]:
    found: list[tuple[int, str]] = []
    for m in _NUMBER.finditer(text):
        digits = m.group(1).replace(",", "")
        if digits.count(".") > 1:
            digits = m.group(1)  # a version or a date: keep as written
        scale = (m.group(2) or "").lower()
        try:
            value = float(digits) * _SCALE.get(scale, 1.0)
            normal = f"{value:g}" if value < 1e15 else digits
        except ValueError:
            normal = digits
        if scale == "%":
            normal += "%"
        found.append((m.start(), normal))
    for position, word in enumerate(lower):  # number words, after the digits (their order among themselves)
        if word in _NUMBER_WORDS:
            found.append((10**9 + position, str(_NUMBER_WORDS[word])))
    return tuple(n for _, n in sorted(found))


def _entities(tokens: list[str]) -> list[str]:
    """Capitalised words not at a sentence start, and acronyms anywhere, casefolded."""
    out = []
    sentence_start = True
    for token in tokens:
        if token in (".", "?", "!"):
            sentence_start = True
            continue
        acronym = len(token) > 1 and token.isupper() and token.isalpha()
        if acronym or (token[:1].isupper() and not sentence_start and token.casefold() not in _FILLER):
            out.append(token.casefold())
        sentence_start = False
    return out


def _from_to(lower: list[str]) -> tuple[str, ...]:
    """Which way a comparison or a move goes: the words after "from" and "to"/"into" when the text has a
    "from", and after "vs"/"versus"/"than"."""
    has_from = "from" in lower
    out = []
    for i, w in enumerate(lower[:-1]):
        if w in ("vs", "versus", "than") or (has_from and w in ("from", "to", "into")):
            out.append(f"{w}:{lower[i + 1]}")
    return tuple(out)


def _prefixed_antonym(a: frozenset[str], b: frozenset[str]) -> str:
    only_a, only_b = a - b, b - a
    for x, y in ((only_a, only_b), (only_b, only_a)):
        for word in x:
            for prefix in _NEGATING_PREFIXES:
                if word.startswith(prefix) and len(word) - len(prefix) >= 3 and word[len(prefix) :] in y:
                    return f"{word} vs {word[len(prefix) :]}"
    return ""


def _language(text: str, lower: list[str]) -> str:
    scripts = {unicodedata.name(ch, "?").split()[0] for ch in text if ch.isalpha()}
    scripts.discard("LATIN")
    if scripts:
        return "script:" + "+".join(sorted(scripts))
    best, best_count = "en", 0
    for language, common in _LANGUAGE_WORDS.items():
        count = sum(1 for w in lower if w in common)
        if count > best_count:
            best, best_count = language, count
    return best
