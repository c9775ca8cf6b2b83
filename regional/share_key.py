"""The edge's opaque per-key id on a request to the node (``x-nearshore-share-key``): the key the scheduler
and the embedder share the node fairly by."""

from __future__ import annotations

import re

from aiohttp import web

from nearshore.protocol.headers import SHARE_KEY

_SHARE_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def share_key_of(request: web.Request) -> str:
    """The edge's opaque per-key id, for the scheduler's fair shares; "" when absent or not one. Trusted as
    the other edge headers are: where the node serves edges only (edges_only), nobody else gets this far."""
    value = request.headers.get(SHARE_KEY, "")
    return value if _SHARE_KEY.fullmatch(value) else ""
