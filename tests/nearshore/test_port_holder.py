"""Who holds a TCP port (nearshore/port_holder.py), read from /proc after a bind failed: this process, another
edge or Nearshore process by its command line, any other process by its name only (its command line may hold
a password); nobody when no socket listens there. Real sockets, and one short child process per holder."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nearshore.port_holder import who_holds

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")

# A child that listens on a free loopback port, says which, and holds it until its stdin closes.
HOLDER = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', 0))\n"
    "s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "sys.stdin.read()\n"
)


@contextmanager
def holder(*argv: str) -> Iterator[tuple[int, int]]:
    """(pid, port) of a child listening with ``argv`` after its code on its command line."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(child.stdout.readline())
        yield child.pid, port
    finally:
        child.stdin.close()
        child.wait(timeout=10)
        child.stdout.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nobody_listening_is_none():
    assert who_holds(free_port()) is None


def test_a_socket_bound_but_not_listening_is_not_found():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert who_holds(s.getsockname()[1]) is None


def test_this_process_is_told_it_holds_the_port_already():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert who_holds(port) == "this process holds it already (is one port named twice?)"
    assert who_holds(port) is None  # closed: nobody


def test_an_ipv6_listener_is_found_too():
    try:
        s = socket.socket(socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 here")
    with s:
        try:
            s.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback here")
        s.listen()
        assert who_holds(s.getsockname()[1]) == "this process holds it already (is one port named twice?)"


def test_another_edge_is_named_with_its_command_line():
    with holder("nearshore", "edge", "--config", "a.toml") as (pid, port):
        assert who_holds(port) == f"another edge holds it (pid {pid}: nearshore edge --config a.toml)"


def test_another_nearshore_process_run_from_a_venvs_bin_is_named_by_its_command():
    with holder("/opt/venv/bin/nearshore", "region", "--config", "r.toml") as (pid, port):
        assert who_holds(port) == f"pid {pid} holds it (nearshore region --config r.toml)"


def test_any_other_process_is_named_by_its_name_never_its_command_line():
    with holder("--password=hunter2") as (pid, port):
        said = who_holds(port)
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        assert said == f"pid {pid} holds it ({name})"
        assert "hunter2" not in said and "import socket" not in said
