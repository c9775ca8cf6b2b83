"""A prompt as segments: the template's own markers, tokenized with control tokens, and the caller's text,
tokenized as plain text, so that ``<start_of_turn>`` typed in a message stays text and cannot forge a turn.

Shared by the region (which tokenizes prompts) and the edge (which counts their tokens the same way).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple


class Segment(NamedTuple):
    text: str
    # True: the template's markers, or a completions prompt the caller owns whole (control tokens such as
    # <start_of_turn> are parsed); False: message content, always plain text.
    special: bool


def joined(segments: Iterable[Segment]) -> str:
    return "".join(s.text for s in segments)


def merged(segments: Iterable[Segment]) -> list[Segment]:
    """Adjacent segments of the same kind as one, without empty ones: text between two control tokens is
    then tokenized in one go, exactly as it was when the whole prompt was one string."""
    out: list[Segment] = []
    for segment in segments:
        if not segment.text:
            continue
        if out and out[-1].special == segment.special:
            out[-1] = Segment(out[-1].text + segment.text, segment.special)
        else:
            out.append(segment)
    return out


def utf8_length(segments: Iterable[Segment]) -> int:
    return sum(len(s.text.encode("utf-8", "surrogatepass")) for s in segments)


# llama.cpp's tokenizer is superlinear on some texts (196 KB of "user\n" costs 6 s in one call, 0.4 s as
# 48 KB): long texts are tokenized in pieces, which also lets a count stop once past the context window.
PIECE_CHARS = 2048


def text_pieces(text: str, max_chars: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in pieces of at most ``max_chars``, cut where no token spans the cut, so that the pieces'
    tokens are the whole text's.

    Preferred cut: after a newline that stands alone between two characters other than whitespace (no
    token of Gemma's vocabulary holds a newline followed by anything but newlines, and no control token
    holds a newline; a GPT-2-style vocabulary such as SmolLM2's holds a newline followed by an indent, and
    its pre-tokenizer reads a run of whitespace that ends a text whole but one before a letter less its last
    character, so only a lone newline between two non-spaces is a cut it sees the same on both sides).
    Else before a space that follows a character other than whitespace (Gemma's tokens start at a space,
    never end before one; one user-defined token, "> </", is the exception; GPT-2's pre-tokenizer splits
    there too). Else, a text of ``max_chars`` with neither is cut where it must be: its tokens may then
    differ from the whole text's at that point, and only there.
    """
    start = 0
    while len(text) - start > max_chars:
        end = start + max_chars
        cut = _last_newline_cut(text, start, end)
        if cut <= start:
            cut = _last_space_cut(text, start, end)
        if cut <= start:
            cut = end
        yield text[start:cut]
        start = cut
    yield text[start:]


def _last_newline_cut(text: str, start: int, end: int) -> int:
    i = text.rfind("\n", start, end)
    while i > start:
        if not text[i + 1].isspace() and not text[i - 1].isspace():
            return i + 1
        i = text.rfind("\n", start, i)
    return -1


def _last_space_cut(text: str, start: int, end: int) -> int:
    i = text.rfind(" ", start + 1, end)
    while i > start:
        if not text[i - 1].isspace():
            return i
        i = text.rfind(" ", start + 1, i)
    return -1
