"""nearshore.file_watch: a file's writes wake the caller once per loop turn; a file deleted and made again
is watched again; where nothing can be watched the caller is told to poll (None)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from nearshore import file_watch
from nearshore.file_watch import FileWatch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")


class Calls:
    def __init__(self) -> None:
        self.count = 0
        self.event = asyncio.Event()

    def __call__(self) -> None:
        self.count += 1
        self.event.set()

    async def next(self) -> None:
        await asyncio.wait_for(self.event.wait(), 10)
        self.event.clear()


async def test_a_write_wakes_the_caller_once_per_loop_turn(tmp_path: Path):
    path = tmp_path / "keys.sqlite3"
    path.write_bytes(b"")
    calls = Calls()
    watch = FileWatch.start([path], calls)
    assert watch is not None and watch.watching == 1
    try:
        with path.open("ab") as f:  # several writes before the loop runs again: one call
            for _ in range(5):
                f.write(b"page")
                f.flush()
        await calls.next()
        await asyncio.sleep(0)
        assert calls.count == 1
        path.write_bytes(b"")  # a truncation is a write too
        await calls.next()
        assert calls.count == 2
    finally:
        watch.close()


async def test_nothing_written_nothing_called(tmp_path: Path):
    path, other, marker = tmp_path / "quiet", tmp_path / "other", tmp_path / "marker"
    for p in (path, other, marker):
        p.write_bytes(b"x")
    calls, marker_calls = Calls(), Calls()
    watch = FileWatch.start([path], calls)
    marked = FileWatch.start([marker], marker_calls)
    assert watch is not None and marked is not None
    try:
        other.write_bytes(b"a file beside it, written")
        path.read_bytes()  # and the watched file read
        marker.write_bytes(b"after the others")  # its call comes once the others' events are queued
        await marker_calls.next()
        await asyncio.sleep(0.05)
        assert calls.count == 0
    finally:
        watch.close()
        marked.close()


async def test_a_file_made_again_is_watched_again(tmp_path: Path):
    path, wal = tmp_path / "keys.sqlite3", tmp_path / "keys.sqlite3-wal"
    path.write_bytes(b"")
    calls = Calls()
    watch = FileWatch.start([path, wal], calls)  # the WAL does not exist yet
    assert watch is not None and watch.watching == 1
    try:
        wal.write_bytes(b"")
        watch.rewatch()  # the caller's poll does this; a write after it is seen
        assert watch.watching == 2
        with wal.open("ab") as f:
            f.write(b"frame")
        await calls.next()
        os.unlink(path)  # deleted: its watch ends, and the caller is told
        await calls.next()
        path.write_bytes(b"made again")
        watch.rewatch()
        await asyncio.sleep(0.05)  # let the made-again write's events, if any, arrive first
        calls.count = 0
        path.write_bytes(b"written again")
        await calls.next()
        assert calls.count >= 1
    finally:
        watch.close()


async def test_no_file_to_watch_means_poll(tmp_path: Path):
    assert FileWatch.start([tmp_path / "missing"], lambda: None) is None


async def test_without_inotify_the_caller_polls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "f"
    path.write_bytes(b"")
    monkeypatch.setattr(file_watch, "_libc", lambda: None)
    assert FileWatch.start([path], lambda: None) is None


async def test_closed_watch_calls_no_more(tmp_path: Path):
    path = tmp_path / "f"
    path.write_bytes(b"")
    calls = Calls()
    watch = FileWatch.start([path], calls)
    assert watch is not None
    watch.close()
    watch.close()  # twice is fine
    path.write_bytes(b"after close")
    await asyncio.sleep(0.05)
    assert calls.count == 0


async def test_a_broken_descriptor_stops_the_watch_instead_of_waking_on_it(tmp_path: Path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"")
    calls = Calls()
    watch = FileWatch.start([path], calls)
    assert watch is not None

    def broken(fd: int, n: int) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(file_watch.os, "read", broken)
    path.write_bytes(b"written")
    for _ in range(100):  # the loop turns; the reader runs once and takes itself off
        if watch.closed:
            break
        await asyncio.sleep(0.01)
    assert watch.closed and calls.count == 1  # told once more, to look now
    watch.close()
