"""CPU time of a process tree, read from /proc: what a proxy (with its workers and children) spent."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from harness.procs import ManagedProcess


def _thread_cpu_s(pid: int) -> float:
    """CPU time (user + system) of one process's live threads, in seconds, to the nanosecond."""
    total_ns, found = 0, False
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
                found = True
    if found:
        return total_ns / 1e9
    with contextlib.suppress(OSError, ValueError, IndexError):  # no schedstat: clock ticks, 10 ms steps
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tree_cpu_s(root: int) -> float:
    """CPU time of a process and all its descendants (nginx's workers, LiteLLM's children)."""
    return sum(_thread_cpu_s(pid) for pid in _descendants(root))


def process_cpu_s(process: ManagedProcess | None) -> float:
    """A started process tree's CPU time; 0 for none (the direct path has no proxy)."""
    if process is None or process.proc is None:
        return 0.0
    return tree_cpu_s(process.proc.pid)


def idle_cpu(processes: dict[str, ManagedProcess], seconds: float = 3.0) -> dict[str, float]:
    """CPU milliseconds per second each process burns with no load: its timers and health checks, and on
    a virtual machine the cost of waking a cold process, which the per-stream numbers at x1 include."""
    before = {name: process_cpu_s(p) for name, p in processes.items()}
    time.sleep(seconds)
    return {name: (process_cpu_s(p) - before[name]) * 1000 / seconds for name, p in processes.items()}
