"""``server.workers = N``: N edge processes on one port, one event loop each, supervised.

The supervisor binds every listener before any worker starts: the public port once (one socket without
SO_REUSEPORT, so the port is this edge's alone: nearshore/listen.py says why) and worker i's metrics port
``metrics.port + i``. A port that cannot be had stops it there, with one line. It then starts
``nearshore edge --worker I`` N times, each inheriting the public socket and its own metrics socket (a new
connection goes to whichever worker accepts it first), forwards SIGTERM/SIGINT to them for a graceful
drain, and restarts a worker that dies (at most ``MAX_RESTARTS`` a minute, then it gives up and exits
non-zero for its own supervisor). A worker that exits with a config error is not restarted: the same config
fails the same way, so the edge stops at once. Workers die with it (a parent-death signal), even on
SIGKILL. Limits stay exact across workers because the config check requires the Redis limiter with more
than one.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from edge.config import EdgeConfig
from edge.node import metrics_address
from nearshore.children import die_with_parent, nearshore_argv
from nearshore.listen import BindError, Listener, handoff, listen, server_address

log = logging.getLogger("nearshore.edge.workers")
MAX_RESTARTS = 5
POLL_S = 0.2
CONFIG_ERROR = 2  # cli.main's status for a ConfigError


@dataclass
class SharedListeners:
    """The supervisor's sockets: the public one for every worker, and each worker's metrics one."""

    server: Listener
    metrics: list[Listener]  # worker i's at i; none with metrics.port = 0

    def of_worker(self, index: int) -> list[Listener]:
        return [self.server, *self.metrics[index : index + 1]]

    def close(self) -> None:
        for listener in [self.server, *self.metrics]:
            listener.close()


def bind_for_workers(config: EdgeConfig, port: int | None) -> SharedListeners:
    """Every listener of a ``server.workers`` edge; ``port``: the command line's ``--port``."""
    shared = SharedListeners(listen(server_address(config.server.host, config.server.port, port)), [])
    try:
        if config.metrics.port:
            for index in range(config.server.workers):
                shared.metrics.append(listen(metrics_address(config, index)))
    except BindError:
        shared.close()
        raise
    return shared


def _argv(args: argparse.Namespace, index: int, listeners: list[Listener]) -> list[str]:
    argv = ["edge", "--worker", str(index)]
    for listener in listeners:
        for spec in handoff(listener):
            argv += ["--listen-fd", spec]
    if args.config:
        argv += ["--config", args.config]
    if getattr(args, "log_format", None):
        argv += ["--log-format", args.log_format]
    if getattr(args, "verbose", False):
        return nearshore_argv("-v", *argv)
    return nearshore_argv(*argv)


def _start(args: argparse.Namespace, index: int, shared: SharedListeners) -> subprocess.Popen[bytes]:
    listeners = shared.of_worker(index)
    fds = [sock.fileno() for listener in listeners for sock in listener.sockets]
    return subprocess.Popen(_argv(args, index, listeners), pass_fds=fds, preexec_fn=die_with_parent())


def supervise(args: argparse.Namespace, config: EdgeConfig, shared: SharedListeners) -> int:
    workers = config.server.workers
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    children = [_start(args, i, shared) for i in range(workers)]
    pids = [c.pid for c in children]
    log.info("edge supervisor: %d workers on port %d (pids %s)", workers, shared.server.port, pids)
    restarts: list[float] = []
    status = 0
    while not stopping:
        time.sleep(POLL_S)
        for index, child in enumerate(children):
            code = child.poll()
            if code is None or stopping:
                continue
            if code == CONFIG_ERROR:
                log.error("worker %d exited with a config error (its line above): stopping", index)
                stopping, status = True, CONFIG_ERROR
                break
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < 60] + [now]
            if len(restarts) > MAX_RESTARTS:
                log.error("worker %d exited (%s); too many restarts in a minute: stopping", index, code)
                stopping, status = True, 1
                break
            log.warning("worker %d exited (%s); restarting it", index, code)
            children[index] = _start(args, index, shared)
    shared.close()  # new connections are refused once the draining workers have closed theirs too
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
