"""A throwaway redis-server on a free loopback port, for tests and benchmarks: no persistence, its files in a
folder of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import time
from pathlib import Path

from harness.procs import ManagedProcess, ProcessFailed, free_port


class RedisServer:
    """``start()`` waits until it answers PING; ``stop()`` then ``start()`` again keeps the same port."""

    def __init__(self, folder: Path, port: int | None = None, binary: str | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.binary = binary or shutil.which("redis-server") or "/usr/bin/redis-server"
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        argv = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        argv += ["--dir", str(self.folder)]
        self.process = ManagedProcess("redis", argv, self.folder / "redis.log").start()
        deadline = time.monotonic() + timeout_s
        while not self.ping():
            if self.process.proc is not None and self.process.proc.poll() is not None:
                raise ProcessFailed(f"redis-server exited early:\n{self.process.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ProcessFailed(f"redis-server not answering on {self.port}")
            time.sleep(0.02)
        return self

    def ping(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
        return False

    def pause(self) -> None:
        """SIGSTOP: connections still open, but nothing answers (a hung server, not a dead one)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        assert self.process is not None and self.process.proc is not None
        os.kill(self.process.proc.pid, signum)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
