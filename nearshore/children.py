"""How a Nearshore process starts its children: the command line that runs ``nearshore`` in this
interpreter, and the kernel's parent-death signal, so a supervisor killed with SIGKILL leaves nothing running.

The edge's worker supervisor and the harness's process helpers both start children this way.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _prctl()  # looked up before any fork: the child only calls it


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send the child SIGTERM when this process dies; None where
    there is no such thing.

    The kernel's "parent" is the thread that forks, so this is only armed from the main thread: a child
    started from a worker thread would be killed when that thread ends.
    """
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl, parent = _PRCTL, os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed: nobody would send it
            os._exit(1)

    return arm


def nearshore_argv(*args: str) -> list[str]:
    """The ``nearshore`` command run by this interpreter (works inside a venv without PATH)."""
    return [sys.executable, "-m", "nearshore", *args]
