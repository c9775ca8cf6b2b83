"""The userspace link, toxic by toxic, on real sockets on 127.0.0.1 (its faults, control API and tc backend
are in test_link_faults.py and test_tc.py).

Each toxic's test asserts its effect within a tolerance, at p50 where timing is involved: this runs on a
small, shared machine. Delays are small (2-50 ms) to keep the file fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import statistics
import struct
import time
from collections.abc import AsyncIterator

import pytest

from netem.link import LinkEmulator, make_lanes
from netem.profiles import Direction, Loss, Profile, Source
from netem.toxics import draw_jitter

now = time.monotonic
RECORD = struct.Struct("!Id")  # sequence number, send time


def profile_of(
    up_ms: float,
    down_ms: float | None = None,
    *,
    jitter_ms: float = 0.0,
    jitter: str = "normal",
    rate_kbps: float = 0.0,
    loss: Loss | None = None,
) -> Profile:
    """A same-city test profile (no light floor); jitter, rate and loss on a_to_b only."""
    source = Source("estimate: test", "estimate: test", "estimate: test", "estimate: test")
    up = Direction(up_ms, jitter_ms, jitter, loss or Loss(), rate_kbps)  # type: ignore[arg-type]
    down = Direction(up_ms if down_ms is None else down_ms)
    return Profile("test", "lagos", "lagos", source, up, down)


def close_to(measured_ms: float, expected_ms: float) -> bool:
    return abs(measured_ms - expected_ms) <= max(2.0, 0.03 * expected_ms)


@contextlib.asynccontextmanager
async def server(handler) -> AsyncIterator[int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


@contextlib.asynccontextmanager
async def linked(profile: Profile, port: int, seed: int = 1, **options: bool) -> AsyncIterator[LinkEmulator]:
    link = LinkEmulator("test", "127.0.0.1:0", ("127.0.0.1", port), profile, seed, **options)
    await link.start()
    try:
        yield link
    finally:
        await link.stop()


async def ping_pongs(port: int, n: int, size: int = 32) -> list[float]:
    """RTTs (ms) of n ping-pongs after one warm-up; each echo must be the ping, in order."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        rtts = []
        for i in range(n + 1):
            ping = i.to_bytes(4, "big") * (size // 4)
            started = now()
            writer.write(ping)
            assert await reader.readexactly(len(ping)) == ping
            if i:
                rtts.append((now() - started) * 1000)
        return rtts
    finally:
        writer.close()


# -- latency


async def test_latency_each_direction_and_the_round_trip():
    arrivals: list[float] = []

    async def stamp_and_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            arrivals.append(now())
            writer.write(data)
            await writer.drain()

    async with server(stamp_and_echo) as port, linked(profile_of(15, 25), port) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        up, down, rtt = [], [], []
        for i in range(31):
            sent = now()
            writer.write(b"%08d" % i)
            await reader.readexactly(8)
            back = now()
            if i:  # the first pays the handshake
                up.append((arrivals[-1] - sent) * 1000)
                down.append((back - arrivals[-1]) * 1000)
                rtt.append((back - sent) * 1000)
        writer.close()
    assert close_to(statistics.median(up), 15), up
    assert close_to(statistics.median(down), 25), down
    assert close_to(statistics.median(rtt), 40), rtt


@pytest.mark.parametrize(("handshake", "expected_ms"), [(True, 2 * 40), (False, 40)])
async def test_a_new_connection_pays_the_handshake(handshake, expected_ms):
    async with server(echo) as port, linked(profile_of(20), port, handshake=handshake) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        started = now()
        writer.write(b"ping")
        await reader.readexactly(4)
        first = (now() - started) * 1000
        writer.close()
    assert expected_ms - 1 <= first <= expected_ms + 20


# -- jitter


def test_jitter_draws_have_mean_zero_and_the_set_spread():
    rng = random.Random(7)
    for kind, sd in (("normal", 5.0), ("pareto", 5.0), ("uniform", 5.0 / 3**0.5)):
        draws = [draw_jitter(rng, kind, 5.0) for _ in range(20000)]
        assert abs(statistics.fmean(draws)) < 0.15, kind
        assert statistics.stdev(draws) == pytest.approx(sd, rel=0.1), kind
    pareto = [draw_jitter(rng, "pareto", 5.0) for _ in range(20000)]
    assert statistics.median(pareto) < -0.5 and max(pareto) > 20  # the long right tail
    assert max(abs(draw_jitter(rng, "uniform", 5.0)) for _ in range(1000)) <= 5.0


async def send_records(port: int, n: int, gap_s: float) -> None:
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(n):
        writer.write(RECORD.pack(i, now()))
        await writer.drain()
        await asyncio.sleep(gap_s)
    await asyncio.sleep(0.2)
    writer.close()


@contextlib.asynccontextmanager
async def record_sink(received: list[tuple[int, float]]) -> AsyncIterator[int]:
    """A server that reads numbered, time-stamped records and notes each one's one-way delay (ms)."""

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seq, sent = RECORD.unpack(await reader.readexactly(RECORD.size))
            received.append((seq, (now() - sent) * 1000))

    async with server(sink) as port:
        yield port


async def test_jitter_never_reorders():
    received: list[tuple[int, float]] = []
    noisy = profile_of(30, jitter_ms=15)
    async with record_sink(received) as port, linked(noisy, port, handshake=False) as link:
        await send_records(link.port, 500, 0.001)
        chunks = link.state().stats.chunks_a_to_b
    assert [seq for seq, _ in received] == list(range(500))
    delays = [delay for _, delay in received]
    assert chunks > 100  # many chunks, each with its own draw
    assert statistics.stdev(delays) > 3 and min(delays) >= 0


async def test_jitter_distribution_when_chunks_are_spaced():
    # Spaced wider than the jitter, chunks rarely wait for the one before: the draws show through.
    received: list[tuple[int, float]] = []
    spaced = profile_of(20, jitter_ms=3)
    async with record_sink(received) as port, linked(spaced, port, handshake=False) as link:
        await send_records(link.port, 150, 0.01)
    delays = [delay for _, delay in received]
    assert [seq for seq, _ in received] == list(range(150))
    # Robust to the odd scheduling stall: the median is the mean of a normal, and its interquartile
    # range is 1.35 standard deviations (4.0 ms here).
    quartiles = statistics.quantiles(delays, n=4)
    assert abs(statistics.median(delays) - 20) < 1.5
    assert 2.7 < quartiles[2] - quartiles[0] < 5.5


# -- bandwidth


async def test_bandwidth_paces_a_bulk_transfer():
    size = 2_000_000
    arrivals: list[tuple[float, int]] = []

    async def meter(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = 0
        while got < size and (data := await reader.read(65536)):
            got += len(data)
            arrivals.append((now(), got))

    async with server(meter) as port, linked(profile_of(5, rate_kbps=4000), port) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(bytes(size))
        await writer.drain()
        await reader.read()  # the meter closes when it has it all
        writer.close()
    (t0, first), (t1, last) = arrivals[0], arrivals[-1]
    kbps = (last - first) * 8 / 1000 / (t1 - t0)
    assert last == size and kbps == pytest.approx(4000, rel=0.05)


# -- loss as delay


async def lost_pattern(loss: Loss, n: int, seed: int) -> tuple[list[bool], list[float], int]:
    """n ping-pongs over a 2+2 ms link with ``loss`` on a_to_b; a round trip over 2+2 ms + RTO/2 lost."""
    async with server(echo) as port, linked(profile_of(2, loss=loss), port, seed) as link:
        rtts = await ping_pongs(link.port, n)
        chunks_lost = link.state().stats.chunks_lost
    return [rtt > 4 + loss.rto_ms / 2 for rtt in rtts], rtts, chunks_lost


def model_pattern(loss: Loss, n: int, seed: int) -> list[bool]:
    """The loss decisions the link's a_to_b lane draws for its first chunks (the warm-up dropped)."""
    lane = make_lanes("test", profile_of(2, loss=loss), seed)["a_to_b"]
    return [lane.lose() for _ in range(n + 1)][1:]


def lost_as_the_model_says(loss: Loss, rtts: list[float], chunks_lost: int, model: list[bool]) -> None:
    """The link lost the chunks its model draws and only those, timing aside: each chunk the model loses came
    back at least an RTO late (a busy machine can only make it later), and the link's own count of lost
    chunks is the model's (the warm-up may have been lost too). A stall that delays a chunk the model kept
    cannot fail this, as it would a pattern read from round trips."""
    late = [rtt for rtt, gone in zip(rtts, model, strict=True) if gone]
    assert late and min(late) >= 4 + 0.9 * loss.rto_ms, late
    assert 0 <= chunks_lost - sum(model) <= 1, (chunks_lost, sum(model))


def after_a_loss(lost: list[bool]) -> float:
    """How often the chunk after a lost one is lost too."""
    pairs = [b for a, b in itertools.pairwise(lost) if a]
    return sum(pairs) / len(pairs)


def test_loss_models_mean_and_memory():
    bernoulli = model_pattern(Loss("bernoulli", p=0.2), 50_000, seed=1)
    assert sum(bernoulli) / len(bernoulli) == pytest.approx(0.2, abs=0.01)
    assert after_a_loss(bernoulli) == pytest.approx(0.2, abs=0.02)  # no memory
    # Same mean loss (p/(p+r) = 0.2), but a bad spell lasts 1/r = 5 chunks on average.
    gilbert = model_pattern(Loss("gilbert-elliott", p=0.05, r=0.2), 50_000, seed=1)
    assert sum(gilbert) / len(gilbert) == pytest.approx(0.2, abs=0.02)
    assert after_a_loss(gilbert) == pytest.approx(0.8, abs=0.03)  # bursts


async def test_bernoulli_loss_delays_a_fifth_of_chunks_by_an_rto():
    loss = Loss("bernoulli", p=0.2, rto_ms=40)
    _, rtts, chunks_lost = await lost_pattern(loss, 150, seed=3)
    model = model_pattern(loss, 150, seed=3)
    assert 0.12 <= sum(model) / len(model) <= 0.28
    lost_as_the_model_says(loss, rtts, chunks_lost, model)
    assert close_to(statistics.median([r for r, gone in zip(rtts, model, strict=True) if gone]), 44)


async def test_gilbert_elliott_loss_comes_in_bursts():
    loss = Loss("gilbert-elliott", p=0.05, r=0.2, rto_ms=40)
    _, rtts, chunks_lost = await lost_pattern(loss, 150, seed=3)
    model = model_pattern(loss, 150, seed=3)
    lost_as_the_model_says(loss, rtts, chunks_lost, model)
    assert sum(model) >= 5 and after_a_loss(model) > 0.5  # Bernoulli at this mean: 0.2


# -- faults
