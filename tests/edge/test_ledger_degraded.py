"""The ledger when its file refuses writes: another process holding the write lock, a full disk, a crash
with rows in the spool. Real SQLite, a real second process, a real (1 MB tmpfs) full disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from edge.ledger import Ledger, UsageRecord
from edge.ledger_spool import spool_path


def usage(request_id: str) -> UsageRecord:
    return UsageRecord(
        request_id=request_id,
        ts=time.time(),
        key_id="k1",
        tenant="acme",
        model="gemma-3-270m",
        region="london",
        prompt_tokens=10,
        cached_tokens=0,
        completion_tokens=5,
        cache_status="miss",
        cost_usd=0.001,
        status="ok",
        http_status=200,
    )


def rows(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("SELECT request_id FROM usage ORDER BY request_id")]
    finally:
        db.close()


@contextlib.contextmanager
def write_lock_held(path: Path) -> Iterator[subprocess.Popen]:
    """Another process (as an operator's sqlite3 shell would) holds the ledger's write lock until told."""
    script = (
        "import sqlite3, sys\n"
        f"db = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
        "db.execute('BEGIN IMMEDIATE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
        "db.execute('ROLLBACK')\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        if holder.poll() is None:
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
        holder.wait(timeout=10)


async def until(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def loop_lag_ms(work) -> tuple[float, object]:
    """The longest the event loop went without running a 5 ms ticker while ``work`` ran."""
    worst = 0.0
    stop = False

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            worst = max(worst, (now - last) * 1000)
            last = now

    task = asyncio.create_task(ticker())
    try:
        result = await work
    finally:
        stop = True
        await task
    return worst, result


async def test_a_locked_ledger_spools_without_blocking_and_replays_every_row_once_free(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    await ledger.record(usage("before"))
    with write_lock_held(path):

        async def write_all() -> None:
            for i in range(40):
                await ledger.record(usage(f"locked-{i:02d}"))

        lag_ms, _ = await loop_lag_ms(write_all())
        # A write waiting on the lock from the loop holds it for sqlite's wait (5 s); a busy machine's own
        # hiccups stay far below the bound.
        assert lag_ms < 1000, f"the loop stalled {lag_ms:.0f} ms behind a locked ledger"
        assert ledger.health() == "spooling" and ledger.accepting()
        assert spool_path(path, os.getpid()).exists()
        await asyncio.sleep(0.6)  # the replayer tries meanwhile, and is refused: nothing lost, nothing twice
        assert ledger.spooled_rows == 40
    await until(lambda: ledger.health() == "")
    assert rows(path) == ["before", *(f"locked-{i:02d}" for i in range(40))]
    assert not list(tmp_path.glob("ledger.sqlite3.spool-*"))
    await ledger.record(usage("after"))  # straight to the ledger again
    assert "after" in rows(path)
    await ledger.close()


async def test_rows_spooled_by_a_process_that_died_are_replayed_by_the_next_edge_once(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    Ledger(path)  # the schema
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(dead.stdout)
    encoder = msgspec.json.Encoder()
    # Its spool: two rows, one of which reached the ledger before the crash (replayed, it is not doubled),
    # and a torn last line.
    spool_path(path, dead_pid).write_bytes(
        encoder.encode(usage("spooled-1")) + b"\n" + encoder.encode(usage("spooled-2")) + b"\n" + b'{"requ'
    )
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO usage (request_id, ts, key_id, tenant, model, region, prompt_tokens, cached_tokens,"
        " completion_tokens, cache_status, cost_usd, status, http_status)"
        " VALUES ('spooled-2', 0, 'k1', 'acme', 'm', 'r', 1, 0, 1, 'miss', 0, 'ok', 200)"
    )
    db.commit()
    db.close()
    ledger = Ledger(path)
    assert ledger.health() == "spooling"
    await ledger.record(usage("new"))
    await until(lambda: ledger.health() == "")
    assert rows(path) == ["new", "spooled-1", "spooled-2"]
    assert not list(tmp_path.glob("ledger.sqlite3.spool-*"))
    await ledger.close()


async def test_closing_with_the_lock_still_held_leaves_the_rows_in_the_spool_for_the_next(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    with write_lock_held(path):
        for i in range(3):
            await ledger.record(usage(f"r{i}"))
        await ledger.close()  # its last replay is refused too
        assert list(tmp_path.glob("ledger.sqlite3.spool-*"))
    # The spool's owner has closed, not died: the next ledger in this process adopts its ".replay" file.
    again = Ledger(path)
    await again.record(usage("r3"))
    await until(lambda: again.health() == "")
    assert rows(path) == ["r0", "r1", "r2", "r3"]
    await again.close()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs (root only; skipped elsewhere)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 1):  # big writes, then the last bytes
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


async def test_a_full_disk_refuses_new_work_keeps_what_it_had_and_recovers_when_space_returns(tiny_disk):
    path = tiny_disk / "ledger.sqlite3"
    ledger = Ledger(path)
    await ledger.record(usage("before"))
    filler = fill(tiny_disk)
    written = 0
    for i in range(200):  # the WAL's free pages take some; then neither the ledger nor its spool can
        await ledger.record(usage(f"full-{i:03d}"))
        written += 1
        if not ledger.accepting():
            break
    assert not ledger.accepting() and ledger.health() == "unavailable", "a full disk went unnoticed"
    held = ledger.spooled_rows
    assert held >= 1
    filler.unlink()
    await until(lambda: ledger.health() == "", timeout_s=15)
    assert ledger.accepting()
    assert rows(path) == ["before", *(f"full-{i:03d}" for i in range(written))]
    await ledger.close()
