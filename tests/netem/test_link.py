"""The userspace link, toxic by toxic, on real sockets on 127.0.0.1; its control API; the tc backend.

Each toxic's test asserts its effect within a tolerance, at p50 where timing is involved: this runs on a
small, shared machine. Delays are small (2-50 ms) to keep the file fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from cli.link import links_from_args
from nearshore.config import ConfigError
from netem.control import create_control_app
from netem.fidelity import fidelity_check
from netem.link import LinkEmulator, LinkSet, make_lanes
from netem.link_config import parse_link_spec
from netem.profiles import Direction, Loss, Profile, Source, load_profile
from netem.tc import TcLink, choose_backend, netem_args, tbf_args, tc_netem_available
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


def mismatches(measured: list[bool], model: list[bool]) -> int:
    return sum(a != b for a, b in zip(measured, model, strict=True))


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
    lost, rtts, chunks_lost = await lost_pattern(loss, 150, seed=3)
    assert 0.12 <= sum(lost) / len(lost) <= 0.28
    # The chunks the model loses, and only those (a stall on a busy machine may blur one or two).
    assert mismatches(lost, model_pattern(loss, 150, seed=3)) <= 2
    assert abs(sum(lost) - chunks_lost) <= 1  # the warm-up may have been lost too
    assert close_to(statistics.median([r for r, gone in zip(rtts, lost, strict=True) if gone]), 44)


async def test_gilbert_elliott_loss_comes_in_bursts():
    loss = Loss("gilbert-elliott", p=0.05, r=0.2, rto_ms=40)
    lost, _, _ = await lost_pattern(loss, 150, seed=3)
    assert mismatches(lost, model_pattern(loss, 150, seed=3)) <= 2
    assert sum(lost) >= 5 and after_a_loss(lost) > 0.5  # Bernoulli at this mean: 0.2


# -- faults


async def test_reset_gives_the_client_a_connection_reset():
    async with server(echo) as port, linked(profile_of(2), port) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"ping")
        await reader.readexactly(4)
        await link.apply_fault("reset")
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 2)
        assert link.state().stats.resets == 1


async def test_blackhole_accepts_then_stalls_until_cleared():
    async with server(echo) as port, linked(profile_of(2), port) as link:
        await link.apply_fault("blackhole")
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"ping")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(4), 0.3)
        await link.apply_fault("clear")
        assert await asyncio.wait_for(reader.readexactly(4), 2) == b"ping"  # held, as TCP retransmits
        writer.close()


async def test_slow_close_delays_the_end_of_stream():
    async def greet_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        await writer.drain()

    async with server(greet_and_close) as port, linked(profile_of(5), port) as link:
        await link.apply_fault("slow_close", 300)
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        assert await reader.readexactly(5) == b"hello"
        greeted = now()
        assert await asyncio.wait_for(reader.read(), 2) == b""
        assert 0.27 <= now() - greeted <= 0.6
        writer.close()


async def test_down_refuses_and_cuts_then_up_accepts_again():
    async with server(echo) as port, linked(profile_of(2), port) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"ping")
        await reader.readexactly(4)
        await link.apply_fault("down")
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 2)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", link.port)
        await link.apply_fault("up")
        assert len(await ping_pongs(link.port, 2)) == 2


async def test_an_unreachable_target_resets_the_client():
    async with server(echo) as port:
        pass  # closed: nothing listens on port now
    async with linked(profile_of(2), port) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 5)
        writer.close()


# -- control API


async def test_control_api_changes_a_running_link():
    async with server(echo) as port:
        near = LinkEmulator("near", "127.0.0.1:0", ("127.0.0.1", port), profile_of(10), seed=1)
        far = LinkEmulator("far", "127.0.0.1:0", ("127.0.0.1", port), load_profile("lagos-london"), seed=1)
        links = LinkSet([near, far])
        await links.start()
        client = TestClient(TestServer(create_control_app(links)))
        await client.start_server()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", near.port)

            async def rtts(n: int) -> list[float]:
                out = []
                for _ in range(n):
                    started = now()
                    writer.write(b"ping")
                    await reader.readexactly(4)
                    out.append((now() - started) * 1000)
                return out

            # The fidelity of a delay is tested above; here, that a change shows on an open connection.
            await rtts(1)  # the handshake
            assert abs(statistics.median(await rtts(7)) - 20) < 4
            response = await client.put("/links/near", json={"delay_ms": 30})
            assert response.status == 200 and (await response.json())["rtt_ms"] == 60
            assert abs(statistics.median(await rtts(7)) - 60) < 4  # same connection, new delay
            response = await client.post("/links/near", json={"direction": "b_to_a", "delay_ms": 5})
            assert (await response.json())["profile"]["b_to_a"]["delay_ms"] == 5

            state = await (await client.get("/links")).json()
            assert [link["name"] for link in state["links"]] == ["near", "far"]
            stats = state["links"][0]["stats"]
            assert stats["connections"] == 1 and stats["bytes_a_to_b"] == 4 * 15  # 15 pings of 4 bytes
            assert stats["chunks_delayed"] > 0

            response = await client.put("/links/far", json={"delay_ms": 5})
            error = (await response.json())["error"]
            assert response.status == 400 and error["param"] == "a_to_b.delay_ms"
            assert "faster than light" in error["message"]
            response = await client.put("/links/far", json={"delay": 5})
            assert response.status == 400 and "delay" in (await response.json())["error"]["message"]
            assert (await client.get("/links/nowhere")).status == 404
            assert (await client.post("/links/near/faults/meteor")).status == 400

            response = await client.post("/links/near/faults/slow_close", json={"ms": 100})
            assert (await response.json())["faults"]["slow_close_ms"] == 100
            response = await client.post("/links/near/faults/reset")
            assert response.status == 200
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(reader.read(), 2)
            response = await client.post("/links/near/faults/clear")
            assert (await response.json())["faults"] == {
                "down": False,
                "blackhole": False,
                "slow_close_ms": 0,
            }
        finally:
            await client.close()
            await links.stop()


# -- fidelity


async def test_fidelity_of_a_long_link():
    report = await fidelity_check(load_profile("lagos-london"))
    assert report.rtt_ok, report
    assert abs(report.model_p50_ms - report.profile_rtt_ms) < 3 and not report.rates


async def test_fidelity_of_a_rate_limited_link():
    report = await fidelity_check(load_profile("lagos-4g"), seconds=1.0)
    assert [rate.way for rate in report.rates] == ["a_to_b", "b_to_a"]
    assert report.ok, report


# -- the command


def test_link_spec():
    entry = parse_link_spec("edge=127.0.0.1:0->[::1]:8200@lagos-london")
    assert (entry.name, entry.listen, entry.target, entry.profile) == (
        "edge",
        "127.0.0.1:0",
        "[::1]:8200",
        "lagos-london",
    )
    with pytest.raises(ValueError, match="NAME=HOST:PORT->HOST:PORT@PROFILE"):
        parse_link_spec("edge=127.0.0.1:0@lagos-london")


def test_links_from_a_config_file(tmp_path):
    config = tmp_path / "links.toml"
    config.write_text(
        'control = "127.0.0.1:9901"\nseed = 7\n'
        '[[links]]\nname = "up"\nlisten = "127.0.0.1:0"\ntarget = "127.0.0.1:8200"\n'
        'profile = "lagos-london"\n'
        '[[links]]\nname = "down"\nlisten = "127.0.0.1:0"\ntarget = "127.0.0.1:8201"\n'
        'profile = "lagos-london"\nreverse = true\n'
    )
    args = argparse.Namespace(config=str(config), link=[], control=None, seed=None, no_handshake=False)
    links, control = links_from_args(args)
    assert control == ("127.0.0.1", 9901) and list(links.links) == ["up", "down"]
    assert links.links["down"].profile.a == "london" and links.links["up"].profile.a == "lagos"
    config.write_text(config.read_text().replace('"lagos-london"\nreverse', '"atlantis"\nreverse'))
    with pytest.raises(ConfigError, match="unknown link profile 'atlantis'"):
        links_from_args(args)


async def test_link_command_prints_ready_and_serves():
    async with server(echo) as port:
        code = (
            "import argparse, sys; from cli.link import add_arguments, main; "
            "p = argparse.ArgumentParser(); add_arguments(p); sys.exit(main(p.parse_args()))"
        )
        argv = [sys.executable, "-c", code, "--link", f"metro=127.0.0.1:0->127.0.0.1:{port}@lagos-metro"]
        process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()  # type: ignore[union-attr]
            assert line.startswith("link metro: 127.0.0.1:") and "RTT 1 ms" in line
            ready = (await asyncio.wait_for(process.stdout.readline(), 10)).decode()  # type: ignore[union-attr]
            assert ready.startswith("ready {") and '"control": "http://127.0.0.1:' in ready
            link_port = int(line.split()[2].rsplit(":", 1)[1])
            assert len(await ping_pongs(link_port, 3)) == 3
        finally:
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 10) == 0


# -- tc backend


def test_tc_detection_says_why_not():
    ok, message = tc_netem_available()
    if ok:
        pytest.skip("this kernel has sch_netem")
    assert message.endswith("; using the userspace link emulator")
    if os.geteuid() == 0 and shutil.which("tc") and shutil.which("ip"):
        assert message.startswith("the kernel has no sch_netem qdisc (tc said: ")
        probes = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "nearshore-probe" not in probes  # the throwaway namespace is gone


def test_choose_backend(capsys):
    assert choose_backend("userspace") == "userspace"
    with pytest.raises(ValueError):
        choose_backend("carrier-pigeon")
    ok, message = tc_netem_available()
    assert choose_backend("tc") == ("tc" if ok else "userspace")
    if not ok:
        assert message in capsys.readouterr().err


def test_tc_commands_for_a_profile():
    profile = load_profile("lagos-4g")
    link = TcLink("l4g", profile)
    commands = [" ".join(argv) for argv in link.up_commands()]
    assert commands[:3] == [
        "ip netns add nearshore-l4g-a",
        "ip netns add nearshore-l4g-b",
        "ip link add veth-a netns nearshore-l4g-a type veth peer name veth-b netns nearshore-l4g-b",
    ]
    assert commands[-4:] == [
        "tc -n nearshore-l4g-a qdisc replace dev veth-a root handle 1: netem delay 20ms 7.5ms "
        "distribution pareto loss random 0.2% rate 10gbit limit 100000",
        "tc -n nearshore-l4g-a qdisc replace dev veth-a parent 1:1 handle 10: tbf rate 8000kbit burst 10000 "
        "latency 100ms",
        "tc -n nearshore-l4g-b qdisc replace dev veth-b root handle 1: netem delay 20ms 7.5ms "
        "distribution pareto loss random 0.2% rate 10gbit limit 100000",
        "tc -n nearshore-l4g-b qdisc replace dev veth-b parent 1:1 handle 10: tbf rate 20000kbit burst 25000 "
        "latency 100ms",
    ]
    assert link.down_commands() == [
        ["ip", "netns", "del", "nearshore-l4g-a"],
        ["ip", "netns", "del", "nearshore-l4g-b"],
    ]


def test_netem_arguments():
    plain = Direction(50.0)
    assert netem_args(plain) == ["netem", "delay", "50ms", "limit", "100000"]
    ge = Direction(10.0, 2.0, "uniform", Loss("gilbert-elliott", p=0.01, r=0.25, h=0.1, k=1.0))
    assert " ".join(netem_args(ge)) == (
        "netem delay 10ms 2ms loss gemodel 1% 25% 90% 0% rate 10gbit limit 100000"
    )
    assert tbf_args(Direction(1.0, rate_kbps=1000)) == [
        "tbf",
        "rate",
        "1000kbit",
        "burst",
        "3000",
        "latency",
        "100ms",
    ]
