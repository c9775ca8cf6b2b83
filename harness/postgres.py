"""A throwaway PostgreSQL server on a free loopback port (Debian's ``postgresql`` package): a fresh cluster
in a temp folder, password authentication, no fsync. For tests and benchmarks of the fleet stores.

PostgreSQL refuses to run as root; as root the cluster is made and run as the ``postgres`` user the
package creates (``setpriv``: the server stays the child, so stopping it stops the server)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness.procs import ManagedProcess, ProcessFailed, free_port

USER = "nearshore"


def postgres_bin() -> Path | None:
    """The folder of the newest installed server's programs (Debian keeps them off PATH), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    return Path(on_path).resolve().parent if on_path else None


class PostgresServer:
    """``start()`` waits until it accepts connections; ``stop()`` then ``start()`` keeps port and data."""

    def __init__(self, port: int | None = None, password: str = "nearshore-test") -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise ProcessFailed("PostgreSQL is not installed (Debian: apt-get install postgresql)")
        self.bindir = bindir
        self.port = port or free_port()
        self.password = password
        # Not under pytest's tmp_path: that is private to root, and the server may run as another user.
        self.folder = Path(tempfile.mkdtemp(prefix="nearshore-pg-"))
        self.data = self.folder / "data"
        self.process: ManagedProcess | None = None
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            self._as_user = [
                "setpriv",
                f"--reuid={owner.pw_uid}",
                f"--regid={owner.pw_gid}",
                "--clear-groups",
            ]
        self._initdb()

    def url(self, database: str = "nearshore") -> str:
        """The URL an edge is configured with: no password in it (that is PGPASSWORD's)."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    @property
    def env(self) -> dict[str, str]:
        return {"PGPASSWORD": self.password}

    def _initdb(self) -> None:
        pwfile = self.folder / "pw"
        pwfile.write_text(self.password)
        if self._as_user:
            shutil.chown(pwfile, "postgres")
        argv = [
            *self._as_user,
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        pwfile.unlink()
        if done.returncode:
            raise ProcessFailed(f"initdb failed:\n{done.stdout}{done.stderr}")

    def start(self, timeout_s: float = 30.0) -> PostgresServer:
        argv = [
            *self._as_user,
            str(self.bindir / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-k",
            str(self.folder),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]
        self.process = ManagedProcess("postgres", argv, self.folder / "postgres.log").start()
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self.process.proc is not None and self.process.proc.poll() is not None:
                raise ProcessFailed(f"postgres exited early:\n{self.process.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ProcessFailed(f"postgres not accepting connections on {self.port}")
            time.sleep(0.05)
        if not self._created:
            self.createdb("nearshore")
            self._created = True
        return self

    _created = False

    def ready(self) -> bool:
        done = subprocess.run(
            [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-q"],
            check=False,
        )
        return done.returncode == 0

    def createdb(self, name: str) -> None:
        self.sql(f'CREATE DATABASE "{name}"', database="postgres")

    def sql(self, statement: str, database: str = "nearshore") -> str:
        """Run one statement with psql; its output (tuples only)."""
        psql = self.bindir / "psql"
        argv = [str(psql), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d", database]
        argv += ["-v", "ON_ERROR_STOP=1", "-At", "-c", statement]
        done = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, **self.env}, check=False
        )
        if done.returncode:
            raise ProcessFailed(f"psql failed: {done.stderr.strip()}")
        return done.stdout

    def accepts_tcp(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
            return True
        return False

    def pause(self) -> None:
        """SIGSTOP the postmaster and its backends: connections stay open, nothing answers."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, signum: int) -> None:
        assert self.process is not None and self.process.proc is not None
        os.killpg(self.process.proc.pid, signum)

    def stop(self) -> None:
        """A fast shutdown (SIGINT: clients are disconnected at once), then the process is gone."""
        if self.process is None or self.process.proc is None:
            return
        proc = self.process.proc
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.stop()
        self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.remove()
