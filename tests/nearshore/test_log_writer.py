"""Log lines written by a thread: a record is formatted where it is logged and written in order; a reader
that stops reading costs dropped lines (counted, then said), never a blocked caller; at exit what is
queued is written, within a bound."""

from __future__ import annotations

import io
import logging
import threading

from nearshore.log_writer import BackgroundStreamHandler, dropped_lines


class StalledStream(io.StringIO):
    """A stream whose reader has stopped: every write waits until ``resume`` (as a full pipe's would)."""

    def __init__(self) -> None:
        super().__init__()
        self.resume = threading.Event()
        self.blocked = threading.Event()  # a write is waiting

    def write(self, text: str) -> int:
        self.blocked.set()
        self.resume.wait()
        return super().write(text)


def logger_with(handler: logging.Handler, name: str) -> logging.Logger:
    logger = logging.getLogger(f"test.log_writer.{name}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    return logger


def test_lines_are_formatted_where_logged_and_written_in_order():
    stream = io.StringIO()
    handler = BackgroundStreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logger_with(handler, "order")
    for n in range(500):
        log.info("line %d", n)
    handler.flush()  # waits for the thread to write what was queued
    assert stream.getvalue().splitlines() == [f"INFO line {n}" for n in range(500)]
    handler.close()


def test_a_stalled_reader_drops_lines_instead_of_blocking_and_says_how_many():
    stream = StalledStream()
    handler = BackgroundStreamHandler(stream, max_lines=10)
    log = logger_with(handler, "stalled")
    log.info("first")
    assert stream.blocked.wait(30)  # the thread is stuck writing "first"; the caller is not
    for n in range(25):
        log.info("more %d", n)  # 10 fit in the queue, 15 are dropped: none of these calls waits
    assert handler.dropped == 15
    assert dropped_lines(log) == 15  # what /metrics shows
    stream.resume.set()
    handler.flush()  # the queue written out: what comes next finds room
    log.info("after")
    handler.flush()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "first"
    assert lines[1:11] == [f"more {n}" for n in range(10)]
    assert lines[11] == "15 log lines were dropped: their reader fell behind"
    assert lines[12:] == ["after"]
    handler.close()


def test_a_flush_waits_for_a_dead_reader_only_so_long(monkeypatch):
    monkeypatch.setattr("nearshore.log_writer.FLUSH_WAIT_S", 0.05)
    stream = StalledStream()
    handler = BackgroundStreamHandler(stream)
    log = logger_with(handler, "dead")
    log.info("never read")
    assert stream.blocked.wait(30)
    handler.close()  # returns although the line is still not written (the process may exit)
    stream.resume.set()


def test_a_broken_stream_loses_its_lines_not_the_thread():
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    handler = BackgroundStreamHandler(Broken())
    log = logger_with(handler, "broken")
    log.info("lost")
    handler.flush()
    log.info("also lost, but the thread is alive to take it")
    handler.flush()
    handler.close()
