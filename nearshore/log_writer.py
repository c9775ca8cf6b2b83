"""Log lines written to stderr by a thread, so a log reader that falls behind never stops the event loop.

A process's stderr is often a pipe (a container runtime, a process manager, a log shipper). When its reader
stalls, the pipe fills (64 KiB) and the next write blocks: logging from the event loop then froze the whole
edge, every stream of every user with it (measured: an edge with JSON request logs stopped answering after
127 requests). Here a record is still formatted where it is logged (the same formatters, redaction
included), and the text goes to a bounded queue that one thread writes out; when the queue is full the line
is dropped and counted, and the thread says how many were dropped once it writes again.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import TextIO

MAX_QUEUED_LINES = 10_000  # about 5 MiB of JSON request lines; past it, lines are dropped, not the loop
FLUSH_WAIT_S = 2.0  # a flush (at exit) waits at most this for the queue: a dead reader cannot hold it


def dropped_lines(logger: logging.Logger | None = None) -> int:
    """Lines the process's background log writers dropped since start (the root logger's, by default): a
    process's ``/metrics`` shows it, so an operator learns that the log reader falls behind."""
    handlers = (logger or logging.getLogger()).handlers
    return sum(h.dropped for h in handlers if isinstance(h, BackgroundStreamHandler))


class BackgroundStreamHandler(logging.StreamHandler):
    """A stream handler whose writes happen in its own daemon thread."""

    def __init__(self, stream: TextIO, max_lines: int = MAX_QUEUED_LINES) -> None:
        super().__init__(stream)
        self.dropped = 0  # lines dropped because the queue was full (the reader fell behind)
        self._reported = 0
        self._lines: queue.Queue[str | None] = queue.Queue(max_lines)
        self._written = threading.Condition()
        self._pending = 0  # lines queued and not yet written
        self._thread = threading.Thread(target=self._run, name="log writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        with self._written:
            try:
                self._lines.put_nowait(text)
            except queue.Full:
                self.dropped += 1
                return
            self._pending += 1

    def flush(self) -> None:
        """Wait (at most FLUSH_WAIT_S) until the thread has written every queued line (it flushes the
        stream after each batch)."""
        if threading.current_thread() is self._thread:
            return
        with self._written:
            self._written.wait_for(lambda: self._pending == 0, FLUSH_WAIT_S)

    def close(self) -> None:
        self.flush()
        with contextlib.suppress(queue.Full):  # (full: the reader is gone; the thread ends with the process)
            self._lines.put_nowait(None)
        super().close()

    def _run(self) -> None:
        while True:
            batch = [self._lines.get()]
            while len(batch) < 256:
                try:
                    batch.append(self._lines.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            lines = [line for line in batch if line is not None]
            queued = len(lines)
            self._write(lines)
            with self._written:
                self._pending -= queued
                self._written.notify_all()
            if stop:
                return

    def _write(self, lines: list[str]) -> None:
        dropped = self.dropped
        if dropped > self._reported:  # after what was queued before the queue filled up
            lines.append(f"{dropped - self._reported} log lines were dropped: their reader fell behind\n")
            self._reported = dropped
        try:
            self.stream.write("".join(lines))
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: these lines are lost, not the process
            pass
