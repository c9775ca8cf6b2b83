"""A region's answer head as the forward stage hands it on: which replica, its response, where the time went,
and the in-flight slot it holds until it is released (once, whichever path lets go of it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge.h1 import Response
from edge.upstream import Slot, Upstream
from nearshore.protocol.headers import SERVER_TIMING
from nearshore.protocol.server_timing import duration_s

_SERVER_TIMING = SERVER_TIMING.lower()  # (the edge's client keeps header names in lower case)


@dataclass(slots=True)
class UpstreamTiming:
    forwarded_at: float = 0.0
    route_s: float = 0.0
    queue_s: float = 0.0
    connect_s: float = 0.0
    first_byte_s: float = 0.0
    region_timing: str = ""
    setup_s: float = 0.0  # what the region says it spent setting the request up before queueing it

    def head_arrived(self, response: Response, now: float) -> None:
        self.first_byte_s = now - self.forwarded_at
        self.connect_s = response.connect_s
        self.region_timing = response.headers.get(_SERVER_TIMING, "")[:512]
        self.setup_s = duration_s(self.region_timing, "grammar")

    @property
    def began_at(self) -> float:
        """When the replica began on the request; the router learns the replica's times from here. Left
        out: a new connection's handshakes (the path's, which the probes time; the requests after it, on
        warm connections, do not pay them) and the region's setup of the request (its grammar build: a
        node's first structured request builds the grammar engine's vocabulary, 1.4 s, and taken as the
        node's speed it moved every user's traffic to a farther region)."""
        return self.forwarded_at + self.connect_s + self.setup_s

    @property
    def replica_first_byte_s(self) -> float:
        """``first_byte_s`` from :attr:`began_at`."""
        return max(0.0, self.first_byte_s - self.connect_s - self.setup_s)

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
