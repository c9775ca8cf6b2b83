"""The live audit through a real edge over a real region (the embedded model): a deliberately wrong entry
is served once, found by the audit, evicted and counted; the partition then serves exact hits only; the
audited answer is never sent to the client nor billed to the tenant, and its cost is in /metrics."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import msgspec
import pytest

from cache.store import CacheStore
from tests.conftest import Node
from tests.edge.test_cache import ask, question, stored
from tests.edge_fixtures import Edge, start_edge

pytestmark = pytest.mark.slow
MINILM_DIM = 384
PLANTED = "Bananas turn yellow as they ripen, because the green chlorophyll in their peel breaks down."


def scrape(edge: Edge) -> dict[str, float]:
    with urllib.request.urlopen(edge.metrics_url + "/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")
    }


def health(edge: Edge) -> dict:
    with urllib.request.urlopen(edge.metrics_url + "/health", timeout=5) as r:
        return json.loads(r.read())


def plant(edge: Edge, query: str, text: str) -> None:
    """Replace the stored answer to ``query`` with ``text``: an entry that answers another question."""
    store = CacheStore(edge.folder.parent / "cache", MINILM_DIM, None)
    try:
        for exact in list(store.entries.iterkeys()):
            entry = store.peek(exact)
            if entry is not None and entry.query == query:
                store.put(exact, msgspec.structs.replace(entry, text=text), None, replace=True)
                return
    finally:
        store.close()
    raise AssertionError(f"no entry for {query!r}")


async def test_a_wrong_entry_is_served_once_then_found_evicted_and_its_partition_switched_off(
    tmp_path, region: Node
):
    folder = tmp_path / "edge"
    edge = start_edge(
        folder,
        [("london", region.url)],
        cache={"store_truncated": True, "folder": str(tmp_path / "cache")},
    )
    try:
        key = edge.new_key(tenant="audited")
        capital = question("What is the capital of Nigeria?", max_tokens=12)
        eggs = question("How do I boil an egg?", max_tokens=12)
        await stored(edge, key, capital)
        await stored(edge, key, eggs)
        plant(edge, "What is the capital of Nigeria?", PLANTED)
        rows = len(edge.ledger_rows())

        # Served once: the wrong answer reaches the client, as a semantic hit, billed as one.
        status, headers, body = await ask(
            edge, key, question("Please, what is the capital of Nigeria?", max_tokens=12)
        )
        assert status == 200 and headers["x-nearshore-cache"] == "SEMANTIC"
        assert json.loads(body)["choices"][0]["message"]["content"] == PLANTED
        audits = 'nearshore_edge:cache_audits_total{mode="sampled",verdict="disagree"}'
        evictions = "nearshore_edge:cache_audit_evictions_total"
        for _ in range(300):  # the region's answer is read to its end, judged and acted on in the background
            if scrape(edge).get(audits) and scrape(edge).get(evictions):
                break
            await asyncio.sleep(0.1)
        metrics = scrape(edge)
        assert metrics[audits] == 1 and metrics[evictions] == 1
        assert metrics['nearshore_edge:cache_audit_tokens_total{type="completion"}'] > 0
        assert metrics["nearshore_edge:cache_audit_cost_usd_total"] > 0
        assert metrics['nearshore_edge:cache_false_hit_rate{bound="lower"}'] > 0.01
        assert metrics["nearshore_edge:cache_semantic_partitions_off"] == 1
        audit = health(edge)["cache_audit"]
        assert (audit["wrong"], audit["partitions_off"]) == (1, 1) and audit["audited"] >= 1
        assert audit["ci95"][0] > audit["target"]

        # Never billed: the tenant has one row for the hit (the cache's price), none for the audit.
        new_rows = edge.ledger_rows()[rows:]
        assert [r["cache_status"] for r in new_rows] == ["semantic"]

        # Evicted: the question itself is asked again at the region.
        _, headers, _ = await ask(edge, key, capital, {"Cache-Control": "no-store"})
        assert headers["x-nearshore-cache"] == "MISS"
        # Switched off: the partition's paraphrases are no longer served; exact hits go on.
        _, headers, _ = await ask(edge, key, question("Please, how do I boil an egg?", max_tokens=12))
        assert headers["x-nearshore-cache"] == "MISS"
        _, headers, _ = await ask(edge, key, eggs)
        assert headers["x-nearshore-cache"] == "HIT"
        log = (folder / "edge.log").read_text()
        assert "answered another question" in log and "stops serving semantic hits" in log
    finally:
        edge.stop()
