"""The edge's response cache through a real edge: exact and semantic hits, never someone else's answer,
never an error or a cut-short answer, a hit that cancels its region's request, a broken folder bypassed."""

from __future__ import annotations

import asyncio
import errno
import json
import shutil
import subprocess
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.edge_fixtures import Edge, edge_over_pacer, start_edge, start_pacer

pytestmark = pytest.mark.slow
MODEL = "gemma-3-270m"


def question(content: str, **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


async def ask(edge: Edge, key: str, payload: dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(
            edge.url + "/v1/chat/completions",
            json=payload,
            headers={"Authorization": f"Bearer {key}", **(headers or {})},
        ) as r,
    ):
        return r.status, dict(r.headers), await r.read()


async def stored(edge: Edge, key: str, payload: dict) -> None:
    """Ask once (a miss) and wait until the answer is in the cache (it is stored off the request's path)."""
    status, headers, _ = await ask(edge, key, payload)
    assert status == 200 and headers["x-nearshore-cache"] == "MISS", headers
    for _ in range(100):
        status, headers, _ = await ask(edge, key, payload, {"Cache-Control": "no-store"})
        if headers.get("x-nearshore-cache") == "HIT":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the answer was never stored")


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("cache")
    # The pacer ends every answer with finish_reason "length": store such answers here. Its first byte takes
    # 150 ms, as a far region's would: a semantic lookup (an embedding, ~10 ms) races it and wins.
    e = edge_over_pacer(folder, "pacer", {"cache": {"store_truncated": True}}, tokens=6, interval_ms=150)
    yield e
    e.stop()


async def test_an_exact_repeat_is_answered_at_the_edge_and_billed_as_a_hit(edge: Edge):
    key = edge.new_key()
    payload = question("What is the capital of Nigeria?")
    await stored(edge, key, payload)
    status, headers, body = await ask(
        edge, key, {**payload, "messages": [{"role": "user", "content": "What is the  capital of Nigeria? "}]}
    )
    assert status == 200 and headers["x-nearshore-cache"] == "HIT"
    assert "cache;dur=" in headers["Server-Timing"] and "x-nearshore-region" not in headers
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"] == " token" * 6
    row = edge.ledger_rows()[-1]
    assert row["cache_status"] == "exact" and row["region"] == "" and row["completion_tokens"] == 6


async def test_a_paraphrase_is_a_semantic_hit_and_a_negation_or_other_number_is_not(edge: Edge):
    key = edge.new_key()
    await stored(edge, key, question("Is it safe to drink tap water in London?"))
    status, headers, _ = await ask(edge, key, question("Hi, is it safe to drink the tap water in London?"))
    assert headers["x-nearshore-cache"] == "SEMANTIC" and float(headers["x-nearshore-cache-similarity"]) > 0.8
    for other in ("Is it unsafe to drink tap water in London?", "Is it safe to drink tap water in Paris?"):
        status, headers, _ = await ask(edge, key, question(other))
        assert status == 200 and headers["x-nearshore-cache"] == "MISS", other
    await stored(edge, key, question("What can I buy with 100 dollars in Lagos?"))
    status, headers, _ = await ask(edge, key, question("What can I buy with 1000 dollars in Lagos?"))
    assert headers["x-nearshore-cache"] == "MISS"


async def test_questions_differing_only_in_spacing_inside_quotes_never_share_an_answer(edge: Edge):
    """Issue 34, N12: "keep every space: 'a      b'" then "... 'a b'" was an exact hit with the first answer.
    Neither order shares one, exact or semantic; around the quotes, spacing and case are still normalised."""
    key = edge.new_key()
    spaced, plain = "keep every space: 'a      b'", "keep every space: 'a b'"
    await stored(edge, key, question(spaced))
    status, headers, _ = await ask(edge, key, question(plain))
    assert status == 200 and headers["x-nearshore-cache"] == "MISS", headers
    await stored(edge, key, question("Echo exactly: 'x y'"))
    status, headers, _ = await ask(edge, key, question("Echo exactly: 'x    y'"))
    assert status == 200 and headers["x-nearshore-cache"] == "MISS", headers
    status, headers, _ = await ask(edge, key, question("Keep  every SPACE: 'a      b'?"))
    assert status == 200 and headers["x-nearshore-cache"] == "HIT", headers


async def test_tenants_and_parameters_never_share_an_entry(edge: Edge):
    acme, globex = edge.new_key(tenant="acme"), edge.new_key(tenant="globex")
    payload = question("Name three rivers in West Africa.")
    await stored(edge, acme, payload)
    assert (await ask(edge, globex, payload))[1]["x-nearshore-cache"] == "MISS"
    for changed in ({"max_tokens": 3}, {"top_p": 0.5}, {"stop": ["\n"]}):
        assert (await ask(edge, acme, {**payload, **changed}))[1]["x-nearshore-cache"] == "MISS", changed
    _, headers, _ = await ask(edge, acme, {**payload, "temperature": 0.7})
    assert "x-nearshore-cache" not in headers  # not temperature 0: not cached at all
    assert (await ask(edge, acme, payload, {"Cache-Control": "no-cache"}))[1]["x-nearshore-cache"] == "MISS"


async def test_a_streamed_hit_parses_in_the_official_client_like_a_miss(edge: Edge):
    key = edge.new_key()
    client = openai.AsyncOpenAI(
        base_url=edge.url + "/v1",
        api_key=key,
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(verify=edge.ssl_context()),
    )
    payload = question("Which ocean borders Lagos?")
    texts, kinds = [], []
    for _ in range(2):
        stream = await client.chat.completions.with_raw_response.create(
            **payload, stream=True, stream_options={"include_usage": True}
        )
        kinds.append(stream.headers.get("x-nearshore-cache"))
        text, usage = "", None
        async for chunk in stream.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            usage = chunk.usage or usage
        texts.append((text, usage.completion_tokens))
        await asyncio.sleep(0.3)  # stored off the request's path
    assert kinds == ["MISS", "HIT"] and texts[0] == texts[1] == (" token" * 6, 6)


async def test_errors_and_cut_short_answers_are_never_cached(tmp_path: Path):
    breaking = edge_over_pacer(tmp_path / "b", "breaking", tokens=10, interval_ms=2, break_after=3)
    failing = edge_over_pacer(tmp_path / "f", "failing", fail_status=500)
    truncated = edge_over_pacer(tmp_path / "t", "long", tokens=50, interval_ms=1)
    try:
        for e, payload in (
            (breaking, question("A question whose stream breaks.", stream=True)),
            (failing, question("A question that fails.")),
            (truncated, question("A question cut at max_tokens.", max_tokens=4)),
        ):
            key = e.new_key()
            for _ in range(2):
                status, headers, _ = await ask(e, key, payload)
                await asyncio.sleep(0.3)
                assert headers.get("x-nearshore-cache") in ("MISS", None), (e.url, status, headers)
    finally:
        for e in (breaking, failing, truncated):
            e.stop()


async def test_a_semantic_hit_cancels_its_region_request(tmp_path: Path):
    slow = start_pacer(tmp_path, name="slow", tokens=4, interval_ms=1500)  # its first byte takes 1.5 s
    no_audit = {"audit_first_hits": 0, "audit_share": 0.0}  # an audited hit lets its region's answer finish
    edge = start_edge(tmp_path / "edge", [("slow", slow.url)], cache={"store_truncated": True, **no_audit})
    edge.extra.append(slow.process)
    try:
        key = edge.new_key()
        await stored(edge, key, question("How many states does Nigeria have?"))
        _, headers, _ = await ask(edge, key, question("Please, how many states does Nigeria have?"))
        assert headers["x-nearshore-cache"] == "SEMANTIC"  # (served before the region's 1.5 s first byte)
        assert await abandoned_at(slow.url) >= 1  # the region was told: its request ended when the edge left
        row = edge.ledger_rows()[-1]
        assert row["cache_status"] == "semantic" and row["region"] == ""
    finally:
        edge.stop()


async def test_a_broken_cache_folder_is_bypassed_and_nothing_is_lost(tmp_path: Path):
    edge = edge_over_pacer(tmp_path, "pacer", {"cache": {"store_truncated": True}}, tokens=3, interval_ms=1)
    try:
        key = edge.new_key()
        await stored(edge, key, question("What is jollof rice?"))
        shutil.rmtree(Path(edge.ledger_db).parent / "cache")  # deleted under the running edge
        before = len(edge.ledger_rows())
        for content in ("What is jollof rice?", "What is egusi soup?", "What is suya?"):
            status, _, body = await ask(edge, key, question(content))
            assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == " token" * 3
        await asyncio.sleep(0.3)
        assert (await health(edge))["cache"].startswith("bypassed")
        assert len(edge.ledger_rows()) == before + 3  # every request has its row
    finally:
        edge.stop()


async def test_a_cache_folder_that_cannot_be_opened_leaves_the_edge_serving(tmp_path: Path):
    (tmp_path / "not-a-folder").write_text("a file where the cache folder should be")
    edge = edge_over_pacer(tmp_path, "pacer", {"cache": {"folder": str(tmp_path / "not-a-folder")}}, tokens=2)
    try:
        key = edge.new_key()
        status, headers, _ = await ask(edge, key, question("What is jollof rice?"))
        assert status == 200 and "x-nearshore-cache" not in headers
        assert (await health(edge))["cache"].startswith("off (cannot open")
    finally:
        edge.stop()


async def health(edge: Edge) -> dict:
    async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/health") as r:  # the details
        return await r.json()


async def abandoned_at(region_url: str) -> int:
    """The region's count of requests its client left; the edge tells it in the background, so wait for it."""
    async with aiohttp.ClientSession() as s:
        for _ in range(100):
            async with s.get(region_url + "/health") as r:
                abandoned = (await r.json())["abandoned"]
            if abandoned:
                return abandoned
            await asyncio.sleep(0.1)
    return 0


async def test_a_client_that_leaves_during_a_cached_miss_frees_the_regions_slot(tmp_path: Path):
    slow = start_pacer(tmp_path, name="slow", tokens=4, interval_ms=1500)
    edge = start_edge(tmp_path / "edge", [("slow", slow.url)])
    edge.extra.append(slow.process)
    try:
        key = edge.new_key()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.4):  # the client gives up while the region is still "prefilling"
                await ask(edge, key, question("Which river flows through Niamey?"))
        assert await abandoned_at(slow.url) >= 1  # the region was told
        async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/metrics") as r:
            metrics = await r.text()
        assert 'nearshore_edge:region_inflight{region="slow"} 0.0' in metrics  # and no slot is held
    finally:
        edge.stop()


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 8 MiB filesystem (tmpfs) to fill up; skipped where this user cannot mount one."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> Path:
    """Write one file until the filesystem has no byte left."""
    filler = folder / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


