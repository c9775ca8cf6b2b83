"""``python -m bench.wal_commits`` keeps working: both writers make every commit, and it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import wal_commits


def test_both_writers_make_every_commit(tmp_path: Path):
    times = wal_commits.run(40, 2, tmp_path)
    assert {name: len(took) for name, took in times.items()} == {
        "SQLite's own checkpoints": 40,
        "checkpoints in a thread": 40,
    }
    assert all(t > 0 for took in times.values() for t in took)


def test_the_command_prints_a_line_per_writer(capsys: pytest.CaptureFixture[str]):
    wal_commits.main(["--commits", "20", "--rounds", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" 20 commits")[0].strip() for line in lines] == [
        "SQLite's own checkpoints",
        "checkpoints in a thread",
    ]
