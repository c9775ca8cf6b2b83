"""A run's processes never outlive it unnoticed: each run records its supervisor and children, and a new
run first stops the children of any run whose supervisor has died.

Children normally die with their supervisor (``harness.procs`` arms a parent-death signal), but a child
that ignores SIGTERM, or one started where that signal cannot be armed, would be left running, holding
CPU, memory and ports, with nothing left that knows how to stop it. Those are stopped. A run whose
supervisor is alive is not a leftover and is left alone: runs share no ports or folders, so they do not
collide. Identity is checked before any signal: the pid's start time (pids are reused) and a command line
that runs ``nearshore``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from edge.config import DATA_DIR

REGISTRY = DATA_DIR / "runs" / "active"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux ``/proc``), or None when it is gone.

    A zombie counts as gone: it runs nothing and its parent (or init) will reap it.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": comm may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of stat(5), counting from the state's 3


def runs_nearshore(pid: int) -> bool:
    """Whether the command line runs ``nearshore`` (``python -m nearshore ...`` or the script)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"nearshore" in argv or any(Path(a.decode(errors="replace")).name == "nearshore" for a in argv)


class RunRecord:
    """This process's entry in the registry: its pid and start time, and each child's."""

    def __init__(self, run_dir: Path, registry: Path = REGISTRY) -> None:
        self.path = registry / f"{os.getpid()}.json"
        self.data = {
            "run_dir": str(run_dir),
            "supervisor": [os.getpid(), start_time(os.getpid())],
            "children": [],
        }

    def add(self, pid: int) -> None:
        self.data["children"].append([pid, start_time(pid)])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.path)  # a reader never sees half a record

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _same(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


def stop_orphans(registry: Path = REGISTRY, timeout_s: float = 5.0) -> list[int]:
    """Stop the children of every recorded run whose supervisor is gone; returns the pids stopped."""
    stopped: list[int] = []
    for path in sorted(registry.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            supervisor, supervisor_started = record["supervisor"]
            children = [(int(pid), started) for pid, started in record["children"]]
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)  # unreadable: nothing in it can be trusted to signal
            continue
        if _same(supervisor, supervisor_started):
            continue  # a live run owns its children
        orphans = [pid for pid, started in children if _same(pid, started) and runs_nearshore(pid)]
        _terminate(orphans, timeout_s)
        stopped += orphans
        path.unlink(missing_ok=True)
    return stopped


def _terminate(pids: list[int], timeout_s: float) -> None:
    # Each child leads its own process group (start_new_session): signal the group, grandchildren too.
    started = {pid: start_time(pid) for pid in pids}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_same(pid, s) for pid, s in started.items()):
        time.sleep(0.05)
    for pid, s in started.items():
        if _same(pid, s):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
