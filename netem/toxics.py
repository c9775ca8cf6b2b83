"""Toxics: the small steps a chunk goes through on one direction of a link (after Toxiproxy).

Delays apply per chunk (per recv), not per packet or per message: a chunk is whatever one read from the
socket returned, stamped with the time it arrived. TCP may merge two small writes into one chunk or split
a large write into several; each chunk gets one jitter draw and one loss decision.

No toxic sleeps. Each toxic moves a chunk's due time ``at`` forward (or splits the chunk), and the link's
pump waits once per chunk, until ``at``. So the wait is always "target time minus time since arrival":
delays never add up along the chain, and a slow pump does not push later chunks further back.

A chain is the same list for every direction: the no-op :class:`Toxic` first, then handshake (client to
server only), loss-as-delay, bandwidth, latency, slow close. A toxic whose setting is zero passes chunks
through, so changing a link at run time is changing a setting, never the chain.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from netem.profiles import Direction, Distribution

now = time.monotonic  # one clock for arrival stamps, due times and sleeps

MSS = 1448  # one TCP segment's payload on a 1500-byte path
PACE_S = 0.01  # the bandwidth toxic releases a rate-limited chunk in pieces of this much line time
UNLIMITED_WINDOW = 8 << 20  # bytes in flight per connection and direction when the rate is unlimited
PARETO_ALPHA = 3.0  # finite variance; mean 1.5 and standard deviation sqrt(3)/2 for x_m = 1
_PARETO_MEAN, _PARETO_SD = 1.5, math.sqrt(3) / 2


@dataclass(slots=True)
class Chunk:
    """What one recv() returned (empty: end of stream), when it arrived, and when it may leave."""

    data: bytes
    arrived: float
    at: float = field(default=-math.inf)
    lost: bool = False

    def __post_init__(self) -> None:
        self.at = max(self.at, self.arrived)

    @property
    def eof(self) -> bool:
        return not self.data


def draw_jitter(rng: random.Random, kind: Distribution, scale: float) -> float:
    """A jitter sample with mean 0: ``scale`` is the standard deviation for normal and pareto (a shifted
    pareto with a long right tail, as tc netem's table), the half-width for uniform."""
    if scale <= 0:
        return 0.0
    if kind == "normal":
        return rng.gauss(0.0, scale)
    if kind == "uniform":
        return rng.uniform(-scale, scale)
    return scale * (rng.paretovariate(PARETO_ALPHA) - _PARETO_MEAN) / _PARETO_SD


class Lane:
    """One direction of a link: its live settings, its random stream, its line and its counters.

    Shared by every connection through the link: the rate is the link's (connections share the line),
    and the loss state is the link's (a bad spell hits whoever is sending). Toxics read ``settings`` on
    every chunk, so a change applies from the next chunk on.
    """

    def __init__(self, settings: Direction, seed: str, floor_ms: float = 0.0) -> None:
        self.settings = settings
        self.rng = random.Random(seed)
        self.floor_s = floor_ms / 1000  # no draw of jitter goes below light in fibre
        self.slow_close_s = 0.0
        self.line_free_at = 0.0  # bandwidth: when the line has sent everything given to it
        self.bad = False  # gilbert-elliott: in the bad state
        self.bytes = 0
        self.chunks = 0
        self.chunks_delayed = 0
        self.chunks_lost = 0

    def lose(self) -> bool:
        """One loss decision, then (gilbert-elliott) one state transition."""
        loss = self.settings.loss
        if loss.model == "none":
            return False
        if loss.model == "bernoulli":
            return self.rng.random() < loss.p
        lost = self.rng.random() >= (loss.h if self.bad else loss.k)
        if self.rng.random() < (loss.r if self.bad else loss.p):
            self.bad = not self.bad
        return lost

    def one_way_s(self) -> float:
        """This chunk's propagation delay: the set delay plus a jitter draw, never below the floor."""
        s = self.settings
        jitter = draw_jitter(self.rng, s.jitter, s.jitter_ms)
        return max(self.floor_s, (s.delay_ms + jitter) / 1000)

    def window_bytes(self) -> int:
        """How many bytes a connection may have inside the link in this direction: what the line can
        carry while they propagate, plus a quarter second of queue (the router's buffer)."""
        rate = self.settings.rate_bytes_per_s
        if rate <= 0:
            return UNLIMITED_WINDOW
        s = self.settings
        rto_ms = s.loss.rto_ms if s.loss.model != "none" else 0.0
        delay_s = (s.delay_ms + 4 * s.jitter_ms + rto_ms) / 1000
        return max(64 << 10, int(rate * (delay_s + 0.25)))


class Toxic:
    """The no-op that starts every chain. A toxic holds its settings (its lane), may give each
    connection some state, and has one method: ``pipe`` takes a chunk and returns what goes on."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane

    def new_state(self) -> Any:
        return None

    def pipe(self, chunk: Chunk, state: Any) -> list[Chunk]:
        return [chunk]


class Handshake(Toxic):
    """A new connection costs one round trip before its first byte, as TCP's handshake does: the proxy
    accepts locally at once, so without this a fresh connection would look as cheap as a warm one."""

    def __init__(self, lane: Lane, rtt_s: Callable[[], float]) -> None:
        super().__init__(lane)
        self.rtt_s = rtt_s

    def new_state(self) -> float:
        return now() + self.rtt_s()  # when the connection is open end to end

    def pipe(self, chunk: Chunk, state: float) -> list[Chunk]:
        chunk.at = max(chunk.at, state)
        return [chunk]


class LossAsDelay(Toxic):
    """A TCP proxy cannot drop bytes: a lost chunk arrives one retransmission timeout late."""

    def pipe(self, chunk: Chunk, state: None) -> list[Chunk]:
        if not chunk.eof and self.lane.lose():
            chunk.at += self.lane.settings.loss.rto_ms / 1000
            chunk.lost = True
            self.lane.chunks_lost += 1
        return [chunk]


class Bandwidth(Toxic):
    """A line of ``rate_kbps``: each piece starts when the line is free and leaves when it has been sent.
    Big chunks go in pieces of PACE_S of line time, so a receiver sees a steady stream, not bursts."""

    def pipe(self, chunk: Chunk, state: None) -> list[Chunk]:
        rate = self.lane.settings.rate_bytes_per_s
        if rate <= 0 or chunk.eof:
            return [chunk]
        size = max(MSS, int(rate * PACE_S))
        pieces = []
        for start in range(0, len(chunk.data), size):
            piece = Chunk(chunk.data[start : start + size], chunk.arrived, chunk.at, chunk.lost)
            sent = max(chunk.at, self.lane.line_free_at) + len(piece.data) / rate
            piece.at = self.lane.line_free_at = sent
            pieces.append(piece)
        return pieces


class _Order:
    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = -math.inf


class Latency(Toxic):
    """One-way delay plus jitter. Jitter never reorders bytes: a chunk leaves at its own target or
    right after the chunk before it on the same connection, whichever is later."""

    def new_state(self) -> _Order:
        return _Order()

    def pipe(self, chunk: Chunk, state: _Order) -> list[Chunk]:
        delay = self.lane.settings.delay_ms / 1000 if chunk.eof else self.lane.one_way_s()
        chunk.at = max(chunk.at + delay, state.last)
        state.last = chunk.at
        return [chunk]


class SlowClose(Toxic):
    """The end of stream (FIN) leaves ``slow_close_s`` after the data before it."""

    def pipe(self, chunk: Chunk, state: None) -> list[Chunk]:
        if chunk.eof:
            chunk.at += self.lane.slow_close_s
        return [chunk]


def build_chain(lane: Lane, handshake_rtt_s: Callable[[], float] | None = None) -> list[Toxic]:
    """The toxics of one direction, in order; ``handshake_rtt_s`` on the client-to-server side only."""
    chain: list[Toxic] = [Toxic(lane)]
    if handshake_rtt_s is not None:
        chain.append(Handshake(lane, handshake_rtt_s))
    chain += [LossAsDelay(lane), Bandwidth(lane), Latency(lane), SlowClose(lane)]
    return chain


class Pipeline:
    """One direction of one connection: the lane's chain with this connection's state for each toxic."""

    def __init__(self, chain: list[Toxic]) -> None:
        self.chain = chain
        self.states = [toxic.new_state() for toxic in chain]

    def run(self, chunk: Chunk) -> list[Chunk]:
        chunks = [chunk]
        for toxic, state in zip(self.chain, self.states, strict=True):
            chunks = [out for c in chunks for out in toxic.pipe(c, state)]
        return chunks
