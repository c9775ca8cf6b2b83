"""A malformed request's log record: one line, rate limited; other errors untouched (issue 19, item 9)."""

from __future__ import annotations

import io
import logging
import sys

from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, LineTooLong

from nearshore.http_log import MalformedRequestLog, install, parse_error_words

KEY = "ns-0123456789ab-" + "S" * 43


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def logger_with(filter_: logging.Filter) -> tuple[logging.Logger, io.StringIO]:
    logger = logging.getLogger(f"test.http_log.{id(filter_)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.handlers[:] = [handler]
    logger.addFilter(filter_)
    return logger, stream


def log_error(logger: logging.Logger, exc: BaseException, peer: str | None = "203.0.113.7") -> None:
    """What aiohttp's request handler does: ``log_exception`` inside its except block."""
    try:
        raise exc
    except BaseException:
        logger.exception("Error handling request from %s", peer)


def test_the_words_are_the_messages_fixed_start_never_the_clients_bytes():
    assert parse_error_words(BadHttpMessage(f"Invalid header value char:\n\n  b'{KEY}\\x00'")) == (
        "Invalid header value char"
    )
    assert parse_error_words(LineTooLong(KEY * 200, "8190")).startswith("Got more than 8190 bytes")
    # A message that begins with something long and unquoted (a key) loses it: no word over 24 chars.
    assert KEY not in parse_error_words(BadHttpMessage(f"bad {KEY} here"))
    assert parse_error_words(BadStatusLine("")) in ("Bad status line", "BadStatusLine")


def test_a_malformed_request_is_one_warning_line():
    logger, stream = logger_with(MalformedRequestLog(clock=Clock()))
    log_error(logger, BadHttpMessage(f"Invalid header value char:\n\n  b'{KEY}\\x00'\n    ^"))
    text = stream.getvalue()
    assert text == "WARNING malformed HTTP request from 203.0.113.7: Invalid header value char\n"


def test_a_flood_is_rate_limited_and_the_next_line_counts_what_was_left_out():
    clock = Clock()
    logger, stream = logger_with(MalformedRequestLog(per_s=5, clock=clock))
    for _ in range(50):
        log_error(logger, BadStatusLine("GARBAGE"))
        clock.now += 0.01  # 50 in half a second
    assert stream.getvalue().count("\n") == 5
    clock.now += 1.0
    log_error(logger, BadStatusLine("GARBAGE"))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 6 and lines[-1].endswith("(45 more not logged)")
    assert "Traceback" not in stream.getvalue()


def test_an_application_error_keeps_its_traceback():
    logger, stream = logger_with(MalformedRequestLog(per_s=1, clock=Clock()))
    for _ in range(3):  # not rate limited either: every one is a bug to see
        log_error(logger, ValueError("a handler's bug"))
    text = stream.getvalue()
    assert text.count("ERROR Error handling request from 203.0.113.7") == 3
    assert text.count("Traceback") == 3 and "ValueError: a handler's bug" in text


def test_aiohttp_debug_lines_stay_debug_and_an_unknown_peer_is_said():
    logger, stream = logger_with(MalformedRequestLog(clock=Clock()))
    try:
        raise BadStatusLine("x")
    except BadStatusLine:
        logger.debug("Error handling request from %s", None, exc_info=sys.exc_info())
    assert stream.getvalue().startswith("DEBUG malformed HTTP request from an unknown peer: ")


def test_install_puts_one_filter_on_the_logger():
    logger = logging.getLogger("test.http_log.install")
    try:
        first = install(logger)
        assert install(logger) is first and logger.filters == [first]
    finally:
        logger.filters.clear()
