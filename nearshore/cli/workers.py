"""``server.workers = N``: N edge processes on one port (SO_REUSEPORT), one event loop each, supervised.

The supervisor binds nothing itself: it starts ``nearshore edge --worker I`` N times with the same config and
port (the kernel spreads new connections across their sockets), forwards SIGTERM/SIGINT to them for a
graceful drain, and restarts a worker that dies (at most ``MAX_RESTARTS`` a minute, then it gives up and
exits non-zero for its own supervisor). Workers die with it (a parent-death signal), even on SIGKILL.
Limits stay exact across workers because the config check requires the Redis limiter with more than one.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import time

from nearshore.procs import die_with_parent, free_port, nearshore_argv

log = logging.getLogger("nearshore.edge.workers")
MAX_RESTARTS = 5
POLL_S = 0.2


def _argv(args: argparse.Namespace, port: int, index: int) -> list[str]:
    argv = ["edge", "--port", str(port), "--worker", str(index)]
    if args.config:
        argv += ["--config", args.config]
    if getattr(args, "log_format", None):
        argv += ["--log-format", args.log_format]
    if getattr(args, "verbose", False):
        return nearshore_argv("-v", *argv)
    return nearshore_argv(*argv)


def _start(args: argparse.Namespace, port: int, index: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(_argv(args, port, index), preexec_fn=die_with_parent())


def supervise(args: argparse.Namespace, workers: int, host: str, configured_port: int) -> int:
    port = args.port if args.port is not None else configured_port
    if port == 0:  # every worker must bind the same port: pick it once
        port = free_port(host)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    children = [_start(args, port, i) for i in range(workers)]
    log.info("edge supervisor: %d workers on port %d (pids %s)", workers, port, [c.pid for c in children])
    restarts: list[float] = []
    status = 0
    while not stopping:
        time.sleep(POLL_S)
        for index, child in enumerate(children):
            code = child.poll()
            if code is None or stopping:
                continue
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < 60] + [now]
            if len(restarts) > MAX_RESTARTS:
                log.error("worker %d exited (%s); too many restarts in a minute: stopping", index, code)
                stopping, status = True, 1
                break
            log.warning("worker %d exited (%s); restarting it", index, code)
            children[index] = _start(args, port, index)
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
    print(f"nearshore edge: {workers} workers stopped", file=sys.stderr)
    return status
