"""Does a link do what its profile says? Measure RTT and rate through a userspace link built from it.

RTT: 30 ping-pongs of 64 bytes (one chunk each way), after one warm-up that pays the handshake. The
link draws jitter and loss from a seeded stream, so replaying the same toxics with the same seed on the
same chunks gives what each round trip should take; the measured p50 must be within 2 ms or 3% of the
replay's p50. The report shows the profile's nominal RTT beside it; without jitter or loss they agree.

Rate: for each direction with a rate, push ``seconds`` worth of data and time the middle 80% of it at
the receiver (the slope of bytes against time, within 5%). Jitter and loss are switched off for this
part, as the RTT part checks them: a lost chunk stalls the line for one RTO, and a draw from a long
jitter tail holds the pieces behind it (no reordering), so both show in a short window as rate error.
"""

from __future__ import annotations

import asyncio
import statistics
import struct
from dataclasses import dataclass, field

import msgspec

from netem.link import LinkEmulator, make_lanes
from netem.profiles import WAYS, Loss, Profile
from netem.toxics import Chunk, Pipeline, build_chain, now

PING = 64
HEADER = struct.Struct("!cQ")  # mode, size: E echo, S send me size bytes, R receive size bytes
RTT_TOLERANCE_MS, RTT_TOLERANCE = 2.0, 0.03
RATE_TOLERANCE = 0.05
LINK_NAME = "check"


@dataclass
class RateCheck:
    way: str
    set_kbps: float
    measured_kbps: float

    @property
    def ok(self) -> bool:
        return abs(self.measured_kbps - self.set_kbps) <= RATE_TOLERANCE * self.set_kbps


@dataclass
class FidelityReport:
    profile: str
    floor_rtt_ms: float
    profile_rtt_ms: float
    model_p50_ms: float
    measured_p50_ms: float
    rates: list[RateCheck] = field(default_factory=list)

    @property
    def error_ms(self) -> float:
        return self.measured_p50_ms - self.model_p50_ms

    @property
    def rtt_ok(self) -> bool:
        return abs(self.error_ms) <= max(RTT_TOLERANCE_MS, RTT_TOLERANCE * self.model_p50_ms)

    @property
    def ok(self) -> bool:
        return self.rtt_ok and all(rate.ok for rate in self.rates)


def model_rtts(profile: Profile, seed: int, round_trips: int, name: str = LINK_NAME) -> list[float]:
    """What each ping-pong should take (s) on a link ``name`` seeded ``seed``: the link's own toxics
    replayed on the same chunks, the warm-up included (it draws too) but not returned."""
    lanes = make_lanes(name, profile, seed)
    there, back = Pipeline(build_chain(lanes["a_to_b"])), Pipeline(build_chain(lanes["b_to_a"]))
    t, rtts = 0.0, []
    for i in range(round_trips + 1):
        request = b"x" * (PING + (HEADER.size if i == 0 else 0))
        arrived = there.run(Chunk(request, t))[-1].at
        answered = back.run(Chunk(b"x" * PING, arrived))[-1].at
        if i:
            rtts.append(answered - t)
        t = answered + 60.0  # the next ping leaves after this one is back
    return rtts


class _Peer:
    """The far end: echoes pings, sends a block, or swallows one and times it."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[float] = asyncio.Queue()  # rates seen, bytes per second
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> _Peer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            mode, size = HEADER.unpack(await reader.readexactly(HEADER.size))
            if mode == b"E":
                while True:
                    writer.write(await reader.readexactly(PING))
                    await writer.drain()
            elif mode == b"S":
                writer.write(bytes(size))
                await writer.drain()
            else:
                self.received.put_nowait(await _timed_read(reader, size))
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            writer.close()


async def _timed_read(reader: asyncio.StreamReader, size: int) -> float:
    """Bytes per second over the middle 80% of ``size`` bytes: the slope of bytes received against time,
    so one late piece (a jitter draw from the tail) at either end does not skew it."""
    got, times, counts = 0, [], []
    while got < size:
        data = await reader.read(1 << 16)
        if not data:
            raise asyncio.IncompleteReadError(b"", size)
        got += len(data)
        if 0.1 * size <= got <= 0.9 * size:
            times.append(now())
            counts.append(got)
    if len(times) < 3:
        raise ValueError(f"too few reads to time ({len(times)}): is the rate set?")
    return statistics.linear_regression(times, counts).slope


async def _rtts(port: int, round_trips: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        ping = bytes(PING)
        writer.write(HEADER.pack(b"E", 0) + ping)  # one chunk: the warm-up pays the handshake
        await reader.readexactly(PING)
        rtts = []
        for _ in range(round_trips):
            started = now()
            writer.write(ping)
            await reader.readexactly(PING)
            rtts.append(now() - started)
        return rtts
    finally:
        writer.close()


async def _rate(port: int, peer: _Peer, way: str, size: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if way == "a_to_b":
            writer.write(HEADER.pack(b"R", size) + bytes(size))
            await writer.drain()
            return await peer.received.get()
        writer.write(HEADER.pack(b"S", size))
        return await _timed_read(reader, size)
    finally:
        writer.close()


async def fidelity_check(
    profile: Profile, *, round_trips: int = 30, seconds: float = 2.0, seed: int = 0
) -> FidelityReport:
    """Build a link from ``profile`` on 127.0.0.1, measure it, compare with the profile and its model."""
    peer = await _Peer().start()
    target = ("127.0.0.1", peer.port)
    try:
        link = LinkEmulator(LINK_NAME, ("127.0.0.1", 0), target, profile, seed)
        await link.start()
        try:
            timeout = 30 + round_trips * (profile.rtt_ms / 1000 + 1)
            measured = await asyncio.wait_for(_rtts(link.port, round_trips), timeout)
        finally:
            await link.stop()
        rates = []
        line_only = msgspec.structs.replace(
            profile,
            **{way: msgspec.structs.replace(profile.way(way), jitter_ms=0.0, loss=Loss()) for way in WAYS},
        )
        for way in WAYS:
            direction = profile.way(way)
            if direction.rate_kbps <= 0:
                continue
            link = LinkEmulator(LINK_NAME, ("127.0.0.1", 0), target, line_only, seed)
            await link.start()
            try:
                size = max(128 << 10, int(direction.rate_bytes_per_s * seconds))
                rate = await asyncio.wait_for(_rate(link.port, peer, way, size), 30 + 3 * seconds)
            finally:
                await link.stop()
            rates.append(RateCheck(way, direction.rate_kbps, rate * 8 / 1000))
    finally:
        await peer.stop()
    model = model_rtts(profile, seed, round_trips)
    return FidelityReport(
        profile=profile.name,
        floor_rtt_ms=profile.floor_rtt_ms,
        profile_rtt_ms=profile.rtt_ms,
        model_p50_ms=statistics.median(model) * 1000,
        measured_p50_ms=statistics.median(measured) * 1000,
        rates=rates,
    )
