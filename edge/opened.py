"""A region's answer head as the forward stage hands it on: which replica, its response, where the time went,
and the in-flight slot it holds until it is released (once, whichever path lets go of it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge.h1 import Response
from edge.upstream import Slot, Upstream


@dataclass(slots=True)
class UpstreamTiming:
    forwarded_at: float = 0.0
    route_s: float = 0.0
    queue_s: float = 0.0
    connect_s: float = 0.0
    first_byte_s: float = 0.0
    region_timing: str = ""

    @property
    def sent_at(self) -> float:
        """When the request left on an open connection. The router learns the replica's times from here:
        a new connection's handshakes are the path's (the probes time it), not the replica's, and the
        requests after it, on warm connections, do not pay them."""
        return self.forwarded_at + self.connect_s

    def header(self, edge_s: float) -> str:
        parts = [
            f"edge;dur={edge_s * 1000:.2f}",
            f"route;dur={self.route_s * 1000:.3f}",
            f"edge-queue;dur={self.queue_s * 1000:.2f}",
            f"upstream-connect;dur={self.connect_s * 1000:.2f}",
            f"upstream-ttfb;dur={self.first_byte_s * 1000:.1f}",
        ]
        if self.region_timing:
            parts.append(self.region_timing)
        return ", ".join(parts)


@dataclass(slots=True)
class Opened:
    upstream: Upstream
    response: Response
    timing: UpstreamTiming
    slot: Slot  # its place in the replica's in-flight count
    skipped: list[str] = field(default_factory=list)
    model: str = ""  # the model it was asked for (a fallback's, when one serves)
    body: bytes = b""  # what it was sent

    def release(self) -> None:
        """Done with the answer: its connection is pooled again if it was read to its end (else dropped),
        and its slot is given back. Safe to call again."""
        self.response.close()
        self.slot.release()
