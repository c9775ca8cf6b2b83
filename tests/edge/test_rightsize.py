"""Right-sizing: the `auto` alias sends a request to the small or the large pool by what it needs."""

from __future__ import annotations

import sqlite3
import time

import aiohttp
import pytest

from geo.rightsize import SizeAlias, check_aliases, choose
from tests.edge_fixtures import Edge, start_edge, start_pacer

AUTO = SizeAlias(
    name="auto",
    small="tiny",
    large="big",
    small_max_prompt_tokens=50,
    small_max_tokens=64,
    large_tiers=["gold"],
)


def test_the_alias_chooses_by_prompt_answer_tier_and_hint():
    assert choose(AUTO, 10, 16, "default", "") == ("tiny", "fits the small model")
    assert choose(AUTO, 51, 16, "default", "")[0] == "big"
    assert choose(AUTO, 10, 65, "default", "")[0] == "big"
    assert choose(AUTO, 10, 16, "gold", "") == ("big", "tier=gold")
    assert choose(AUTO, 900, 900, "default", "small") == ("tiny", "hint=small")
    assert choose(AUTO, 10, 16, "default", "huge")[0] == "tiny"  # an unknown hint is no hint


def test_alias_mistakes_name_their_key():
    bad = [
        AUTO,
        SizeAlias(name="auto", small="tiny", large="nope"),
        SizeAlias(name="tiny", small="tiny", large="big"),
    ]
    problems = "\n".join(check_aliases(bad, ["tiny", "big"]))
    assert "aliases[1] (auto): the name 'auto' is used twice" in problems
    assert "aliases[1] (auto).large: 'nope' is not in the edge's models" in problems
    assert "aliases[2] (tiny): 'tiny' is also a model's name" in problems


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("rightsize")
    small = start_pacer(folder, name="small-pool", tokens=4, interval_ms=1)
    large = start_pacer(folder, name="large-pool", tokens=4, interval_ms=1)
    edge = start_edge(
        folder / "edge",
        [
            {"name": "small-pool", "url": small.url, "city": "london", "pool": "small", "models": ["tiny"]},
            {"name": "large-pool", "url": large.url, "city": "london", "pool": "large", "models": ["big"]},
        ],
        top={
            "models": ["tiny", "big"],
            "prices": {"tiny": {"free": True}, "big": {"free": True}},
            "aliases": [
                {
                    "name": "auto",
                    "small": "tiny",
                    "large": "big",
                    "small_max_prompt_tokens": 50,
                    "small_max_tokens": 64,
                    "large_tiers": ["gold"],
                }
            ],
        },
    )
    edge.extra += [small.process, large.process]
    yield edge
    edge.stop()


async def ask(edge: Edge, key: str, content: str, max_tokens: int, hint: str = "") -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Bearer {key}", **({"x-nearshore-size": hint} if hint else {})}
    payload = {"model": "auto", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(edge.url + "/v1/chat/completions", json=payload, headers=headers) as r,
    ):
        return r.status, dict(r.headers), await r.json()


@pytest.mark.slow
async def test_auto_goes_to_the_pool_the_request_needs(edge: Edge):
    key = edge.new_key()
    started = time.time()  # the ledger's rows from here on are this test's (the module's edge is shared)
    status, headers, _ = await ask(edge, key, "Is this spam?", 8)
    assert status == 200 and headers["x-nearshore-model"].startswith("tiny;")
    assert headers["x-nearshore-region"] == "small-pool"
    status, headers, _ = await ask(edge, key, "Summarise the report. " * 40, 8)
    assert headers["x-nearshore-model"].startswith("big;") and headers["x-nearshore-region"] == "large-pool"
    status, headers, _ = await ask(edge, key, "Write an essay.", 500)
    assert (
        headers["x-nearshore-model"].startswith("big;")
        and "max_tokens=500>64" in headers["x-nearshore-model"]
    )
    status, headers, _ = await ask(edge, key, "Write an essay.", 500, hint="small")
    assert headers["x-nearshore-region"] == "small-pool"
    gold = edge.new_key(tier="gold")
    status, headers, _ = await ask(edge, gold, "Is this spam?", 8)
    assert headers["x-nearshore-region"] == "large-pool" and "tier=gold" in headers["x-nearshore-model"]
    db = sqlite3.connect(edge.ledger_db)
    try:
        rows = db.execute("SELECT model FROM usage WHERE ts >= ? ORDER BY ts", (started,))
        models = [m for (m,) in rows]
    finally:
        db.close()
    assert models == ["tiny", "big", "big", "tiny", "big"]  # billed as the model that served


@pytest.mark.slow
async def test_a_key_that_may_not_use_the_chosen_model_is_told_which_and_why(edge: Edge):
    key = edge.new_key(models=["tiny"])
    status, _, body = await ask(edge, key, "Write an essay.", 500)
    assert status == 403 and "`big`, which `auto` chose (max_tokens=500>64)" in body["error"]["message"]
    status, headers, _ = await ask(edge, key, "Is this spam?", 8)
    assert status == 200 and headers["x-nearshore-region"] == "small-pool"


@pytest.mark.slow
async def test_tool_definitions_count_toward_the_prompt_the_alias_sizes(edge: Edge):
    """The alias sees the prompt admission prices: a short question with long tool definitions is a long
    prompt (the region writes the tools into it)."""
    key = edge.new_key()
    tool = {
        "type": "function",
        "function": {
            "name": "lookup_invoice",
            "description": "Find an invoice by its number and return its lines and totals. " * 4,
            "parameters": {"type": "object", "properties": {"number": {"type": "string"}}},
        },
    }
    payload = {
        "model": "auto",
        "messages": [{"role": "user", "content": "Is this spam?"}],
        "max_tokens": 8,
        "tools": [tool],
    }
    headers = {"Authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(edge.url + "/v1/chat/completions", json=payload, headers=headers) as r,
    ):
        await r.read()
        assert r.status == 200 and r.headers["x-nearshore-model"].startswith("big;")
        assert "prompt" in r.headers["x-nearshore-model"]  # sized by the prompt, not the answer or tier
