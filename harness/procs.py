"""Start Nearshore processes (and peers) for demos, benchmarks and tests; stop them without orphans.

Children die with their supervisor: each runs in its own session (so ``stop`` can end its whole process
group) and, on Linux, asks the kernel for SIGTERM when its parent dies, so a supervisor killed with
SIGKILL (``nearshore up``, a test runner) leaves nothing running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from nearshore.children import die_with_parent

# Under pytest-xdist, worker gwN hands out ports from its own span below the kernel's ephemeral range
# (32768 and up on Linux): two workers' binds to port 0 can both get a port that neither has started
# listening on yet, and then two servers ask for it.
_WORKER_SPANS_FROM, _WORKER_SPAN, _WORKER_SPANS = 12_000, 5_000, 4
_handed: dict[str, int] = {}  # per host: the last port handed out from this worker's span


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """A port nobody listens on now, for a server about to start; with ``count``, the first of that many in
    a row (a server that listens on port + i for its worker i)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else -1
    if not 0 <= index < _WORKER_SPANS:
        for _ in range(100):
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
                if _free(host, port + 1, count - 1):
                    return port
        raise OSError(f"no {count} free ports in a row on {host}")
    first = _WORKER_SPANS_FROM + index * _WORKER_SPAN
    # In turn through the span (from where the last run's ports are least likely to linger), skipping any
    # that is taken: a port is handed out again only after all the others.
    port = _handed.get(host, first + os.getpid() % _WORKER_SPAN)
    for _ in range(_WORKER_SPAN):
        port = first + (port + 1 - first) % _WORKER_SPAN
        if port + count <= first + _WORKER_SPAN and _free(host, port, count):
            _handed[host] = port + count - 1
            return port
    raise OSError(f"no {count} free ports in a row in {first}-{first + _WORKER_SPAN - 1} on {host}")


def _free(host: str, port: int, count: int) -> bool:
    """Whether ports port..port + count - 1 can all be bound now."""
    with contextlib.ExitStack() as held:
        for p in range(port, port + count):
            s = held.enter_context(socket.socket())
            try:
                s.bind((host, p))
            except OSError:
                return False
    return True


class ProcessFailed(RuntimeError):
    pass


class ManagedProcess:
    """A child process in its own process group, logging to a file, stopped on exit."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # its own process group, for stop()
            preexec_fn=die_with_parent(),
        )
        log.close()
        return self

    def restart(self) -> ManagedProcess:
        """Start it again after it exited: the same argv, environment and log file (appended to, after a
        line that marks the restart, so the log reads as one history)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.name} is still running (pid {self.proc.pid})")
        reason = exit_reason(self.proc.returncode) if self.proc is not None else "never started"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as log:
            log.write(f"--- nearshore: restarting {self.name} (it {reason}) ---\n")
        return self.start()

    def wait_http(
        self,
        url: str,
        timeout_s: float = 120.0,
        context: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Wait until ``url`` answers 200 (asked with ``headers``); fail early, with the log's tail, if the
        process dies."""
        deadline = time.monotonic() + timeout_s
        request = urllib.request.Request(url, headers=headers or {})
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise ProcessFailed(f"{self.name} exited early:\n{self.log_tail()}")
            with (
                contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, OSError),
                urllib.request.urlopen(request, timeout=2, context=context) as response,
            ):
                if response.status == 200:
                    return
            time.sleep(0.02)  # a refused connection costs little; a run makes hundreds of starts
        raise ProcessFailed(f"{self.name} not ready at {url} after {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def exit_reason(returncode: int) -> str:
    """How a child ended, in words: ``exited with code 3``, ``was killed by SIGKILL`` (Popen reports a
    signal as a negative return code)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"
