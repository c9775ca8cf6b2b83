"""A model file's facts worked out once and kept (regional/model_facts.py): read back while the file is the
same, worked out again when it changes or the kept copy is unreadable, and never in the way when the cache
folder cannot be written."""

from __future__ import annotations

import os
from pathlib import Path

from regional.model_facts import remembered


class Scan:
    def __init__(self, value: int) -> None:
        self.value, self.calls = value, 0

    def __call__(self) -> int:
        self.calls += 1
        return self.value


def test_a_fact_is_worked_out_once_per_file(tmp_path: Path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    scan = Scan(48)
    assert remembered(str(model), "longest_token_bytes", scan, tmp_path / "facts") == 48
    assert remembered(str(model), "longest_token_bytes", scan, tmp_path / "facts") == 48
    assert scan.calls == 1
    # Another fact of the same file is its own scan, kept beside the first.
    other = Scan(7)
    assert remembered(str(model), "other", other, tmp_path / "facts") == 7
    assert remembered(str(model), "longest_token_bytes", scan, tmp_path / "facts") == 48
    assert (scan.calls, other.calls) == (1, 1)


def test_a_changed_file_is_scanned_again(tmp_path: Path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    remembered(str(model), "longest_token_bytes", Scan(48), tmp_path / "facts")
    model.write_bytes(b"other weights")  # another size
    assert remembered(str(model), "longest_token_bytes", Scan(93), tmp_path / "facts") == 93
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # same size, touched
    assert remembered(str(model), "longest_token_bytes", Scan(50), tmp_path / "facts") == 50


def test_an_unreadable_kept_copy_or_an_unwritable_folder_costs_only_the_scan(tmp_path: Path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    facts = tmp_path / "facts"
    remembered(str(model), "longest_token_bytes", Scan(48), facts)
    for kept in facts.iterdir():
        kept.write_text("{half a fi")
    assert remembered(str(model), "longest_token_bytes", Scan(48), facts) == 48
    assert remembered(str(model), "longest_token_bytes", Scan(0), facts) == 48  # the scan kept again

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder would be")
    scan = Scan(48)
    assert remembered(str(model), "longest_token_bytes", scan, blocked / "facts") == 48
    assert remembered(str(model), "longest_token_bytes", scan, blocked / "facts") == 48
    assert scan.calls == 2
    assert remembered(str(tmp_path / "missing.gguf"), "longest_token_bytes", Scan(5), facts) == 5
