"""The userspace link: an asyncio TCP proxy that gives each direction a profile's delay, jitter, loss and
rate, and can fail on purpose. It runs on any kernel (this machine's has no sch_netem; see netem/tc.py).

A link listens on one address and forwards each accepted connection to a target; "a" is the side that
connects, "b" the target. Each direction of each connection has a reader (recv, stamp the arrival time)
and a pump (run the chunk through the toxics of netem/toxics.py, wait until it is due, send). Delays
apply per chunk (per recv), not per packet or per message. TCP_NODELAY is set on both sockets, so no
Nagle delay adds to the emulated one.

Faults: ``reset`` cuts every open connection with RST; ``blackhole`` holds all data (connections are
accepted and stall; held data flows again on ``clear``, as TCP would retransmit it); ``slow_close`` delays
each end of stream by N ms; ``down`` refuses new connections and resets open ones; ``up`` and ``clear``
undo them. Several links run in one process as a :class:`LinkSet`, changed through netem/control.py;
``nearshore link`` (cli/link.py) runs them from flags or a file (netem/link_config.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Iterable
from typing import Literal, get_args

import msgspec

from netem import geo_floor
from netem.profiles import WAYS, LinkOverride, Profile, apply_override, check_profile
from netem.toxics import Chunk, Lane, Pipeline, build_chain, now

log = logging.getLogger("nearshore.link")

Fault = Literal["reset", "blackhole", "slow_close", "down", "up", "clear"]
FAULTS: tuple[str, ...] = get_args(Fault)
READ_BYTES = 65536
CONNECT_TIMEOUT_S = 10.0


def parse_hostport(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class FaultState(msgspec.Struct):
    down: bool
    blackhole: bool
    slow_close_ms: float


class LinkStats(msgspec.Struct):
    connections: int
    open_connections: int
    resets: int
    bytes_a_to_b: int
    bytes_b_to_a: int
    chunks_a_to_b: int
    chunks_b_to_a: int
    chunks_delayed: int
    chunks_lost: int


class LinkState(msgspec.Struct):
    name: str
    listen: str
    target: str
    rtt_ms: float
    floor_rtt_ms: float
    profile: Profile
    faults: FaultState
    stats: LinkStats


def make_lanes(name: str, profile: Profile, seed: int) -> dict[str, Lane]:
    """Both directions of a link; each draws from its own stream, seeded by seed, link and direction."""
    floor_ms = geo_floor.floor_one_way_ms(geo_floor.distance_km(profile.a, profile.b))
    return {way: Lane(profile.way(way), f"{seed}:{name}:{way}", floor_ms) for way in WAYS}


class LinkEmulator:
    """One emulated link. ``listen`` port 0 picks a free port; read ``port`` after ``start()``.

    Jitter and loss draw from ``random.Random`` seeded per link and direction, so a run with the same
    seed and the same chunks draws the same delays."""

    def __init__(
        self,
        name: str,
        listen: str | tuple[str, int],
        target: str | tuple[str, int],
        profile: Profile,
        seed: int = 0,
        *,
        handshake: bool = True,
    ) -> None:
        self.name = name
        self.listen_host, self.port = parse_hostport(listen) if isinstance(listen, str) else listen
        self.target_host, self.target_port = parse_hostport(target) if isinstance(target, str) else target
        check_profile(profile)
        self.profile = profile
        self.lanes = make_lanes(name, profile, seed)
        rtt = self._rtt_s if handshake else None
        self.chains = {
            "a_to_b": build_chain(self.lanes["a_to_b"], rtt),
            "b_to_a": build_chain(self.lanes["b_to_a"]),
        }
        self.clock = _Clock()
        self.flowing = asyncio.Event()  # cleared while blackholed
        self.flowing.set()
        self.down = False
        self.connections: set[_Connection] = set()
        self.connections_total = 0
        self.resets = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    def _rtt_s(self) -> float:
        return self.profile.rtt_ms / 1000

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.port}"

    @property
    def target(self) -> str:
        return f"{self.target_host}:{self.target_port}"

    async def start(self) -> None:
        await self._listen()

    async def stop(self) -> None:
        await self._close_listener()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5)

    # -- settings and faults

    def set_profile(self, profile: Profile) -> None:
        """Swap the whole profile; the next chunk of every connection sees it."""
        check_profile(profile)
        self.profile = profile
        floor_ms = geo_floor.floor_one_way_ms(geo_floor.distance_km(profile.a, profile.b))
        for way, lane in self.lanes.items():
            lane.settings = profile.way(way)
            lane.floor_s = floor_ms / 1000

    def override(self, override: LinkOverride) -> Profile:
        self.set_profile(apply_override(self.profile, override))
        return self.profile

    async def apply_fault(self, fault: str, ms: float = 0.0) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r} (one of: {', '.join(FAULTS)})")
        if fault == "reset":
            self._reset_all()
        elif fault == "blackhole":
            self.flowing.clear()
        elif fault == "slow_close":
            for lane in self.lanes.values():
                lane.slow_close_s = max(0.0, ms) / 1000
        elif fault == "down":
            self.down = True
            await self._close_listener()
        elif fault == "up":
            await self._come_up()
        else:  # clear
            self.flowing.set()
            for lane in self.lanes.values():
                lane.slow_close_s = 0.0
            await self._come_up()

    def state(self) -> LinkState:
        up, down = self.lanes["a_to_b"], self.lanes["b_to_a"]
        return LinkState(
            name=self.name,
            listen=self.listen,
            target=self.target,
            rtt_ms=self.profile.rtt_ms,
            floor_rtt_ms=round(self.profile.floor_rtt_ms, 2),
            profile=self.profile,
            faults=FaultState(self.down, not self.flowing.is_set(), up.slow_close_s * 1000),
            stats=LinkStats(
                connections=self.connections_total,
                open_connections=len(self.connections),
                resets=self.resets,
                bytes_a_to_b=up.bytes,
                bytes_b_to_a=down.bytes,
                chunks_a_to_b=up.chunks,
                chunks_b_to_a=down.chunks,
                chunks_delayed=up.chunks_delayed + down.chunks_delayed,
                chunks_lost=up.chunks_lost + down.chunks_lost,
            ),
        )

    # -- the listener

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._on_client, self.listen_host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]  # the picked one, for port 0

    async def _close_listener(self) -> None:
        """Stop accepting (new connections are refused) and reset the open ones."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self._reset_all()
        if server is not None:
            with contextlib.suppress(TimeoutError):  # 3.12+ waits for the reset connections to detach
                await asyncio.wait_for(server.wait_closed(), 5)

    async def _come_up(self) -> None:
        self.down = False
        if self._server is None:
            await self._listen()

    def _reset_all(self) -> None:
        for connection in list(self.connections):
            connection.reset()
            self.resets += 1

    async def _on_client(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve_client(client_r, client_w)
        finally:
            self._handlers.discard(task)

    async def _serve_client(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.down:  # accepted in the instant before the listener closed
            abort_with_rst(client_w)
            return
        _nodelay(client_w)
        try:
            target_r, target_w = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            log.info("link %s: cannot reach %s: %s", self.name, self.target, exc)
            abort_with_rst(client_w)  # the client sees its connection reset, as a refused one would
            return
        _nodelay(target_w)
        connection = _Connection(self, client_r, client_w, target_r, target_w)
        self.connections.add(connection)
        self.connections_total += 1
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)


class _Clock:
    """Sleeps that land on time on average. The event loop wakes late: about a millisecond for a short
    sleep (epoll and libuv timers count whole ms), and more the longer the sleep on a virtual machine. So
    a long wait first sleeps most of the way, then a short sleep ends early by the mean lateness seen so
    far: the error is centred on zero instead of always adding."""

    def __init__(self, lateness_s: float = 0.0008) -> None:
        self.lateness_s = lateness_s
        self.sleeps = 0

    async def sleep_until(self, at: float) -> bool:
        wait = at - now()
        if wait <= 0:
            return False
        if wait > 0.005:
            await asyncio.sleep(wait * 0.97 - 0.002)
        wake = at - self.lateness_s
        if wake > now():
            await asyncio.sleep(wake - now())
            late = min(now() - wake, 0.005)  # a stall is not the timer's lateness
            self.sleeps += 1
            self.lateness_s += (late - self.lateness_s) / min(self.sleeps + 1, 20)
        elif at - now() < 0.002:
            # Too short for a timer to land on (sub-ms metro links): yield to the loop until it is time.
            while now() < at:
                await asyncio.sleep(0)
        return True


class _Window:
    """Bytes of one connection and direction inside the link; the reader waits while it is full."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.inflight = 0
        self.room = asyncio.Event()
        self.room.set()

    async def wait_for_room(self) -> None:
        while self.inflight >= self.lane.window_bytes():
            self.room.clear()
            await self.room.wait()

    def release(self, n: int) -> None:
        self.inflight -= n
        self.room.set()


class _Connection:
    """One client connection and its connection to the target: two directions, each a reader and a pump."""

    def __init__(
        self,
        link: LinkEmulator,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        target_r: asyncio.StreamReader,
        target_w: asyncio.StreamWriter,
    ) -> None:
        self.link = link
        self.client_r, self.client_w = client_r, client_w
        self.target_r, self.target_w = target_r, target_w
        self.tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        self.tasks = [
            asyncio.create_task(self._carry(self.client_r, self.target_w, "a_to_b")),
            asyncio.create_task(self._carry(self.target_r, self.client_w, "b_to_a")),
        ]
        try:
            await asyncio.gather(*self.tasks)
        except (OSError, asyncio.IncompleteReadError):
            self.reset()  # one side broke: the other side sees a reset too, as end to end
            return
        except asyncio.CancelledError:
            self.reset()
            return
        for writer in (self.client_w, self.target_w):
            writer.close()

    def reset(self) -> None:
        for task in self.tasks:
            task.cancel()
        abort_with_rst(self.client_w)
        abort_with_rst(self.target_w)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, way: str) -> None:
        lane = self.link.lanes[way]
        pipeline = Pipeline(self.link.chains[way])
        window = _Window(lane)
        arrivals: asyncio.Queue[Chunk | BaseException] = asyncio.Queue()
        receiving = asyncio.create_task(self._receive(reader, arrivals, window, lane))
        try:
            while True:
                chunk = await arrivals.get()
                if isinstance(chunk, BaseException):
                    raise chunk
                delayed = False
                for out in pipeline.run(chunk):
                    await self.link.flowing.wait()  # blackhole: hold everything
                    delayed = await self.link.clock.sleep_until(out.at) or delayed
                    if out.eof:
                        if writer.can_write_eof():
                            writer.write_eof()
                        return
                    writer.write(out.data)
                    await writer.drain()
                lane.chunks_delayed += delayed
                window.release(len(chunk.data))
        finally:
            receiving.cancel()

    @staticmethod
    async def _receive(
        reader: asyncio.StreamReader,
        arrivals: asyncio.Queue[Chunk | BaseException],
        window: _Window,
        lane: Lane,
    ) -> None:
        try:
            while True:
                await window.wait_for_room()
                data = await reader.read(READ_BYTES)
                arrivals.put_nowait(Chunk(data, now()))  # stamped on arrival, whatever the pump is doing
                if not data:
                    return
                window.inflight += len(data)
                lane.bytes += len(data)
                lane.chunks += 1
        except OSError as exc:
            arrivals.put_nowait(exc)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def abort_with_rst(writer: asyncio.StreamWriter) -> None:
    """Close so the peer gets RST, not FIN: SO_LINGER on with a zero timeout, then close at once."""
    sock = writer.get_extra_info("socket")
    if sock is not None and not writer.transport.is_closing():
        with contextlib.suppress(OSError, ValueError):  # uvloop: ValueError once the fd is gone
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class LinkSet:
    """The links of one topology, run in one process and reached by name."""

    def __init__(self, links: Iterable[LinkEmulator]) -> None:
        self.links: dict[str, LinkEmulator] = {}
        for link in links:
            if link.name in self.links:
                raise ValueError(f"two links named {link.name!r}")
            self.links[link.name] = link

    def get(self, name: str) -> LinkEmulator | None:
        return self.links.get(name)

    async def start(self) -> None:
        try:
            for link in self.links.values():
                await link.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for link in self.links.values():
            await link.stop()

    def state(self) -> list[LinkState]:
        return [link.state() for link in self.links.values()]
