"""``nearshore cache stats|clear|inspect`` on a real cache folder (diskcache entries and vector files, as an
edge writes them): counts, sizes and ages; clearing all, a partition or old entries; tenants shown only
when asked; a missing folder or an ambiguous partition is an error that says so."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from cache import admin
from cache.store import CacheStore, Entry
from cli import main

DIM = 8
HOUR = 3600.0


def entry(partition: str, query: str, scope: str, age_s: float = 0.0, ttl_s: float = 24 * HOUR) -> Entry:
    created = time.time() - age_s
    return Entry(
        partition=partition,
        query=query,
        kind="chat",
        text=f"An answer about {query}",
        finish_reason="stop",
        completion_tokens=4,
        model="m",
        created_s=created,
        expires_s=created + ttl_s,
        scope=scope,
    )


def vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


ACME, GLOBEX = "aa" * 16, "bb" * 16  # partitions (hashes, as an edge makes them)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    store = CacheStore(tmp_path / "cache", DIM, 1 << 24)
    try:
        for i, q in enumerate(["capital of Kenya", "jollof rice", "tap water in Lagos"]):
            store.put(f"{i:032x}", entry(ACME, q, "tenant:acme", age_s=i * HOUR), vector(i))
        store.put(
            f"{9:032x}", entry(GLOBEX, "exchange rate of the naira", "tenant:globex", 3 * HOUR), vector(9)
        )
        store.put(f"{7:032x}", entry(GLOBEX, "long gone", "tenant:globex", 2 * HOUR, ttl_s=0.01), vector(7))
    finally:
        store.close()
    time.sleep(0.05)  # the last one expires
    return tmp_path / "cache"


def test_stats_count_entries_partitions_bytes_ages_and_hide_tenants(folder: Path, capsys):
    s = admin.stats(folder)
    assert (s.entries, s.expired, s.undecodable, s.partitions) == (5, 1, 0, 2)
    assert s.index_bytes == 5 * (DIM * 4 + 16) and s.bytes_on_disk >= s.index_bytes + 1
    assert s.newest_created_s - s.oldest_created_s == pytest.approx(3 * HOUR, abs=5)
    assert s.top_partitions[0] == {"partition": ACME, "entries": 3, "rows": 3}
    assert main(["cache", "stats", "--folder", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "entries        5 (1 expired" in out and ACME in out and "acme" not in out.replace(ACME, "")
    assert main(["cache", "stats", "--folder", str(folder), "--show-tenants", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["top_partitions"][0]["scope"] == "tenant:acme" and shown["partitions"] == 2


def test_inspect_by_partition_prefix_or_text_newest_first(folder: Path, capsys):
    assert main(["cache", "inspect", "--folder", str(folder), "--partition", ACME[:8]]) == 0
    out = capsys.readouterr().out
    assert out.index("capital of Kenya") < out.index("jollof rice") < out.index("tap water")
    assert "naira" not in out and "tenant" not in out and "ttl left" in out
    assert main(["cache", "inspect", "--folder", str(folder), "--grep", "NAIRA", "--show-tenants"]) == 0
    out = capsys.readouterr().out
    assert "exchange rate of the naira" in out and "tenant:globex" in out and "Kenya" not in out


def test_clear_old_entries_then_a_partition_then_all(folder: Path, capsys):
    # Older than 90 minutes: acme's third (2 h), globex's (3 h), and the expired one go.
    assert admin.clear(folder, older_than_s=1.5 * HOUR) == 3
    assert [s.query for s in admin.inspect(folder)] == ["capital of Kenya", "jollof rice"]
    assert not (folder / "index" / f"{GLOBEX}.ids").exists()  # no entry left: its files go
    assert (folder / "index" / f"{ACME}.ids").stat().st_size == 2 * 16  # compacted to the live rows
    assert main(["cache", "clear", "--folder", str(folder), "--partition", ACME[:6]]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert admin.stats(folder).entries == 0 and not list((folder / "index").iterdir())
    store = CacheStore(folder, DIM, None)
    store.put("cc" * 16, entry(ACME, "again", "tenant:acme"), vector(3))
    store.close()
    assert main(["cache", "clear", "--folder", str(folder), "--all"]) == 0
    assert admin.stats(folder).entries == 0


def test_the_folder_comes_from_an_edge_config_and_errors_are_reported(tmp_path: Path, folder: Path, capsys):
    config = tmp_path / "edge.toml"
    config.write_text(f'[cache]\nfolder = "{folder}"\n')
    assert main(["cache", "stats", "--config", str(config)]) == 0
    assert "entries        5" in capsys.readouterr().out
    beside_ledger = tmp_path / "edge2.toml"
    beside_ledger.write_text(f'ledger_db = "{tmp_path / "nowhere" / "ledger.sqlite3"}"\n')
    assert main(["cache", "stats", "--config", str(beside_ledger)]) == 1
    assert f"no cache at {tmp_path / 'nowhere' / 'cache'}" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()  # looking never creates a folder
    assert main(["cache", "inspect", "--folder", str(folder), "--partition", "zz"]) == 1
    assert "matches 0 partitions" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["cache", "clear", "--folder", str(folder)])  # clear needs --all, --partition or --older-than
    assert main(["cache", "clear", "--folder", str(folder), "--older-than", "1d"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out  # only the expired one
