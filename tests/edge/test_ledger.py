"""The usage ledger (group commit, reports, surviving SIGKILL) and the price table."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cli.keys import add_usage_arguments, run_usage
from edge.billing import Price, PriceTable
from edge.ledger import Ledger, ReportRow, UsageRecord

REPO = Path(__file__).resolve().parents[2]
DAY1 = datetime(2026, 3, 1, tzinfo=UTC).timestamp()
DAY2 = datetime(2026, 3, 2, tzinfo=UTC).timestamp()


def usage(request_id: str, key_id: str = "k1", ts: float = DAY1 + 60, **fields) -> UsageRecord:
    values = {
        "request_id": request_id,
        "ts": ts,
        "key_id": key_id,
        "tenant": f"tenant-{key_id}",
        "model": "gemma-3-270m",
        "region": "london",
        "prompt_tokens": 10,
        "cached_tokens": 2,
        "completion_tokens": 5,
        "cache_status": "miss",
        "cost_usd": 0.001,
        "status": "ok",
        "http_status": 200,
    }
    return UsageRecord(**{**values, **fields})


def stored_ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT request_id FROM usage ORDER BY rowid")]


async def test_recorded_rows_are_committed(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    await ledger.record(usage("r1", cost_usd=0.25))
    # Another connection (as another process would) sees it at once: record() returned after the commit.
    assert stored_ids(ledger.path) == ["r1"]
    await ledger.record(usage("r2", cost_usd=0.5))
    await ledger.record(usage("r3", key_id="k2", cost_usd=1.0))
    assert ledger.spent_usd("k1") == pytest.approx(0.75)
    assert ledger.spent_usd("nobody") == 0.0
    await ledger.close()
    with pytest.raises(RuntimeError):
        await ledger.record(usage("late"))


async def test_concurrent_records_are_all_stored_in_few_commits(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    commits = 0
    original = ledger._write

    def counting_write(db, batch):
        nonlocal commits
        commits += 1
        original(db, batch)

    ledger._write = counting_write  # type: ignore[method-assign]
    await asyncio.gather(*(ledger.record(usage(f"r{i}")) for i in range(500)))
    await ledger.close()
    assert sorted(stored_ids(ledger.path)) == sorted(f"r{i}" for i in range(500))
    assert commits < 500  # grouped: the writer took many queued records per commit


async def test_a_bad_record_fails_alone_and_the_writer_keeps_serving(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    bad = usage("bad", prompt_tokens=None)  # NOT NULL: the insert fails
    results = await asyncio.gather(
        ledger.record(usage("a")), ledger.record(bad), ledger.record(usage("b")), return_exceptions=True
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], sqlite3.IntegrityError)
    with pytest.raises(sqlite3.Error):
        await ledger.record(usage("worse", model=["not", "a", "string"]))
    await ledger.record(usage("c"))
    await ledger.close()
    assert sorted(stored_ids(ledger.path)) == ["a", "b", "c"]


async def test_report_groups_by_key_and_utc_day(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    records = [
        usage("1", "k1", DAY1 + 10, prompt_tokens=100, cached_tokens=40, completion_tokens=7, cost_usd=0.5),
        usage(
            "2", "k1", DAY1 + 86_399, prompt_tokens=50, cached_tokens=0, completion_tokens=3, cost_usd=0.25
        ),
        usage("3", "k1", DAY2, prompt_tokens=1, cached_tokens=0, completion_tokens=1, cost_usd=1.0),
        usage("4", "k2", DAY1 + 5, prompt_tokens=9, cached_tokens=9, completion_tokens=0, cost_usd=0.125),
    ]
    await asyncio.gather(*(ledger.record(r) for r in records))
    rows = ledger.report()
    assert rows == [
        ReportRow(
            key_id="k1", tenant="tenant-k1", day="2026-03-01", requests=2,
            prompt_tokens=150, cached_tokens=40, completion_tokens=10, cost_usd=0.75,
        ),
        ReportRow(
            key_id="k2", tenant="tenant-k2", day="2026-03-01", requests=1,
            prompt_tokens=9, cached_tokens=9, completion_tokens=0, cost_usd=0.125,
        ),
        ReportRow(
            key_id="k1", tenant="tenant-k1", day="2026-03-02", requests=1,
            prompt_tokens=1, cached_tokens=0, completion_tokens=1, cost_usd=1.0,
        ),
    ]  # fmt: skip
    assert [r.day for r in ledger.report(since=DAY2)] == ["2026-03-02"]
    assert [(r.day, r.key_id) for r in ledger.report(until=DAY2)] == [
        ("2026-03-01", "k1"),
        ("2026-03-01", "k2"),
    ]
    assert ledger.report(since=DAY2 + 1) == []
    await ledger.close()


def test_price_table_cost():
    table = PriceTable(
        {
            "big": Price(input=1.0, cached_input=0.1, output=2.0),
            "plain": Price(input=0.5, output=0.5),
            "local": Price(free=True),
        }
    )
    # (600 fresh * 1.0 + 400 cached * 0.1 + 500 out * 2.0) / 1e6
    assert table.cost("big", 1000, 400, 500) == pytest.approx(1640 / 1e6)
    assert table.cost("big", 0, 0, 0) == 0.0
    assert table.cost("plain", 1000, 400, 1000) == pytest.approx(1000 / 1e6)  # cached costs input
    assert table.cost("big", 10, 50, 0) == pytest.approx(10 * 0.1 / 1e6)  # cached is capped at the prompt
    assert table.cost("local", 1000, 0, 1000) == 0.0
    assert table.worst_case("big", 100, 10) == pytest.approx(120 / 1e6)


def test_a_region_of_its_own_price_bills_what_it_served_and_the_hold_is_the_dearest():
    table = PriceTable(
        {
            "big": Price(input=1.0, output=2.0),
            "big@partner": Price(input=3.0, output=6.0),  # a provider's price for the same model
            "big@ours": Price(free=True),
        }
    )
    assert table.cost("big", 1000, 0, 500) == pytest.approx(2000 / 1e6)  # no region: the model's price
    assert table.cost("big", 1000, 0, 500, region="london") == pytest.approx(2000 / 1e6)
    assert table.cost("big", 1000, 0, 500, region="partner") == pytest.approx(6000 / 1e6)
    assert table.cost("big", 1000, 0, 500, region="ours") == 0.0
    # Held before a region is chosen: the most it can cost anywhere.
    assert table.worst_case("big", 1000, 500) == pytest.approx(6000 / 1e6)


def test_a_price_needs_its_numbers_or_free():
    assert Price(free=True).problem() is None
    assert Price(input=1.0, output=2.0).problem() is None
    assert "free = true" in (Price().problem() or "")
    assert "free = true" in (Price(input=1.0).problem() or "")
    assert Price(free=True, output=1.0).problem()


CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from edge.ledger import Ledger, UsageRecord

    async def writer(ledger, name):
        for i in range(100_000):
            rid = f"{name}-{i}"
            await ledger.record(UsageRecord(
                request_id=rid, ts=time.time(), key_id="k", tenant="t", model="m", region="r",
                prompt_tokens=1, cached_tokens=0, completion_tokens=1, cache_status="miss",
                cost_usd=0.0, status="ok", http_status=200))
            print(rid, flush=True)

    async def main():
        ledger = Ledger(sys.argv[1])
        await asyncio.wait_for(asyncio.gather(*(writer(ledger, f"w{n}") for n in range(4))), 30)

    asyncio.run(main())
    """
)


