"""The one SSE reader (nearshore/protocol/sse.py): the same events however the body is cut, line ends,
comments, fields, multi-line data, an unfinished last event, and the broken streams the stand-ins send."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nearshore.protocol import sse
from nearshore.protocol.sse import SseParser, event_data, iter_data, odd_line, parse

PINNED = json.loads((Path(__file__).parent / "answer_bytes.json").read_text())
STREAM = PINNED["region_chat_content_logprobs"].encode() + PINNED["edge_cache_chat_stream_usage"].encode()


def fed(*pieces: bytes) -> list[bytes]:
    """What a parser fed ``pieces`` returns, the unfinished last event left out (as the spec reads it)."""
    parser = SseParser()
    return [data for piece in pieces for data in parser.feed(piece)]


def test_a_region_stream_reads_as_its_payloads():
    datas = parse(STREAM)
    assert datas[-1] == sse.DONE_DATA and len(datas) == 1 + 11
    assert [json.loads(d)["object"] for d in datas[:-1]] == ["chat.completion.chunk"] * 11
    assert datas[0] == STREAM[6 : STREAM.index(b"\n\n")]


def test_cut_at_every_byte_the_same_events_come_out():
    whole = fed(STREAM)
    for cut in range(len(STREAM) + 1):
        assert fed(STREAM[:cut], STREAM[cut:]) == whole, cut
    assert fed(*(STREAM[i : i + 1] for i in range(len(STREAM)))) == whole


def test_crlf_line_ends_cut_at_every_byte_read_the_same():
    crlf = STREAM.replace(b"\n", b"\r\n")
    whole = fed(STREAM)
    for cut in range(len(crlf) + 1):
        assert fed(crlf[:cut], crlf[cut:]) == whole, cut
    assert fed(*(crlf[i : i + 1] for i in range(len(crlf)))) == whole


def test_comments_fields_and_extra_blank_lines_are_skipped():
    body = (
        b": keep-alive\n\n"
        b"event: message\nid: 7\nretry: 100\ndata: one\n\n"
        b"\n\n\n"
        b":only a comment\n\n"
        b"id: 8\n\n"  # no data: no event
        b"data: two\n: inside\n\n"
    )
    assert fed(body) == [b"one", b"two"]


def test_multi_line_data_joins_with_newlines_and_one_space_comes_off():
    assert fed(b'data: {\ndata:   "a": 1\ndata:}\n\n') == [b'{\n  "a": 1\n}']
    assert fed(b"data:x\n\n", b"data:  x\n\n", b"data\n\n", b"data:\n\n") == [b"x", b" x", b"", b""]


def test_an_unfinished_last_event_is_dropped_by_feed_and_given_by_close():
    parser = SseParser()
    assert parser.feed(b"data: a\n\ndata: [DONE]") == [b"a"]
    assert parser.pending == len(b"data: [DONE]")
    assert parser.close() == b"[DONE]" and parser.pending == 0
    assert parse(b"data: a\n\ndata: [DONE]\n") == [b"a", b"[DONE]"]
    assert parse(b"data: a\n\ndata: b\r") == [b"a", b"b"]  # a held-back \r ended the last line
    assert parse(b"data: a\n\n: bye") == [b"a"] and parse(b"") == []


def test_a_lone_carriage_return_is_kept_as_every_reader_kept_it():
    assert fed(b"data: a\rb\n\n") == [b"a\rb"]
    assert fed(b"data: a\r", b"b\n\n") == [b"a\rb"]


def test_the_stand_ins_broken_streams():
    # no-newline: a line that never ends is one pending event, never returned.
    parser = SseParser()
    assert parser.feed(b"data: ") == [] and parser.feed(b"a" * 65536) == []
    assert parser.pending == 6 + 65536
    # truncated-json and malformed-chunk: the bytes come out as sent; the reader's JSON decoder judges.
    assert fed(b'data: {"id": "x", "choi\n\n' + sse.DONE) == [b'{"id": "x", "choi', b"[DONE]"]
    assert fed(b"data: {not json\n\n", b'data: {"foo": 1}\n\n') == [b"{not json", b'{"foo": 1}']


def test_event_data_and_odd_line():
    assert event_data(b"data: x") == b"x" and event_data(b": c") is None and event_data(b"") is None
    assert event_data(b"\ndata: x\n") == b"x"  # a block between three newlines
    assert odd_line(b"data: x\nevent: e\nid: 1\nretry: 5\n: c") is None
    assert odd_line(b"data: x\nnonsense") == b"nonsense"


async def _pieces(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def test_iter_data_reads_lines_or_any_pieces():
    lines = STREAM.splitlines(keepends=True)  # as aiohttp's response.content yields them
    assert [d async for d in iter_data(_pieces(*lines))] == parse(STREAM)
    cut = [STREAM[i : i + 5] for i in range(0, len(STREAM), 5)]
    assert [d async for d in iter_data(_pieces(*cut))] == parse(STREAM)
    assert [d async for d in iter_data(_pieces(b"data: a\n", b"\n", b"data: b"))] == [b"a", b"b"]


# Data without line ends, that does not start with a space (which the reader takes off).
_data = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"").lstrip(b" "))


@given(
    events=st.lists(st.lists(_data, min_size=1, max_size=3), max_size=6),
    crlf=st.booleans(),
    comments=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
)
def test_any_events_framed_any_way_and_cut_anywhere_read_back(
    events: list[list[bytes]], crlf: bool, comments: bool, cuts: list[int]
):
    end = b"\r\n" if crlf else b"\n"
    body = b""
    for lines in events:
        if comments:
            body += b": note" + end
        body += b"".join(b"data: " + line + end for line in lines) + end
    points = sorted({min(c, len(body)) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    assert fed(*pieces) == [b"\n".join(lines) for lines in events]


def test_one_line_data_reads_a_whole_one_line_event_and_nothing_else():
    parser = sse.SseParser()
    assert parser.one_line_data(b'data: {"a": 1}\n\n') == b'{"a": 1}'
    assert parser.one_line_data(b"data:[DONE]\n\n") == b"[DONE]"
    assert parser.one_line_data(b"data:  padded \r\n\n") == b"padded"  # as blocks() then strip() read it
    for piece in (
        b": a comment\n\n",
        b"event: x\n\n",
        b"data: a\ndata: b\n\n",  # two lines
        b"data: a\n\ndata: b\n\n",  # two events
        b"data: a\n",  # not ended
        b"data: a",
        b"data: a\r\n\r\n",  # CRLF line ends: the parser's to read
    ):
        assert parser.one_line_data(piece) is None, piece
    assert parser.blocks(b"data: unfin") == []  # something unfinished is held: no piece is whole alone
    assert parser.one_line_data(b"data: b\n\n") is None
    assert parser.blocks(b"ished\n\n") == [b"data: unfinished"]
    assert parser.one_line_data(b"data: b\n\n") == b"b"
