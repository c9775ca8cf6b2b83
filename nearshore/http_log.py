"""A malformed HTTP request logs one line, not a traceback, and a flood of them only a few lines a second.

aiohttp answers a request it cannot parse with 400 and logs ``Error handling request from <peer>`` on the
``aiohttp.server`` logger with the parser's traceback: a dozen lines per bad request, and anyone on the
internet can send thousands. :func:`install` puts :class:`MalformedRequestLog` on that logger: such a record
becomes ``malformed HTTP request from <peer>: <the parse error in a few words>``, at most ``per_s`` lines a
second (the first line after a quiet second counts those left out). Only parser errors are touched: any
other exception there (a handler's bug) keeps its traceback.

The few words are the fixed start of the parser's message, never the bytes it quotes: those are the
client's, and can hold a key the redaction would only recognise whole.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

SERVER_LOGGER = "aiohttp.server"
LINES_PER_S = 5
# The message's start, up to its first quote, colon or newline ("can't" is a word, not a quote).
_WORDS = re.compile(r"(?:[A-Za-z0-9 ,-]|(?<=n)'(?=t\b))*")
_MAX_WORDS, _MAX_WORD_CHARS = 8, 24  # no word of aiohttp's messages is longer; a key is


def parse_error_words(exc: HttpProcessingError) -> str:
    """``Invalid header value char``, ``Got more than 8190 bytes when reading``: what went wrong."""
    start = _WORDS.match(exc.message or "")
    words = [w for w in (start[0] if start else "").split() if len(w) <= _MAX_WORD_CHARS]
    return " ".join(words[:_MAX_WORDS]) or type(exc).__name__


class MalformedRequestLog(logging.Filter):
    """One line per malformed request, at most ``per_s`` a second; other records pass untouched."""

    def __init__(self, per_s: int = LINES_PER_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.per_s = per_s
        self._clock = clock
        self._second = -1.0  # the start of the current one-second window
        self._lines = 0  # written in it
        self.suppressed = 0  # left out since the last line written

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or not str(record.msg).startswith("Error handling"):
            return True
        now = self._clock()
        if now - self._second >= 1.0:
            self._second, self._lines = now, 0
        if self._lines >= self.per_s:
            self.suppressed += 1
            return False
        self._lines += 1
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else None
        left_out = f" ({self.suppressed} more not logged)" if self.suppressed else ""
        self.suppressed = 0
        record.msg = "malformed HTTP request from %s: %s%s"
        record.args = (peer or "an unknown peer", parse_error_words(exc), left_out)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        # A client's mistake, not the server's: a warning at most (aiohttp's own debug lines stay debug).
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def install(logger: logging.Logger | None = None, per_s: int = LINES_PER_S) -> MalformedRequestLog:
    """Put the filter on aiohttp's server logger once (a second call returns the first filter)."""
    logger = logger or logging.getLogger(SERVER_LOGGER)
    for existing in logger.filters:
        if isinstance(existing, MalformedRequestLog):
            return existing
    made = MalformedRequestLog(per_s)
    logger.addFilter(made)
    return made