def test_no_acknowledged_record_is_lost_on_sigkill(tmp_path: Path):
    path = tmp_path / "ledger.sqlite3"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        printed: list[str] = []
        deadline = time.monotonic() + 20
        while len(printed) < 50:
            line = child.stdout.readline()  # type: ignore[union-attr]
            assert line, f"child exited early with {child.poll()}"
            printed.append(line.strip())
            assert time.monotonic() < deadline
        os.kill(child.pid, signal.SIGKILL)
        rest, _ = child.communicate(timeout=10)  # lines already in the pipe were acknowledged too
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    printed += [line.strip() for line in rest.splitlines() if line.strip()]
    stored = set(stored_ids(path))
    missing = [rid for rid in printed if rid not in stored]
    assert not missing, f"{len(missing)} acknowledged records lost: {missing[:5]}"


async def test_usage_cli_prints_days_keys_and_a_total(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    await ledger.record(usage("1", "k1", DAY1 + 1, cost_usd=0.5))
    await ledger.record(usage("2", "k2", DAY2 + 1, cost_usd=0.25))
    await ledger.close()
    parser = argparse.ArgumentParser()
    add_usage_arguments(parser)
    # run_usage drives its own event loop, so it runs in a thread here, beside the test's loop.
    code = await asyncio.to_thread(run_usage, parser.parse_args(["--db", str(path)]))
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert [line.split()[:2] for line in lines[1:3]] == [["2026-03-01", "k1"], ["2026-03-02", "k2"]]
    assert lines[-1].split()[0] == "total" and lines[-1].split()[-1] == "0.750000"
    args = parser.parse_args(["--db", str(path), "--since", "2026-03-02", "--until", "2026-03-02"])
    await asyncio.to_thread(run_usage, args)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "k2" in lines[1]
    assert run_usage(parser.parse_args(["--db", str(tmp_path / "none.sqlite3")])) == 1
