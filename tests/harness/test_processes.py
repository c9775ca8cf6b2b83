"""No orphaned processes: children die with a supervisor killed by SIGKILL, and a new run stops what a dead
run left behind (and nothing else)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.leftovers import RunRecord, start_time, stop_orphans
from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    return start_time(pid) is not None  # a zombie counts as gone


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


SUPERVISOR = """
import json, sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from tests.edge_fixtures import edge_over_pacer

edge = edge_over_pacer(Path({folder!r}), "orphan-pacer", tokens=1)
print(json.dumps([edge.process.proc.pid] + [p.proc.pid for p in edge.extra]), flush=True)
time.sleep(600)
"""


def test_children_die_with_a_supervisor_killed_by_sigkill(tmp_path: Path):
    script = tmp_path / "supervisor.py"
    script.write_text(SUPERVISOR.format(root=str(ROOT), folder=str(tmp_path / "run")))
    supervisor = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    children: list[int] = []
    try:
        assert supervisor.stdout is not None
        children = json.loads(supervisor.stdout.readline())
        assert len(children) == 2 and all(_alive(pid) for pid in children)  # the edge and its pacer
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(10)
        assert _wait_gone(children, timeout_s=5.0) == [], "children outlived their supervisor"
    finally:
        supervisor.kill()
        for pid in children:
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)


def _pacer(tmp_path: Path, name: str) -> ManagedProcess:
    port = free_port()
    process = ManagedProcess(name, nearshore_argv("pacer", "--port", str(port)), tmp_path / f"{name}.log")
    process.start().wait_http(f"http://127.0.0.1:{port}/health", timeout_s=30)
    return process


def test_a_new_run_stops_only_what_a_dead_run_left(tmp_path: Path):
    registry = tmp_path / "registry"
    registry.mkdir()
    orphan, owned = _pacer(tmp_path, "orphan"), _pacer(tmp_path, "owned")
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)  # not a nearshore process
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        pids = {name: p.proc.pid for name, p in (("orphan", orphan), ("owned", owned))} | {
            "sleep": stranger.pid
        }
        started = {name: start_time(pid) for name, pid in pids.items()}
        # A run whose launcher died: its nearshore child is a leftover; the stranger is not ours to stop,
        # and a recorded pid whose start time differs is some other process now.
        (registry / f"{dead.pid}.json").write_text(
            json.dumps(
                {
                    "run_dir": str(tmp_path / "dead-run"),
                    "supervisor": [dead.pid, 1],
                    "children": [
                        [pids["orphan"], started["orphan"]],
                        [pids["sleep"], started["sleep"]],
                        [pids["owned"], started["owned"] - 1],
                    ],
                }
            )
        )
        # A live run (this process) owns its child: left alone.
        live = RunRecord(tmp_path / "live-run", registry=registry)
        live.add(pids["owned"])

        assert stop_orphans(registry) == [pids["orphan"]]
        assert _wait_gone([pids["orphan"]], timeout_s=1.0) == []
        assert _alive(pids["owned"]) and stranger.poll() is None
        assert sorted(p.name for p in registry.iterdir()) == [f"{os.getpid()}.json"]
        assert stop_orphans(registry) == []  # nothing left to stop

        live.remove()
        assert list(registry.iterdir()) == []
    finally:
        stranger.kill()
        orphan.stop()
        owned.stop()


def test_each_test_worker_hands_out_ports_from_its_own_span(monkeypatch):
    """Two workers binding port 0 can both be given a port neither listens on yet: under pytest-xdist each
    worker takes its ports from its own span, in turn, skipping a port that is taken."""
    from harness import procs

    spans = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setattr(procs, "_handed", {})
        spans[worker] = [free_port() for _ in range(20)]
        assert len(set(spans[worker])) == 20
    assert not set(spans["gw0"]) & set(spans["gw1"]) and not set(spans["gw1"]) & set(spans["gw2"])
    assert all(p < 32768 for ports in spans.values() for p in ports)  # below the kernel's ephemeral ports
    # A port someone listens on is skipped. Tried in the last span, which `make test`'s three workers leave
    # unused: in gw1's own span, gw1's servers may hold the very ports the test expects.
    last = f"gw{procs._WORKER_SPANS - 1}"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", last)
    monkeypatch.setattr(procs, "_handed", {})
    start = free_port()
    monkeypatch.setattr(procs, "_handed", {"127.0.0.1": start})
    nxt = start + 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", nxt))
        taken.listen()
        assert free_port() == nxt + 1
        # Two in a row (a server on port + i for its worker i): the pair is free, and handed out once.
        pair = free_port(count=2)
        assert pair > nxt + 1 and free_port() == pair + 2
    monkeypatch.delenv("PYTEST_XDIST_WORKER")  # outside the workers: the kernel's choice, its neighbour free
    port = free_port(count=2)
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", port))
        b.bind(("127.0.0.1", port + 1))
