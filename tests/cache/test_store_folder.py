"""The cache's index folder accounting (cache/store_folder.py): files counted by partition as they are
written, least recently used first; a recount from the real folder (temporary files, stray ones removed,
orphaned IVF files named); and the eviction of the least recently used partitions back within both limits,
sparing one a writer holds or another process used since."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cache.store_folder import USED_TOUCH_S, FolderUsage, evict


def write(path: Path, nbytes: int, mtime_s: float | None = None) -> None:
    path.write_bytes(b"\0" * nbytes)
    if mtime_s is not None:
        os.utime(path, (mtime_s, mtime_s))


def test_written_bytes_are_counted_per_partition_least_recently_used_first(tmp_path: Path):
    usage = FolderUsage(tmp_path)
    usage.wrote("a", 100, now_s=1.0)
    usage.wrote("b", 50, now_s=2.0)
    usage.wrote("a", 10, now_s=3.0)
    assert usage.bytes == 160 and len(usage.partitions) == 2
    assert usage.oldest(5) == [("b", 2.0), ("a", 3.0)]
    assert usage.oldest(1) == [("b", 2.0)]
    assert usage.partitions["a"].rows_bytes == 110
    # A write dated earlier than its last use (clocks of other processes) never moves the use back.
    usage.wrote("a", 0, now_s=0.5)
    assert usage.partitions["a"].used_s == 3.0


def test_an_ivf_file_replaces_its_partitions_earlier_count(tmp_path: Path):
    usage = FolderUsage(tmp_path)
    usage.wrote("a", 100, now_s=1.0)
    usage.saved_ivf("a", 40)
    usage.saved_ivf("a", 60)  # rewritten, larger
    assert usage.bytes == 160 and usage.partitions["a"].ivf_bytes == 60
    usage.saved_ivf("gone", 500)  # a partition removed while its build ran: not counted
    assert usage.bytes == 160 and "gone" not in usage.partitions


def test_a_lookup_moves_its_partition_last_and_asks_for_an_mtime_refresh_at_most_every_touch_interval(
    tmp_path: Path,
):
    usage = FolderUsage(tmp_path)
    usage.wrote("a", 100, now_s=1.0)
    usage.wrote("b", 100, now_s=2.0)
    assert usage.used("a", 100, now_s=1000.0) is True
    assert usage.used("a", 100, now_s=1000.0 + USED_TOUCH_S - 1) is False
    assert usage.used("a", 100, now_s=1000.0 + USED_TOUCH_S) is True
    assert [p for p, _ in usage.oldest(2)] == ["b", "a"]
    # A partition another process wrote since the last recount is counted on its first lookup.
    assert usage.used("c", 70, now_s=1020.0) is True
    assert usage.bytes == 270 and [p for p, _ in usage.oldest(3)] == ["b", "a", "c"]


def test_removed_partitions_give_back_all_their_bytes(tmp_path: Path):
    usage = FolderUsage(tmp_path)
    usage.wrote("a", 100, now_s=1.0)
    usage.saved_ivf("a", 30)
    usage.wrote("b", 5, now_s=2.0)
    usage.removed("a")
    usage.removed("never-there")
    assert usage.bytes == 5 and list(usage.partitions) == ["b"]


def test_over_is_either_limit_passed(tmp_path: Path):
    usage = FolderUsage(tmp_path)
    usage.wrote("a", 100, now_s=1.0)
    usage.wrote("b", 100, now_s=2.0)
    assert not usage.over(max_partitions=2, budget_bytes=200)
    assert usage.over(max_partitions=1, budget_bytes=10_000)
    assert usage.over(max_partitions=10, budget_bytes=199)


def test_a_recount_reads_the_folder_as_it_is(tmp_path: Path):
    now = time.time()
    write(tmp_path / "a.vec", 320, now - 50)
    write(tmp_path / "a.ids", 160, now - 40)
    write(tmp_path / "a.ivf", 64, now - 30)
    write(tmp_path / "a.ivf.lock", 0, now - 30)
    write(tmp_path / "b.vec", 32, now - 500)
    write(tmp_path / "b.ids", 16, now - 500)
    write(tmp_path / "a.ivf.1234.tmp", 7, now)  # a writer's temporary file, in progress: counted
    write(tmp_path / "c.vec.tmp", 9, now - 7200)  # left by a process that died: removed
    write(tmp_path / "orphan.ivf", 11, now - 120)  # its rows were removed while a build ran
    write(tmp_path / "young.ivf", 13, now - 5)  # a build saving now may be about to add its rows
    usage = FolderUsage(tmp_path)
    usage.wrote("b", 48, now_s=now)  # used by this process since its files were written
    orphans = usage.recount()
    assert orphans == ["orphan"]
    assert not (tmp_path / "c.vec.tmp").exists() and (tmp_path / "a.ivf.1234.tmp").exists()
    assert usage.bytes == 320 + 160 + 64 + 48 + 7 + 11 + 13
    a, b = usage.partitions["a"], usage.partitions["b"]
    assert (a.rows_bytes, a.ivf_bytes) == (480, 64) and abs(a.used_s - (now - 30)) < 1e-3
    assert b.used_s == now  # this process's later use is kept
    assert [p for p, _ in usage.oldest(10)] == ["orphan", "a", "young", "b"]
    assert usage.counted_s <= time.monotonic()


def test_an_empty_folder_recounts_to_nothing(tmp_path: Path):
    usage = FolderUsage(tmp_path)
    usage.wrote("ghost", 100, now_s=1.0)  # its files were removed by another process
    assert usage.recount() == [] and usage.bytes == 0 and not usage.partitions


class Remover:
    """What the store passes: remove a partition's files (False while a writer holds them)."""

    def __init__(self, usage: FolderUsage, held: frozenset[str] = frozenset()) -> None:
        self.usage, self.held = usage, held
        self.removed: list[str] = []

    def __call__(self, partition: str) -> bool:
        if partition in self.held:
            return False
        self.usage.removed(partition)
        self.removed.append(partition)
        return True


