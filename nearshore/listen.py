"""Listening sockets that Nearshore binds itself, before aiohttp sees them, and how a port stays one edge's.

Why not let aiohttp's ``TCPSite`` bind: under uvloop a ``listen()`` that fails after its ``bind()`` worked
(two processes starting at once, both with SO_REUSEADDR: both binds succeed, the later listen fails) is
swallowed, and aiohttp then dies on ``None.getsockname()``. Bound here with the plain socket module, every
failure is one :class:`BindError` naming the setting, the address and the OS's reason, before any service is
built; and a bound socket can be handed to another process.

Port ownership: a ``server.workers = N`` edge serves its public port from one socket, bound without
SO_REUSEPORT by its supervisor and inherited by each worker (:func:`handoff`, :func:`inherit`), the way
gunicorn and uvicorn share a port between workers. The kernel then refuses the port to every other process,
an edge or not, and it stays held while a worker restarts. SO_REUSEPORT would let any process of the same
user join and take a share of the connections; a lock file would stop only the processes that look for it,
in the same directory.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from nearshore.port_holder import who_holds

# A burst of new connections waits in the kernel instead of being dropped (capped by net.core.somaxconn).
BACKLOG = 1024


@dataclass(frozen=True)
class Address:
    """Where a listener binds, and the setting that chose it (for the error line)."""

    setting: str  # "server.port", "metrics.port"
    host: str
    port: int
    why: str = ""  # how the port follows from the setting, when it is not the setting's own value

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def server_address(host: str, port: int, flag_port: int | None = None) -> Address:
    """A service's ``server.port``, or the command line's ``--port`` (``flag_port``) in its place."""
    if flag_port is None:
        return Address("server.port", host, port)
    return Address("server.port", host, flag_port, why="from --port")


class BindError(Exception):
    """A listener that cannot bind: permanent, so the process stops at once with this one line."""

    def __init__(self, address: Address, cause: OSError) -> None:
        why = f" ({address.why})" if address.why else ""
        held = who_holds(address.port) if cause.errno == errno.EADDRINUSE else None
        reason = (cause.strerror or str(cause)) + (f"; {held}" if held else "")
        super().__init__(f"{address.setting}: cannot listen on {address}{why}: {reason}")
        self.address = address


@dataclass
class Listener:
    """One address's listening sockets (a host name may resolve to an IPv4 and an IPv6 address)."""

    address: Address
    sockets: list[socket.socket]

    @property
    def port(self) -> int:
        return self.sockets[0].getsockname()[1]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def listen(address: Address) -> Listener:
    """Bind and listen on every address ``address.host`` resolves to; port 0: one free port for all."""
    if not 0 <= address.port <= 65535:
        raise BindError(address, OSError(errno.EINVAL, "not a port (0 to 65535)"))
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, sockaddr in _resolve(address):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart binds over TIME_WAIT
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # its IPv4 twin has a socket
            port = sockets[0].getsockname()[1] if len(sockets) > 1 else address.port
            sock.bind((sockaddr[0], port, *sockaddr[2:]))
            sock.listen(BACKLOG)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise BindError(address, exc) from None
    return Listener(address, sockets)


def _resolve(address: Address) -> list[tuple]:
    infos = socket.getaddrinfo(
        address.host or None, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    unique = {info[4][:2]: info for info in infos}  # glibc may list an address once per protocol
    return list(unique.values())


def handoff(listener: Listener) -> list[str]:
    """``setting=fd`` for each socket, for a child started with these fds in ``pass_fds``."""
    return [f"{listener.address.setting}={sock.fileno()}" for sock in listener.sockets]


def inherited_fds(specs: list[str]) -> dict[str, list[int]]:
    """The fds a parent handed over, by setting (the inverse of :func:`handoff`)."""
    fds: dict[str, list[int]] = {}
    for spec in specs:
        setting, _, fd = spec.partition("=")
        fds.setdefault(setting, []).append(int(fd))
    return fds


def inherit(address: Address, fds: list[int]) -> Listener:
    """The listener a parent bound, from the fds it handed over."""
    return Listener(address, [socket.socket(fileno=fd) for fd in fds])


async def start_sites(
    runner: web.BaseRunner, listener: Listener, ssl_context: ssl.SSLContext | None = None
) -> None:
    """Serve ``runner`` (already set up) on each of the listener's sockets."""
    for sock in listener.sockets:
        await web.SockSite(runner, sock, ssl_context=ssl_context, backlog=BACKLOG).start()


async def serve(
    runner: web.BaseRunner,
    listener: Listener,
    *,
    on_ready: Callable[[int], None] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run ``runner``'s app on ``listener`` until SIGTERM or SIGINT, or until ``stop`` is set."""
    await runner.setup()
    await start_sites(runner, listener, ssl_context)
    if on_ready is not None:
        on_ready(listener.port)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        # Stops accepting, lets in-flight responses finish (up to the shutdown timeout), then cleans up.
        await runner.cleanup()
