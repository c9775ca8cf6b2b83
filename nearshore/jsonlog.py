"""Structured logs, opt-in: one JSON object per line (``[logging] format = "json"`` or ``--log-format json``).

Every record becomes ``{"ts", "level", "logger", "message", ...}``; a request's closing line adds its
fields (request id, trace id, tenant, model, status, tokens, times) under their own keys, so a log
pipeline can index them without parsing the message. The redaction of :mod:`nearshore.logsafe` still runs
on the whole line: no secret reaches it, whoever logged it.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from msgspec import Struct

from nearshore import logsafe

LogFormat = Literal["text", "json"]
# The logger every process writes its one line per request to.
REQUESTS = "nearshore.requests"
# A record's structured fields ride in this attribute (``log.info(..., extra={FIELDS: {...}})``).
FIELDS = "fields"


class LoggingConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # "json": one JSON object a line, and one line per request with its ids, tokens and times.
    format: LogFormat = "text"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"), default=str, ensure_ascii=False)


def configure(log_format: LogFormat, logger: logging.Logger | None = None) -> None:
    """Switch every handler on ``logger`` (the root by default) to ``log_format``; redaction stays on."""
    if log_format != "json":
        return
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        handler.setFormatter(logsafe.RedactingFormatter(JsonFormatter()))


def request_line(logger: logging.Logger, fields: dict[str, Any]) -> None:
    """A request's one closing line (its fields carry everything; the message says what it is)."""
    logger.info("request", extra={FIELDS: fields})