async def test_a_full_disk_bypasses_the_cache_and_loses_nothing(tmp_path: Path, small_disk: Path):
    edge = edge_over_pacer(
        tmp_path, "pacer", {"cache": {"store_truncated": True, "folder": str(small_disk / "cache")}}, tokens=3
    )
    try:
        key = edge.new_key()
        await stored(edge, key, question("What is jollof rice?"))
        filler = fill(small_disk)
        before = len(edge.ledger_rows())
        questions = [f"How many people live in city number {n}?" for n in range(8)]
        for content in questions:  # every answer is served, none can be stored
            status, headers, body = await ask(edge, key, question(content))
            assert status == 200 and headers["x-nearshore-cache"] == "MISS"
            assert json.loads(body)["choices"][0]["message"]["content"] == " token" * 3
        status, headers, _ = await ask(edge, key, question("What is jollof rice?"))
        assert status == 200 and headers["x-nearshore-cache"] == "HIT"  # what was stored still answers
        await asyncio.sleep(0.3)  # stores run after the answer
        assert (await health(edge))["cache"].startswith("bypassed (store failed")
        async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/metrics") as r:
            metrics = await r.text()
        assert 'nearshore_edge:cache_failures{operation="store"}' in metrics
        assert len(edge.ledger_rows()) == before + len(questions) + 1  # every request has its row

        filler.unlink()  # room again: the next answer is stored and the cache says it is up
        await stored(edge, key, question(questions[0]))
        assert (await health(edge))["cache"] == "up"
    finally:
        edge.stop()


async def test_a_cached_unary_completion_is_shaped_as_the_region_shapes_it(edge: Edge):
    """A hit on /v1/completions is a text_completion with its usage in ``usage`` (not in ``object``)."""
    key = edge.new_key()
    payload = {"model": MODEL, "prompt": "The capital of Nigeria is", "temperature": 0, "max_tokens": 6}
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    answers = []
    async with aiohttp.ClientSession(connector=connector) as s:
        for _ in range(100):
            async with s.post(
                edge.url + "/v1/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
            ) as r:
                assert r.status == 200
                answers.append((r.headers["x-nearshore-cache"], await r.json()))
            if answers[-1][0] == "HIT":
                break
            await asyncio.sleep(0.05)
    (_, missed), (status, hit) = answers[0], answers[-1]
    assert status == "HIT"
    assert hit["object"] == missed["object"] == "text_completion"
    assert hit["choices"][0]["text"] == missed["choices"][0]["text"]
    assert hit["usage"]["completion_tokens"] == missed["usage"]["completion_tokens"] == 6
    assert hit["id"].startswith("cmpl-") and hit["model"] == MODEL
