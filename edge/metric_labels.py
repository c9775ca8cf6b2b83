"""Label values that come from outside the edge, mapped to a fixed set before they name a time series.

Every new label value is a new series: held in memory for the process's life and sent on every scrape. A
region's error ``code`` (passed on from its error event), or a model name a client sends, would let a peer
mint series at will (issue 19, item 4: 2,000 codes of 4 kB made /metrics 16 MB). Values drawn from the edge's
own config (region and replica names, its models, its key store's tenants) are bounded already; the others
go through here, and anything not known is counted as ``other``.
"""

from __future__ import annotations

from collections.abc import Collection

from nearshore.protocol import errors
from nearshore.protocol.errors import ErrorKind

OTHER = "other"

# Codes providers send that the edge passes on as they are (Azure's content filter, OpenAI's 503).
PROVIDER_CODES = ("content_filter", "service_unavailable", "server_error")


def _edge_kinds() -> list[ErrorKind]:
    # The errors table is the one list of what the edge (and its regions) answer: read, not copied, so a
    # kind added there is never counted as "other".
    return [kind for kind in vars(errors).values() if isinstance(kind, ErrorKind)]


# A failed journey's error_code is its kind's code, or its type when the kind has none (edge/journey.py).
ERROR_CODES: frozenset[str] = frozenset(
    {kind.code for kind in _edge_kinds() if kind.code}
    | {kind.type for kind in _edge_kinds()}
    | set(PROVIDER_CODES)
)


def error_code_label(code: str) -> str:
    """``code`` when the edge knows it, else ``other``."""
    return code if code in ERROR_CODES else OTHER


def model_label(model: str, configured: Collection[str]) -> str:
    """``model`` when the edge serves it (``configured``: its config's models), else ``other``."""
    return model if model in configured else OTHER
