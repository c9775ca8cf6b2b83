"""The verifier: a semantic hit is allowed only when every difference between the two questions is
explained as one that cannot change the answer.

Sentence embeddings put "Is it safe to drink tap water in London?" beside "... unsafe ...", Celsius beside
Fahrenheit and "for children" beside the same question without it. So a candidate above the similarity
threshold is compared word by word, and the rule is inverted: nothing is a harmless difference unless this
module says why. Both texts are read into their canonical form (:mod:`cache.verify_read`: case, spelling,
contractions, framings, ignored words, numbers, stems, synonyms, phrases); two questions ask the same thing
when their words are the same multiset and their phrases are the same multiset ("not" anywhere in its
phrase). Before that, a word on one side only may still be explained by one on the other side only: a
British / American spelling, a typo (one edit, the same first letter, one of the two a dictionary word and
the other not), or a compound written apart. Anything else, a qualifier, another member of a kind, an
opposite, a quantifier, a modal, a tense, a number, a swapped role, is a miss that names its reason:
``words: +children on one side``, ``words: celsius vs fahrenheit``, ``numbers: 100 vs 1000``, ``order: ...``.

Texts the verifier does not compare (too long to read in full on the request's path, or verbatim text such
as code, or a quoted part spaced otherwise than by single spaces, where spacing and symbols matter) are never
semantic hits: :func:`semantic_allowed` says which.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from cache import verify_words as vw
from cache.dictionary import dictionary
from cache.verify_read import Canon, Token, canon, stem

# The longest text the verifier reads (characters): longer questions are served only by an exact hit, so
# the request's path never reads a huge text twice and a difference past the embedder's window still counts.
MAX_COMPARED_CHARS = 2000

_CODE = re.compile(
    r"```|`[^`\n]+`|\n[ \t]+\S|[{};]\s*(?:\n|$)|=>|->|==|!=|&&|\|\||::|"
    r"\b(?:def|function|return|const|var|print|echo)\s*\w*\(|(?:^|\n)\s*(?:import|from|#include|\$|>>>) |"
    r"\b(?:SELECT|INSERT|UPDATE|DELETE)\b|(?:[^\n]*\n){3}"
)

# A quoted part of a question, "...", '...', “...”, ‘...’ or «...»: what is asked about, verbatim. An opening
# quote starts the text or follows a space or an opening bracket, so that the apostrophes of "What's" and
# "the students' books" open nothing; inside '...' an apostrophe before a letter ("'it's late'") is kept.
QUOTED = re.compile(
    r"""(?<![^\s(\[{:])("[^"]*"|“[^”]*”|«[^»]*»|'(?:[^']|'(?=\w))*'(?!\w)|‘(?:[^’]|’(?=\w))*’(?!\w))"""
)
_QUOTES = frozenset("\"'“‘«")


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""  # why not, e.g. "words: celsius vs fahrenheit"


def semantic_allowed(text: str) -> bool:
    """Whether ``text`` may be answered by a semantic hit (and be embedded): not too long to compare in
    full, not verbatim text (code, indented lines, a quoted part's own spacing) where spacing and symbols
    carry meaning."""
    return len(text) <= MAX_COMPARED_CHARS and is_prose(text) and not spaced_quote(text)


def spaced_quote(text: str) -> bool:
    """Whether a quoted part of ``text`` is spaced otherwise than by single spaces between its words
    ("keep every space: 'a      b'"): its spacing is then part of what is asked, and the verifier, which
    compares words, cannot see it (issue 34, N12)."""
    if _QUOTES.isdisjoint(text):
        return False
    return any((inner := m.group()[1:-1]) != " ".join(inner.split()) for m in QUOTED.finditer(text))


# Every marker of ``_CODE`` needs one of these characters, a line that starts with one of the line
# markers, or an SQL keyword: text with none of them is prose without running the pattern (which tries
# each of its branches at every position: about 20 us for a one-line question, on the request's path).
_CODE_CHARS = frozenset("`\n{};=>&|:(")
_LINE_MARKERS = ("import ", "from ", "#include ", "$ ", ">>> ")
_SQL = ("SELECT", "INSERT", "UPDATE", "DELETE")


@lru_cache(maxsize=65536)
def is_prose(text: str) -> bool:
    """Text whose spacing does not matter: no code markers, no indented lines."""
    markers = not _CODE_CHARS.isdisjoint(text) or text.lstrip().startswith(_LINE_MARKERS)
    if not markers and not any(word in text for word in _SQL):
        return True
    return _CODE.search(text) is None


def verify(query: str, cached: str) -> Verdict:
    """Whether a cached answer to ``cached`` may answer ``query``."""
    if query == cached:
        return Verdict(True)
    for text in (query, cached):
        if len(text) > MAX_COMPARED_CHARS:
            return Verdict(False, f"length: {len(text)} characters (more than {MAX_COMPARED_CHARS} compared)")
        if not is_prose(text) or spaced_quote(text):
            return Verdict(
                False, "verbatim: code, indented text or spaced quotes are served only by an exact hit"
            )
    a, b = canon(query), canon(cached)
    if _family(a.language) != _family(b.language) and "unknown" not in (a.language, b.language):
        return Verdict(False, f"language: {a.language} vs {b.language}")
    if a.counts != b.counts:  # explanations are needed only where the words differ
        b = _explained(a, b)
        a = _explained(b, a)
    only_a, only_b = a.counts - b.counts, b.counts - a.counts
    # The asker's "my" on one side only ("reset my password" / "reset the password") asks the same.
    if only_a and not only_b and set(only_a) <= vw.POSSESSIVES:
        a, only_a = _without(a, vw.POSSESSIVES), Counter()
    elif only_b and not only_a and set(only_b) <= vw.POSSESSIVES:
        b, only_b = _without(b, vw.POSSESSIVES), Counter()
    if only_a or only_b:
        return Verdict(False, _difference(sorted(only_a.elements()), sorted(only_b.elements())))
    if _phrase_set(a) != _phrase_set(b):
        return Verdict(False, f"order: {_show(a)} vs {_show(b)}")
    return Verdict(True)


def _without(c: Canon, keys: frozenset[str]) -> Canon:
    return Canon(
        c.language, tuple((lead, tuple(t for t in ws if t.key not in keys)) for lead, ws in c.phrases)
    )


def _family(language: str) -> str:
    # Nigerian Pidgin is told from English by a few words ("abeg", "wetin") that a question may or may not
    # carry; the words themselves are compared, so the two are one family here.
    return "en" if language == "pcm" else language


# --- explaining differences ----------------------------------------------------------------------------


def _explained(a: Canon, b: Canon) -> Canon:
    """``b`` with each word that is on its side only, and is a spelling, a typo or a split compound of a
    word on ``a``'s side only, rewritten as that word."""
    only_a, only_b = a.keys() - b.keys(), b.keys() - a.keys()
    if not only_a or not only_b:
        return b
    a_words = {t.key: t for t in a.tokens if t.key in only_a}
    rename: dict[str, str] = {}
    for token in b.tokens:
        if token.key not in only_b or token.key in rename:
            continue
        for key, mine in a_words.items():
            if key not in rename.values() and (_spelling(mine.surface, token.surface) or _typo(mine, token)):
                rename[token.key] = key
                break
    joined = _compounds(a_words, b, only_b)
    if not rename and not joined:
        return b
    phrases = []
    for lead, tokens in b.phrases:
        out: list[Token] = []
        skip = False
        for i, token in enumerate(tokens):
            if skip:
                skip = False
                continue
            if i + 1 < len(tokens) and (token.key, tokens[i + 1].key) in joined:
                out.append(Token(joined[token.key, tokens[i + 1].key], token.surface + tokens[i + 1].surface))
                skip = True
            else:
                out.append(Token(rename.get(token.key, token.key), token.surface))
        phrases.append((lead, tuple(out)))
    return Canon(b.language, tuple(phrases))


def _compounds(a_words: dict[str, Token], b: Canon, only_b: Counter[str]) -> dict[tuple[str, str], str]:
    """Two neighbouring words of ``b``, both on its side only, that write one word of ``a`` apart."""
    surfaces = {t.surface: t.key for t in a_words.values()}
    found = {}
    for _, tokens in b.phrases:
        for x, y in itertools.pairwise(tokens):
            if x.key in only_b and y.key in only_b and x.surface + y.surface in surfaces:
                found[x.key, y.key] = surfaces[x.surface + y.surface]
    return found


_SPELLING_RULES = (
    (re.compile(r"our(?=s?$|ite|able|ful|ed|ing|er)"), "or"),  # colour, favourite, labour
    (re.compile(r"is(?=e[sdr]?s?$|ing$|ation)"), "iz"),  # organise, organisation, fertiliser
    (re.compile(r"ys(?=e[sd]?$|ing$)"), "yz"),  # analyse
    (re.compile(r"tre(?=s?$)"), "ter"),  # centre, litre, metre
    (re.compile(r"(?<=[aeiou])ll(?=ed|ing|er|or)"), "l"),  # travelled, cancelling, jeweller
    (re.compile(r"ogue$"), "og"),  # catalogue
    (re.compile(r"ence$"), "ense"),  # defence, licence
    (re.compile(r"amme$"), "am"),  # programme
    (re.compile(r"ae|oe(?=[^s]|$)"), "e"),  # anaemia, oestrogen
    (re.compile(r"yre$"), "ire"),  # tyre
)


def _spelling(x: str, y: str) -> bool:
    """British and American spellings of one word."""
    if x == y or len(x) < 4 or len(y) < 4:
        return x == y
    return _american(x) == _american(y)


@lru_cache(maxsize=65536)
def _american(word: str) -> str:
    for pattern, american in _SPELLING_RULES:
        word = pattern.sub(american, word)
    return word


def _typo(a: Token, b: Token) -> bool:
    """One edit apart (a letter added, dropped, changed or two swapped), the same first letter, and one of
    them a known word while the other is not (two real words are two words: cache/dictionary.py)."""
    x, y = a.surface, b.surface
    if min(len(x), len(y)) < 3 or max(len(x), len(y)) < 4 or x[0] != y[0] or not (x + y).isalpha():
        return False
    if not _one_edit(x, y):
        return False
    words = dictionary()
    return len(words) > 0 and (x in words) != (y in words)


def _one_edit(x: str, y: str) -> bool:
    if abs(len(x) - len(y)) > 1 or x == y:
        return False
    if len(x) == len(y):
        diff = [i for i in range(len(x)) if x[i] != y[i]]
        return len(diff) == 1 or (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and x[diff[0]] == y[diff[1]]
            and x[diff[1]] == y[diff[0]]
        )
    short, long = (x, y) if len(x) < len(y) else (y, x)
    i = next((i for i in range(len(short)) if short[i] != long[i]), len(short))
    return short[i:] == long[i + 1 :]


def _difference(only_a: list[str], only_b: list[str]) -> str:
    both = only_a + only_b
    if any(w[:1].isdigit() for w in both):
        kind = "numbers"
    elif any(w in vw.NEGATION_CUES for w in both):
        kind = "negation"
    elif any(w in _UNIT_STEMS for w in both):
        kind = "units"
    else:
        kind = "words"
    if only_a and only_b:
        return f"{kind}: {' '.join(only_a)} vs {' '.join(only_b)}"
    return f"{kind}: +{' '.join(only_a or only_b)} on one side"


_UNIT_STEMS = frozenset(stem(w, False) for w in vw.UNIT_WORDS) | vw.UNIT_WORDS


def _phrase_set(c: Canon) -> Counter[tuple[str, tuple[str, ...]]]:
    """Each phrase's opening word and words in order, "not" apart: where it stands in its phrase does not
    change what it negates (why doesn't my phone charge / why does my phone not charge)."""
    out: Counter[tuple[str, tuple[str, ...]]] = Counter()
    for lead, tokens in c.phrases:
        keys = [t.key for t in tokens]
        negations = [k for k in keys if k == "not"]
        out[lead, tuple(k for k in keys if k != "not") + tuple(negations)] += 1
    return out


def _show(c: Canon) -> str:
    return " | ".join(
        " ".join(([lead] if lead else []) + [t.key for t in tokens]) for lead, tokens in c.phrases
    )
