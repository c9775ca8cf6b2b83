"""W3C traceparent parsing and the JSON log formatter, without processes (issue 12)."""

from __future__ import annotations

import json
import logging

import pytest

from nearshore import jsonlog, logsafe
from nearshore.protocol import trace

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def test_a_valid_traceparent_is_joined_with_its_tracestate():
    context = trace.incoming({"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "congo=t61rcWkgMzE"})
    assert (context.trace_id, context.parent_id, context.flags, context.joined) == (TRACE, SPAN, "01", True)
    edge_span = trace.new_span_id()
    forwarded = trace.forward_headers(context, edge_span)
    assert forwarded == {"traceparent": f"00-{TRACE}-{edge_span}-01", "tracestate": "congo=t61rcWkgMzE"}


def test_a_future_version_may_carry_more_fields():
    context = trace.parse_traceparent(f"cc-{TRACE}-{SPAN}-01-what-the-future-holds")
    assert context is not None and context.trace_id == TRACE


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        f"00-{TRACE}-{SPAN}",  # three fields
        f"00-{TRACE.upper()}-{SPAN}-01",
        f"00-{'0' * 32}-{SPAN}-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"ff-{TRACE}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-01-extra",
        f"00-{TRACE}-{SPAN}-1",
        f"00-{TRACE}x-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-01\r\nx-injected: 1",
    ],
)
def test_a_malformed_traceparent_starts_a_new_trace_without_the_tracestate(value):
    context = trace.incoming({"traceparent": value, "tracestate": "congo=t61rcWkgMzE"})
    assert not context.joined and context.state == "" and context.parent_id == ""
    assert trace.parse_traceparent(trace.traceparent(context, trace.new_span_id())) is not None
    assert context.trace_id != TRACE


def test_an_oversized_or_unprintable_tracestate_is_dropped():
    valid = f"00-{TRACE}-{SPAN}-01"
    assert trace.incoming({"traceparent": valid, "tracestate": "a=" + "b" * 600}).state == ""
    assert trace.incoming({"traceparent": valid, "tracestate": "a=1\nb=2"}).state == ""


def test_json_lines_carry_their_fields_and_are_redacted():
    formatter = logsafe.RedactingFormatter(jsonlog.JsonFormatter())
    key = "ns-0123456789ab-" + "s" * 43
    record = logging.LogRecord("nearshore.requests", logging.INFO, __file__, 1, "request", None, None)
    record.fields = {"request_id": "r1", "tenant": "acme", "note": f"Authorization: Bearer {key}"}
    line = json.loads(formatter.format(record))
    assert line["message"] == "request" and line["request_id"] == "r1" and line["tenant"] == "acme"
    assert "s" * 43 not in json.dumps(line) and "ns-0123456789ab-***" in line["note"]


def test_the_log_format_flag_overrides_the_config_and_switches_the_handlers():
    import argparse

    from cli import build_parser
    from cli.serve import _with_log_format
    from edge.config import EdgeConfig

    args = build_parser().parse_args(["edge", "--log-format", "json"])
    logger = logging.getLogger("nearshore.test.flag")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    try:
        # The CLI switches the root logger's handlers; this one stands in for them.
        jsonlog.configure(_with_log_format(args, EdgeConfig()).logging.format, logger)
        assert isinstance(handler.formatter, logsafe.RedactingFormatter)
        assert isinstance(handler.formatter.inner, jsonlog.JsonFormatter)
    finally:
        logger.removeHandler(handler)
    plain = argparse.Namespace(log_format=None)
    assert _with_log_format(plain, EdgeConfig()).logging.format == "text"
