"""Who holds a TCP port: the process behind an "Address already in use", read from /proc (Linux only).

Best effort, and only ever asked after a bind failed: a listener of another user, or a socket bound but not
yet listening, is not found (the caller then says nothing more). A Nearshore process is described by its
command line (``nearshore edge --config a.toml``); any other only by its name, since its command line may
hold a password.
"""

from __future__ import annotations

import os
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
_PROC = Path("/proc")


def who_holds(port: int) -> str | None:
    """A phrase for the error line, e.g. ``another edge holds it (pid 41: nearshore edge --config a.toml)``;
    None when the holder cannot be seen."""
    inodes = _listening_inodes(port)
    pid = _owner(inodes) if inodes else None
    if pid is None:
        return None
    if pid == os.getpid():
        return "this process holds it already (is one port named twice?)"
    argv = _argv(pid)
    if "nearshore" not in argv:
        return f"pid {pid} holds it ({_name(pid)})"
    command = argv[argv.index("nearshore") :]
    if command[1:2] == ["edge"]:
        return f"another edge holds it (pid {pid}: {' '.join(command)})"
    return f"pid {pid} holds it ({' '.join(command)})"


def _listening_inodes(port: int) -> set[int]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def _owner(inodes: set[int]) -> int | None:
    """The lowest pid with one of these sockets open (a supervisor before the workers it forked)."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in sorted((e for e in _PROC.iterdir() if e.name.isdigit()), key=lambda e: int(e.name)):
        try:
            if any(os.readlink(fd) in wanted for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:  # gone, or not ours to read
            continue
    return None


def _argv(pid: int) -> list[str]:
    """The command line; ``python -m nearshore`` and ``.../bin/nearshore`` both hold ``nearshore``."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    argv = raw.decode(errors="replace").rstrip("\0").split("\0")
    return [Path(arg).name if arg.endswith("/nearshore") else arg for arg in argv]


def _name(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return "unknown"
