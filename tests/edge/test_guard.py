"""The edge's connection guard against a real edge process (uvloop, HTTPS with its dev certificate): the TLS
handshake runs on the header clock from accept, and every accepted socket counts against max_connections."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.edge_fixtures import EVENTUALLY_S, Edge, edge_over_pacer

pytestmark = pytest.mark.slow

HEADER_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    e = edge_over_pacer(
        tmp_path_factory.mktemp("guard"),
        "guard-pacer",
        {"server": {"header_timeout_s": HEADER_TIMEOUT_S}},
        tokens=1,
        interval_ms=1,
    )
    yield e
    e.stop()


def _address(edge: Edge) -> tuple[str, int]:
    return "127.0.0.1", int(edge.url.rsplit(":", 1)[1])


def client_hello(edge: Edge) -> bytes:
    """The bytes a real client opens its handshake with."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    session = edge.ssl_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        session.do_handshake()
    return outgoing.read()


def seconds_until_closed(sock: socket.socket, since: float, limit_s: float = 10.0) -> float:
    """Read until the edge closes the socket; the time from ``since``."""
    sock.settimeout(limit_s)
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while sock.recv(4096):
            pass
    return time.monotonic() - since


def health(edge: Edge) -> int:
    try:
        with urllib.request.urlopen(edge.url + "/health", timeout=3, context=edge.ssl_context()) as r:
            return r.status
    except (urllib.error.URLError, ConnectionError) as exc:
        return -1 if not isinstance(exc, urllib.error.HTTPError) else exc.code


def test_a_client_that_never_says_hello_is_closed_on_the_header_timeout(edge: Edge):
    started = time.monotonic()
    with socket.create_connection(_address(edge)) as sock:
        held_s = seconds_until_closed(sock, started)
    assert HEADER_TIMEOUT_S - 0.3 < held_s < HEADER_TIMEOUT_S + 6  # not asyncio's 60 s handshake allowance


def test_a_handshake_that_stalls_halfway_is_closed_on_the_header_timeout(edge: Edge):
    hello = client_hello(edge)
    started = time.monotonic()
    with socket.create_connection(_address(edge)) as sock:
        sock.sendall(hello[: len(hello) // 2])
        held_s = seconds_until_closed(sock, started)
    assert HEADER_TIMEOUT_S - 0.3 < held_s < HEADER_TIMEOUT_S + 6


def test_the_handshake_time_counts_against_the_header_timeout(edge: Edge):
    """A slow handshake followed by slow headers: closed on the clock from accept, not from the handshake."""
    started = time.monotonic()
    with socket.create_connection(_address(edge)) as plain:
        time.sleep(HEADER_TIMEOUT_S * 0.9)
        with edge.ssl_context().wrap_socket(plain, server_hostname="localhost") as tls:
            tls.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the head never ends
            held_s = seconds_until_closed(tls, started)
    # From accept: HEADER_TIMEOUT_S. Timed from the handshake's end, it would be 1.9 x HEADER_TIMEOUT_S.
    assert held_s < HEADER_TIMEOUT_S * 1.45


def test_handshaking_sockets_count_against_max_connections(tmp_path: Path):
    cap = 4
    edge = edge_over_pacer(
        tmp_path, "cap-pacer", {"server": {"max_connections": cap, "header_timeout_s": 10.0}}, tokens=1
    )
    silent: list[socket.socket] = []
    try:
        assert health(edge) == 200
        silent = [socket.create_connection(_address(edge)) for _ in range(cap)]  # never say hello
        time.sleep(0.3)  # let the edge accept them all
        started = time.monotonic()
        with socket.create_connection(_address(edge)) as over:
            assert seconds_until_closed(over, started, limit_s=8.0) < 5.0  # closed at once, not held 10 s
        assert health(edge) == -1  # a real client is refused too while the cap is taken
        for sock in silent:
            sock.close()
        deadline = time.monotonic() + EVENTUALLY_S
        while health(edge) != 200:  # the places come back as the sockets close
            assert time.monotonic() < deadline, "closed sockets still counted"
            time.sleep(0.1)
    finally:
        for sock in silent:
            sock.close()
        edge.stop()
