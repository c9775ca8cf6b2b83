"""The load report's wire format (nearshore/protocol/load.py): what a region writes, an edge reads back;
whatever a broken or lying region sends, parsing never raises and never yields a value out of range."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nearshore.protocol.load import MAX_HEADER_CHARS, LoadReport, format_load, parse_load


def in_range(report: LoadReport) -> bool:
    counts = (report.running, report.waiting, report.capacity, report.max_choices)
    return (
        report.state in ("ready", "loading", "unloaded", "failed")
        and all(0 <= n <= 1_000_000 for n in counts)
        and 0.0 <= report.kv_usage <= 1.0
        and 0.0 <= report.tokens_per_s <= 1e9
        and 0.0 <= report.prefill_ms_per_token <= 1e4
        and math.isfinite(report.kv_usage)
        and math.isfinite(report.tokens_per_s)
        and math.isfinite(report.prefill_ms_per_token)
    )


@pytest.mark.parametrize(
    "report",
    [
        LoadReport(),
        LoadReport(state="loading"),
        LoadReport(state="failed", running=0, waiting=0, capacity=0),
        LoadReport(state="unloaded", running=3, waiting=17, capacity=8, kv_usage=0.41, tokens_per_s=212.5),
        LoadReport(running=1_000_000, waiting=1_000_000, capacity=256, kv_usage=1.0, tokens_per_s=1e9),
        LoadReport(running=2, capacity=16, max_choices=80),
        LoadReport(running=1, prefill_ms_per_token=2.857),
        LoadReport(prefill_ms_per_token=0.0125),
    ],
)
def test_format_then_parse_gives_the_report_back(report: LoadReport):
    header = format_load(report)
    assert len(header) <= MAX_HEADER_CHARS
    assert parse_load(header) == report


def test_the_report_is_one_short_header_line():
    header = format_load(LoadReport(running=3, waiting=1, capacity=8, kv_usage=0.41, tokens_per_s=212.5))
    assert header == "state=ready; running=3; waiting=1; capacity=8; kv=0.410; tps=212.5; choices=0; pft=0"
    assert "\n" not in header and "\r" not in header


def test_the_report_is_plain_json_for_health():
    report = LoadReport(running=2, capacity=8, kv_usage=0.5, tokens_per_s=10.0)
    assert msgspec.to_builtins(report) == {
        "state": "ready",
        "running": 2,
        "waiting": 0,
        "capacity": 8,
        "kv_usage": 0.5,
        "tokens_per_s": 10.0,
        "max_choices": 0,
        "prefill_ms_per_token": 0.0,
    }


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("running=-5; waiting=-1; capacity=-8", LoadReport()),
        ("kv=-0.5; tps=-100", LoadReport()),
        ("kv=nan; tps=nan", LoadReport()),
        ("kv=inf; tps=inf", LoadReport(kv_usage=1.0, tokens_per_s=1e9)),
        ("kv=-inf; tps=-inf", LoadReport()),
        ("kv=7; tps=1e300", LoadReport(kv_usage=1.0, tokens_per_s=1e9)),
        ("pft=-3", LoadReport()),
        ("pft=nan", LoadReport()),
        ("pft=inf", LoadReport(prefill_ms_per_token=1e4)),
        ("running=" + "9" * 200, LoadReport(running=1_000_000)),
        ("waiting=123456789012", LoadReport(waiting=1_000_000)),
        # Names a newer region may add are skipped; the known ones still count.
        ("state=ready; running=2; prefix=abc; queue_ms=12", LoadReport(running=2)),
        ("  running = 4 ;; ;waiting=1;", LoadReport(running=4, waiting=1)),
    ],
)
def test_hostile_values_are_clamped(header: str, expected: LoadReport):
    assert parse_load(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        ";;;",
        "state=busy; running=1",  # unknown state: the report means something we cannot read
        "state=READY",
        "running=three",
        "running=1.5",
        "kv=0,5",
        "tps=fast",
        "pft=slow",
        "running=1; " + "x" * MAX_HEADER_CHARS,  # over-long: not read at all
        "unknown=1; other=2",  # nothing known in it
    ],
)
def test_garbage_is_no_report(header: str | None):
    assert parse_load(header) is None


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_to_none_or_a_report_in_range(header: str):
    report = parse_load(header)
    assert report is None or in_range(report)


_pair = st.tuples(
    st.sampled_from(["state", "running", "waiting", "capacity", "kv", "tps", "other"]),
    st.one_of(
        st.sampled_from(["ready", "loading", "nan", "inf", "-inf", "-1", "1e999", ""]),
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_pair, max_size=8))
def test_near_miss_headers_parse_to_none_or_a_report_in_range(pairs: list[tuple[str, str]]):
    report = parse_load("; ".join(f"{name}={value}" for name, value in pairs))
    assert report is None or in_range(report)
