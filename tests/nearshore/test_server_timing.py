"""The one reader of ``Server-Timing``: every part by name, and one part's duration in seconds."""

from __future__ import annotations

import pytest

from nearshore.protocol.server_timing import duration_s, parse_server_timing


def test_every_part_with_a_duration_by_name():
    header = 'edge;dur=0.41, ttft;desc="first token";dur=12, cache, queue;dur=x, prefill;dur=3.5'
    assert parse_server_timing(header) == {"edge": 0.41, "ttft": 12.0, "prefill": 3.5}
    assert parse_server_timing("") == {}


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("tokenize;dur=0.4, grammar;dur=1400.0, queue;dur=0.1", 1.4),
        ("queue;dur=0.1", 0.0),
        ("", 0.0),
        ("grammar;dur=abc", 0.0),
        ("grammar;dur=-5", 0.0),
        ("grammar;dur=nan", 0.0),
        ("grammar;dur=inf", 0.0),
        ("grammars;dur=9, grammar", 0.0),
    ],
)
def test_one_part_in_seconds_and_nothing_that_is_not_a_finite_positive_duration(header: str, seconds: float):
    assert duration_s(header, "grammar") == pytest.approx(seconds)
