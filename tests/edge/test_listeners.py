"""Listeners that cannot bind, and an edge's port that is its own (issue 19, items 5 and 6).

Every listener that cannot bind stops its process at once with one line: the setting, the address, the OS's
reason (and who holds the port, when it can be seen). A second edge cannot join a ``server.workers`` edge's
port: the supervisor's one socket, inherited by its workers, has no SO_REUSEPORT to share.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

import nearshore.listen
from harness.procs import free_port
from nearshore.children import nearshore_argv
from nearshore.listen import Address, BindError, listen
from nearshore.tomlw import dumps
from tests.conftest import write_region_config
from tests.edge_fixtures import start_edge, start_pacer
from tests.redis_server import RedisServer

# A start that fails on a port does so before anything is built: well within this, even on a busy machine.
QUICK_S = 20.0


@contextlib.contextmanager
def held(port: int) -> Iterator[socket.socket]:
    """Another process's listener on ``port`` (this test process's, as far as the edge can tell)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield sock


def edge_config(folder: Path, **sections: dict[str, object]) -> Path:
    """An edge config of its own keys and ledger, plain HTTP, one (absent) region."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "keys_db": str(folder / "keys.sqlite3"),
        "ledger_db": str(folder / "ledger.sqlite3"),
        "tls": {"enabled": False},
        "regions": [{"name": "elsewhere", "url": "http://127.0.0.1:1"}],
        **sections,
    }
    path = folder / "edge.toml"
    path.write_text(dumps(config))
    return path


def failed_start(*args: str) -> tuple[int, str, float]:
    """Run ``nearshore ARGS`` that must stop by itself: its status, its output and how long it took."""
    started = time.monotonic()
    done = subprocess.run(nearshore_argv(*args), capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def the_line(output: str) -> str:
    """The one error line, and nothing that looks like a traceback or a restart."""
    assert "Traceback" not in output and "restarting" not in output, output
    [line] = [line for line in output.splitlines() if "cannot listen" in line]
    assert line.startswith("nearshore: config error: "), line
    return line


# --- the socket module's own view -------------------------------------------------------------------


def test_a_listen_that_fails_after_its_bind_is_one_error(monkeypatch):
    """Two edges starting at once, both with SO_REUSEADDR: both binds succeed and the later listen fails
    (uvloop swallowed that one, and aiohttp died on ``None.getsockname()``)."""
    port = free_port()
    with socket.socket() as rival:
        rival.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rival.bind(("127.0.0.1", port))

        class LosesTheRace(socket.socket):
            def listen(self, backlog: int = 0) -> None:
                rival.listen()  # the other edge listens between this one's bind and its listen
                super().listen(backlog)

        monkeypatch.setattr(nearshore.listen.socket, "socket", LosesTheRace)  # the sockets listen() makes
        with pytest.raises(BindError) as caught:
            listen(Address("metrics.port", "127.0.0.1", port))
        monkeypatch.undo()
    assert str(caught.value).startswith(
        f"metrics.port: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert "this process holds it already" in str(caught.value)


def test_a_port_past_65535_says_so():
    with pytest.raises(
        BindError, match=r"metrics\.port: cannot listen on 127\.0\.0\.1:65536 \(metrics\.port \+ 1"
    ):
        listen(Address("metrics.port", "127.0.0.1", 65536, why="metrics.port + 1"))


# --- real processes ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_edge_on_the_same_metrics_port_stops_at_once_with_one_line(tmp_path):
    pacer = start_pacer(tmp_path)
    metrics_port = free_port()
    first = start_edge(tmp_path / "first", [("r", pacer.url)], metrics={"port": metrics_port})
    try:
        config = edge_config(
            tmp_path / "second", server={"port": free_port()}, metrics={"port": metrics_port}
        )
        status, output, took_s = failed_start("edge", "--config", str(config))
        line = the_line(output)
        assert status == 2 and took_s < QUICK_S, (status, took_s)
        assert f"metrics.port: cannot listen on 127.0.0.1:{metrics_port}: Address already in use" in line
        assert "another edge holds it" in line and str(tmp_path / "first" / "edge.toml") in line
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=5):
            pass  # the first edge's metrics listener is untouched
        assert first.process.proc is not None and first.process.proc.poll() is None
    finally:
        first.stop()
        pacer.process.stop()


@pytest.mark.slow
@pytest.mark.parametrize("from_flag", [False, True])
def test_a_taken_server_port_is_one_line(tmp_path, from_flag):
    port = free_port()
    config = edge_config(tmp_path, server={"port": 1 if from_flag else port}, metrics={"port": 0})
    with held(port):
        status, output, took_s = failed_start(
            "edge", "--config", str(config), *(["--port", str(port)] if from_flag else [])
        )
    line = the_line(output)
    assert status == 2 and took_s < QUICK_S, (status, took_s)
    why = " (from --port)" if from_flag else ""
    assert f"server.port: cannot listen on 127.0.0.1:{port}{why}: Address already in use; pid " in line


@pytest.mark.slow
def test_a_workers_metrics_port_clash_names_the_setting_and_why(tmp_path):
    metrics_port = free_port(count=2)  # worker 1's metrics port is metrics.port + 1
    config = edge_config(
        tmp_path,
        server={"port": free_port(), "workers": 2},
        # Never reached: the supervisor stops on the port before any worker starts.
        limits={"backend": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0"},
        metrics={"port": metrics_port},
    )
    with held(metrics_port + 1):
        status, output, took_s = failed_start("edge", "--config", str(config))
    line = the_line(output)
    assert status == 2 and took_s < QUICK_S, (status, took_s)
    assert (
        f"metrics.port: cannot listen on 127.0.0.1:{metrics_port + 1} (metrics.port + 1, because "
        "server.workers = 2: worker i listens on metrics.port + i): Address already in use" in line
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", metrics_port))  # worker 0's port, bound first, was given back


@pytest.mark.slow
def test_a_worker_that_fails_its_config_is_not_restarted(tmp_path):
    """A worker's config error is permanent: the supervisor stops at once instead of restarting it."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    config = edge_config(
        tmp_path,
        ledger_db=str(blocker / "ledger.sqlite3"),  # fails when the worker builds the edge
        server={"port": free_port(), "workers": 2},
        limits={"backend": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0"},
        metrics={"port": 0},
    )
    status, output, took_s = failed_start("edge", "--config", str(config))
    assert status == 2 and took_s < QUICK_S, (status, took_s, output)
    assert "ledger_db" in output and "restarting" not in output and "Traceback" not in output, output


