"""No secret reaches a log line: redact the final text of every record at the logging boundary.

Secrets arrive where no handler of ours sees them first: aiohttp logs a malformed request's raw line
(``Authorization: Bearer ns-...\\x00``) at ERROR, with the key in it. So the CLI wraps every handler's
formatter; whatever a record says, and whoever logged it, its formatted text (message, arguments,
traceback) passes through :func:`redact` before it is written. Only emitted records pay for it.

Redacted: Nearshore API keys, whole or cut short, keep their public key id (``ns-<key_id>-***``); the values
of ``Authorization``, ``x-api-key`` and ``x-nearshore-edge-secret`` and any bearer token; passwords in URLs
(``redis://:pw@host``); and every string passed to :func:`register_secret` (the shared secrets in configs).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from types import TracebackType

MASK = "***"

# The key format is edge/keys.py's (``ns-<12 hex>-<43 base64url>``); anything after the id is treated as
# secret up to whitespace or a quote, so a key cut short, or followed by a bad byte, loses all of it.
_PATTERN = re.compile(
    r"""
    (?P<key>ns-[0-9a-f]{12}-)[^\s'"]*
    | (?P<header>(?:authorization|x-api-key|x-nearshore-edge-secret)['"]?\s*[:=]\s*['"]?
        (?:(?:bearer|basic|token)\s+)?)(?P<header_value>[^\s'",]+)
    | (?P<bearer>bearer\s+)(?P<bearer_value>[^\s'",]+)
    | (?P<userinfo>(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,31}://[^\s/@:'"]*:)[^\s/@'"]+(?=@)
    """,
    re.IGNORECASE | re.VERBOSE | re.ASCII,  # ASCII: the same case folding as the triggers below
)
_KEY_ID = re.compile(r"ns-[0-9a-f]{12}-", re.IGNORECASE | re.ASCII)
# Every match contains one of these: most lines contain none, and six substring checks cost far less than
# the case-insensitive pattern.
_TRIGGERS = ("ns-", "authorization", "x-api-key", "edge-secret", "bearer", "://")

_secrets: tuple[str, ...] = ()
_secrets_lock = threading.Lock()


def _mask(match: re.Match[str]) -> str:
    if match["key"]:
        return match["key"] + MASK
    if match["userinfo"]:
        return match["userinfo"] + MASK
    if match["header"]:
        kept, value = match["header"], match["header_value"]
    else:
        kept, value = match["bearer"], match["bearer_value"]
    key_id = _KEY_ID.match(value)  # a key in a header still shows whose it was
    return kept + (key_id[0] if key_id else "") + MASK


def register_secret(value: str) -> None:
    """Redact ``value`` wherever it appears from now on, also as it looks inside a bytes or str repr."""
    if not value:
        return
    forms = {value, repr(value)[1:-1], repr(value.encode())[2:-1]}
    global _secrets
    with _secrets_lock:
        # Longest first, so a secret that contains another is masked whole.
        _secrets = tuple(sorted(set(_secrets) | forms, key=len, reverse=True))


def redact(text: str) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    lowered = text.lower()
    if not any(trigger in lowered for trigger in _TRIGGERS):
        return text
    return _PATTERN.sub(_mask, text)


class RedactingFormatter(logging.Formatter):
    """Formats with the wrapped formatter, then redacts the whole text."""

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record))


def install(logger: logging.Logger | None = None) -> None:
    """Wrap the formatter of every handler on ``logger`` (the root logger by default), and send uncaught
    exceptions through logging so that their tracebacks are redacted too."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not isinstance(handler.formatter, RedactingFormatter):
            handler.setFormatter(RedactingFormatter(handler.formatter))
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("nearshore").critical("uncaught exception", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread else "?"
    logging.getLogger("nearshore").error(
        "uncaught exception in thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
    )