def filled(tmp_path: Path, count: int, nbytes: int = 100) -> FolderUsage:
    usage = FolderUsage(tmp_path)
    for i in range(count):
        usage.wrote(f"p{i}", nbytes, now_s=1000.0 + i)
    return usage


def test_past_the_partition_limit_the_least_recently_used_go_down_to_nine_tenths(tmp_path: Path):
    usage = filled(tmp_path, 12)
    remove = Remover(usage)
    assert evict(usage, max_partitions=10, budget_bytes=1 << 30, remove=remove) == 3
    assert remove.removed == ["p0", "p1", "p2"] and len(usage.partitions) == 9


def test_past_the_byte_budget_the_least_recently_used_go_down_to_nine_tenths(tmp_path: Path):
    usage = filled(tmp_path, 12)  # 1200 bytes
    remove = Remover(usage)
    assert evict(usage, max_partitions=1000, budget_bytes=1000, remove=remove) == 3
    assert remove.removed == ["p0", "p1", "p2"] and usage.bytes == 900


def test_within_nine_tenths_of_both_limits_nothing_is_removed(tmp_path: Path):
    usage = filled(tmp_path, 9)
    remove = Remover(usage)
    assert evict(usage, max_partitions=10, budget_bytes=1000, remove=remove) == 0 and remove.removed == []
    # At a limit (the store calls it once one is passed), it still goes down to nine tenths: one pass per
    # tenth of growth, not one per write.
    assert evict(usage, max_partitions=9, budget_bytes=1000, remove=remove) == 1 and remove.removed == ["p0"]


def test_a_partition_a_writer_holds_is_skipped_for_the_next(tmp_path: Path):
    usage = filled(tmp_path, 12)
    remove = Remover(usage, held=frozenset({"p1"}))
    assert evict(usage, max_partitions=10, budget_bytes=1 << 30, remove=remove) == 3
    assert remove.removed == ["p0", "p2", "p3"] and "p1" in usage.partitions


def test_a_partition_another_process_used_since_is_spared_and_counted_as_recent(tmp_path: Path):
    usage = filled(tmp_path, 12)
    write(tmp_path / "p0.ids", 0, mtime_s=time.time())  # its mtime: a lookup in another process
    remove = Remover(usage)
    assert evict(usage, max_partitions=10, budget_bytes=1 << 30, remove=remove) == 3
    assert remove.removed == ["p1", "p2", "p3"]
    assert [p for p, _ in usage.oldest(len(usage.partitions))][-1] == "p0"


def test_nothing_removable_removes_nothing_and_says_so(tmp_path: Path):
    usage = filled(tmp_path, 4)
    remove = Remover(usage, held=frozenset({"p0", "p1", "p2", "p3"}))
    assert evict(usage, max_partitions=1, budget_bytes=1, remove=remove) == 0
    assert len(usage.partitions) == 4 and usage.bytes == 400