async def models_status(url: str, key: str) -> int:
    # A connection of its own for each request, as a kernel spreading connections would need.
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        await r.read()
        return r.status


@pytest.mark.slow
async def test_a_second_workers_edge_cannot_join_the_port(tmp_path):
    """The second edge, of other regions and another keys file and ledger, would answer 401 to the first
    edge's key: every request of the burst is the first edge's."""
    redis = RedisServer(tmp_path / "redis").start()
    pacer = start_pacer(tmp_path)
    limits = {"backend": "redis", "redis_url": redis.url}
    try:
        first = start_edge(
            tmp_path / "first",
            [("first-region", pacer.url)],
            server={"workers": 2},
            limits=limits,
            metrics={"port": 0},
            tls={"enabled": False},
        )
        try:
            key = first.new_key()
            port = int(first.url.rsplit(":", 1)[1])
            config = edge_config(
                tmp_path / "second", server={"port": port, "workers": 2}, limits=limits, metrics={"port": 0}
            )
            status, output, took_s = failed_start("edge", "--config", str(config))
            line = the_line(output)
            assert status == 2 and took_s < QUICK_S, (status, took_s)
            assert f"server.port: cannot listen on 127.0.0.1:{port}: Address already in use" in line
            assert "another edge holds it" in line and str(tmp_path / "first" / "edge.toml") in line
            statuses = await asyncio.gather(*(models_status(first.url, key) for _ in range(40)))
            assert statuses == [200] * 40
        finally:
            first.stop()
    finally:
        pacer.process.stop()
        redis.stop()


@pytest.mark.slow
def test_a_regions_port_clash_is_one_line(tmp_path):
    port = free_port()
    config = write_region_config(tmp_path / "region.toml", port, {})
    with held(port):
        status, output, took_s = failed_start("region", "--config", str(config))
    line = the_line(output)
    assert status == 2 and took_s < QUICK_S, (status, took_s)
    assert f"server.port: cannot listen on 127.0.0.1:{port}: Address already in use; pid " in line
