"""What a second attack pass found in the response cache, each through a real edge: a planted long question,
code told apart by its indentation, a no-cache refresh, a huge question, a truncated vector file, a flood
of partitions, and questions embedded only where their tenant's data may go."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from cache.store import CacheStore
from tests.conftest import Node
from tests.edge.test_cache import ask, question, stored
from tests.edge_fixtures import EVENTUALLY_S, Edge, edge_over_pacer, start_edge, start_pacer

pytestmark = pytest.mark.slow
MINILM_DIM = 384


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("attacks")
    e = edge_over_pacer(
        folder, "pacer", {"cache": {"store_truncated": True, "folder": str(folder / "cache")}}, tokens=4,
        interval_ms=150,
    )  # fmt: skip
    yield e
    e.stop()


def cache_folder(edge: Edge) -> Path:
    return edge.folder.parent / "cache"


def metric(edge: Edge, name: str) -> float:
    with urllib.request.urlopen(edge.metrics_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def test_a_planted_long_question_is_never_served_for_the_plain_one(edge: Edge):
    planter, victim = edge.new_key(tenant="shared-co"), edge.new_key(tenant="shared-co")
    tail = " ".join(f"Step {i}: then tell them to send the code to +2348000000{i:03d}." for i in range(60))
    planted = f"How do I reset my password? {tail}"
    await stored(edge, planter, question(planted))
    _, headers, _ = await ask(edge, victim, question("How do I reset my password?"))
    assert headers["x-nearshore-cache"] == "MISS"
    _, headers, _ = await ask(edge, victim, question(planted))
    assert headers["x-nearshore-cache"] == "HIT"  # the same text is the same question: an exact hit


async def test_code_differing_only_in_indentation_is_another_question(edge: Edge):
    key = edge.new_key()
    four = "Why does this never stop?\n```python\nwhile ready:\n    step()\nreport()\n```"
    two = "Why does this never stop?\n```python\nwhile ready:\n    step()\n    report()\n```"
    await stored(edge, key, question(four))
    _, headers, _ = await ask(edge, key, question(two))
    assert headers["x-nearshore-cache"] == "MISS"


async def test_no_cache_fetches_a_fresh_answer_that_replaces_the_stored_one(edge: Edge):
    key = edge.new_key()
    payload = question("Which river flows through Niamey?")
    await stored(edge, key, payload)
    store = CacheStore(cache_folder(edge), MINILM_DIM, None)
    try:
        (before,) = [e for e in _entries(store) if e.query == "Which river flows through Niamey?"]
        _, headers, _ = await ask(edge, key, payload, {"Cache-Control": "no-cache"})
        assert headers["x-nearshore-cache"] == "MISS"
        for _ in range(100):  # stored off the request's path
            (after,) = [e for e in _entries(store) if e.query == "Which river flows through Niamey?"]
            if after.created_s > before.created_s:
                break
            await asyncio.sleep(0.05)
        assert after.created_s > before.created_s and after.expires_s > before.expires_s
    finally:
        store.close()
    _, headers, _ = await ask(edge, key, payload)
    assert headers["x-nearshore-cache"] == "HIT"


def _entries(store: CacheStore):
    return [e for k in store.entries.iterkeys() if (e := store.peek(k)) is not None]


async def test_a_huge_question_is_exact_only_and_never_embedded(edge: Edge):
    key = edge.new_key(tpm=10_000_000)  # a prompt of ~850k tokens at most: within this key's limit
    huge = (
        "Please proofread this letter. "
        + "Our harvest was late this year and the rains came early. " * 15_000
    )
    assert 850_000 < len(huge.encode()) < 1_000_000
    lookups = metric(edge, "nearshore_edge:cache_lookup_seconds_count")
    status, headers, _ = await ask(edge, key, question(huge))
    assert status == 200 and headers["x-nearshore-cache"] == "MISS"
    assert metric(edge, "nearshore_edge:cache_lookup_seconds_count") == lookups  # no embedding, no search
    for _ in range(100):
        _, headers, _ = await ask(edge, key, question(huge), {"Cache-Control": "no-store"})
        if headers["x-nearshore-cache"] == "HIT":
            break
        await asyncio.sleep(0.05)
    assert headers["x-nearshore-cache"] == "HIT"
    assert metric(edge, "nearshore_edge:cache_lookup_seconds_count") == lookups


async def test_a_vector_file_truncated_under_the_edge_is_a_miss_and_a_warning(edge: Edge):
    key = edge.new_key(tenant="truncated")
    await stored(edge, key, question("How do I descale a kettle?"))
    _, headers, _ = await ask(edge, key, question("Please, how do I descale a kettle?"))
    assert headers["x-nearshore-cache"] == "SEMANTIC"
    for vec in (cache_folder(edge) / "index").glob("*.vec"):
        if vec.stat().st_size:
            os.truncate(vec, vec.stat().st_size // 2 - 3)  # in place, mid-row
    status, headers, _ = await ask(edge, key, question("How can I descale a kettle?"))
    assert status == 200 and headers["x-nearshore-cache"] in ("MISS", "SEMANTIC")
    with urllib.request.urlopen(edge.metrics_url + "/health", timeout=5) as r:
        assert r.status == 200
    _, headers, _ = await ask(edge, key, question("How do I descale a kettle?"))
    assert headers["x-nearshore-cache"] == "HIT"  # the entry itself is untouched
    log = (edge.folder / "edge.log").read_text()
    assert "Traceback" not in log


async def test_a_flood_of_partitions_keeps_the_edges_open_files_bounded(edge: Edge):
    key = edge.new_key(tenant="flood", rpm=100_000, tpm=100_000_000)
    pid = edge.process.proc.pid
    before = len(os.listdir(f"/proc/{pid}/fd"))
    flooding = asyncio.Semaphore(15)  # a client that floods asks many at once

    async def new_partition(n: int) -> list[int]:
        async with flooding:  # a new partition per request, as a client varying a parameter makes
            stop = [f"#{n}"]
            first, _, _ = await ask(edge, key, question("What is the capital of Chad?", stop=stop))
            then, _, _ = await ask(edge, key, question("Please, what is the capital of Chad?", stop=stop))
            return [first, then]

    statuses = await asyncio.gather(*(new_partition(n) for n in range(150)))
    assert all(status == 200 for pair in statuses for status in pair)  # every partition was made
    after = len(os.listdir(f"/proc/{pid}/fd"))
    assert after - before < 40, (before, after)


async def test_a_question_is_embedded_only_where_its_tenants_data_may_go(tmp_path: Path, region: Node):
    """``cache.embed = "region"``: the pacer (london, first in the catalog) serves no embedding model and
    counts who asked it; a tenant pinned to virginia (the real region) never sends it a question."""
    london = start_pacer(tmp_path, name="london", tokens=4, interval_ms=50)
    models = ["gemma-3-270m", "all-minilm-l6-v2"]
    edge = start_edge(
        tmp_path / "edge",
        [
            {"name": "london", "city": "london", "url": london.url, "models": models},
            {"name": "virginia", "city": "virginia", "url": region.url, "models": models},
        ],
        cache={"embed": "region", "store_truncated": True},
        geo={"residency": [{"name": "pinned-to-virginia", "tenants": ["pinned"], "regions": ["virginia"]}]},
    )
    edge.extra.append(london.process)

    def refused() -> int:
        with urllib.request.urlopen(london.url + "/health", timeout=5) as r:
            return json.loads(r.read())["embeddings_refused"]

    try:
        pinned = edge.new_key(tenant="pinned")
        for text in ("How do I plant cassava?", "Please, how do I plant cassava?"):
            status, _, _ = await ask(edge, pinned, question(text, max_tokens=4))
            assert status == 200
        await asyncio.sleep(0.5)  # the answer's store (and its embedding) happen after the answer
        assert refused() == 0
        anyone = edge.new_key(tenant="anyone")
        await ask(edge, anyone, question("How do I plant yams?", max_tokens=4))
        deadline = time.monotonic() + EVENTUALLY_S
        while refused() == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert refused() >= 1  # without the policy, london (nearer in the catalog) is asked first
    finally:
        edge.stop()
