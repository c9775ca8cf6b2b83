"""A city's edges as one for keys (issue 35, item 1): three real edges over one stand-in region, their keys
in one real PostgreSQL table. A key revoked with ``nearshore keys revoke`` ends its streams on every edge;
a key made through one edge's admin API works on all three; a lowered RPM holds on each; PostgreSQL
stopped, the known keys are still served and an unknown one gets a clear 503 until it is back."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from edge.keys_admin import TOKEN_ENV
from edge.keys_pg import PgKeyStore
from nearshore.children import nearshore_argv
from tests.conftest import Node, Postgres
from tests.edge.test_ended_by_edge import TOKENS, Streamed, read_stream
from tests.edge.test_region import client as openai_client
from tests.edge_fixtures import Edge, start_edge, start_pacer

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
ADMIN_TOKEN = secrets.token_urlsafe(32)


@pytest.fixture
def fleet(postgres: Postgres, tmp_path: Path) -> Iterator[list[Edge]]:
    pacer = start_pacer(tmp_path, name="city-region", tokens=TOKENS, interval_ms=50)
    edges: list[Edge] = []
    os.environ[TOKEN_ENV] = ADMIN_TOKEN  # read by each edge at start (its environment is copied then)
    try:
        for i in range(3):
            keys = {"backend": "postgres", "postgres_url": postgres.url, "offline_grace_s": 600}
            edges.append(start_edge(tmp_path / f"edge{i}", [("city-region", pacer.url)], keys=keys))
        yield edges
    finally:
        del os.environ[TOKEN_ENV]
        for edge in edges:
            edge.stop()
        pacer.process.stop()


def session(edge: Edge) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context()))


async def status_of(edge: Edge, key: str) -> tuple[int, str]:
    """One short chat: its HTTP status and error code ("" when none)."""
    async with (
        session(edge) as s,
        s.post(edge.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        body = await r.json()
        return r.status, (body.get("error") or {}).get("code") or ""


async def admin(edge: Edge, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, edge.metrics_url + path, json=body, headers=headers) as r,
    ):
        return r.status, await r.json()


async def until_status(edge: Edge, key: str, wanted: int, tries: int = 100) -> list[int]:
    """Chat until ``wanted`` comes back (a change may take a moment to arrive); every status seen."""
    seen: list[int] = []
    while len(seen) < tries:
        seen.append((await status_of(edge, key))[0])
        if seen[-1] == wanted:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"{edge.url} never answered {wanted}: {seen}")


async def test_revoked_created_and_changed_keys_hold_on_every_edge_of_the_city(
    fleet: list[Edge], postgres: Postgres
):
    store = await PgKeyStore(postgres.url).open()
    try:
        doomed, doomed_record = await store.create("acme")
        for edge in fleet:
            edge.wait_for_key(doomed)

        # A key made through one edge's admin API (the operator's listener) works on all three.
        status, made = await admin(fleet[0], "POST", "/admin/keys", {"tenant": "globex", "rpm": 100})
        assert status == 201 and made["record"]["tenant"] == "globex"
        for edge in fleet:
            edge.wait_for_key(made["key"])
        assert (await admin(fleet[1], "GET", "/admin/keys"))[1]["data"][-1]["key_id"] == made["record"][
            "key_id"
        ]
        assert (await admin(fleet[2], "GET", "/admin/keys", None))[0] == 200
        async with aiohttp.ClientSession() as s, s.get(fleet[0].metrics_url + "/admin/keys") as r:
            assert r.status == 401  # no admin token: nothing

        # One stream of the doomed key on every edge; revoked with the CLI, each ends with key_revoked.
        streams = [Streamed() for _ in fleet]
        sessions = [session(edge) for edge in fleet]
        try:
            reading = [
                asyncio.create_task(read_stream(s, edge, doomed, got))
                for s, edge, got in zip(sessions, fleet, streams, strict=True)
            ]
            await asyncio.gather(*(got.started.wait() for got in streams))
            revoke = nearshore_argv("keys", "revoke", doomed_record.key_id, "--postgres", postgres.url)
            done = await asyncio.to_thread(
                subprocess.run, revoke, capture_output=True, text=True, check=False
            )
            assert done.returncode == 0, done.stderr
            await asyncio.gather(*reading)
        finally:
            await asyncio.gather(*(s.close() for s in sessions))
        for got in streams:
            assert got.tokens < TOKENS and [e["code"] for e in got.errors] == ["key_revoked"], got
        assert [await status_of(edge, doomed) for edge in fleet] == [(401, "invalid_api_key")] * 3

        # A lowered RPM, changed through another edge's admin API, holds on each edge.
        key_id = made["record"]["key_id"]
        status, changed = await admin(fleet[1], "PATCH", f"/admin/keys/{key_id}", {"rpm": 1})
        assert status == 200 and changed["rpm"] == 1
        for edge in fleet:
            seen = await until_status(edge, made["key"], 429)
            assert seen.count(200) <= 2, seen  # the old RPM let at most the first one or two through
            assert await status_of(edge, made["key"]) == (429, "rate_limit_exceeded")

        # Bad admin input is a clear 400, and the edge goes on serving.
        status, error = await admin(fleet[2], "PATCH", f"/admin/keys/{key_id}", {"rpm": 0})
        assert status == 400 and "rpm" in error["error"]["message"]
        status, error = await admin(fleet[2], "PATCH", f"/admin/keys/{key_id}", {"secret": "x"})
        assert status == 400 and error["error"]["param"] == "secret"
        assert (await admin(fleet[2], "DELETE", "/admin/keys/000000000000"))[0] == 404
    finally:
        await store.close()


async def test_postgres_stopped_the_city_serves_known_keys_and_refuses_unknown_ones_clearly(
    fleet: list[Edge], postgres: Postgres
):
    store = await PgKeyStore(postgres.url).open()
    known, _ = await store.create("acme", rpm=1000)
    await store.close()
    for edge in fleet:
        edge.wait_for_key(known)
    never_issued = "ns-0123456789ab-" + "A" * 43

    postgres.server.stop()
    try:
        for edge in fleet:
            await until_details(edge, lambda keys: keys["store"].startswith("out of reach"))
            assert await status_of(edge, known) == (200, "")
            assert await status_of(edge, never_issued) == (503, "keys_unavailable")
            async with session(edge) as s, s.get(edge.url + "/health") as r:
                assert r.status == 200 and await r.json() == {"status": "degraded", "reason": "keys"}
    finally:
        postgres.server.start()
    for edge in fleet:
        await until_details(edge, lambda keys: keys["store"] == "up")
        assert await status_of(edge, never_issued) == (401, "invalid_api_key")


async def until_details(edge: Edge, holds, tries: int = 400) -> dict:
    """The operator's /health "keys" part once ``holds`` is true of it (checked every 25 ms, bounded)."""
    async with aiohttp.ClientSession() as s:
        for _ in range(tries):
            async with s.get(edge.metrics_url + "/health") as r:
                keys = (await r.json())["keys"]
            if holds(keys):
                return keys
            await asyncio.sleep(0.025)
    raise AssertionError(f"{edge.metrics_url}: keys stayed {keys}")


async def test_three_edges_over_the_real_model_answer_the_official_client_until_its_key_is_revoked(
    postgres: Postgres, region: Node, tmp_path: Path
):
    """The same city over the real llama.cpp region: the official openai client streams through each
    edge; once its key is revoked (nearshore keys revoke), every edge refuses it."""
    keys = {"backend": "postgres", "postgres_url": postgres.url}
    edges = [start_edge(tmp_path / f"edge{i}", [("london", region.url)], keys=keys) for i in range(3)]
    try:
        key = await postgres.create_key("acme")
        for edge in edges:
            edge.wait_for_key(key)
            stream = openai_client(edge, key).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        key_id = key[len("ns-") : len("ns-") + 12]
        revoke = nearshore_argv("keys", "revoke", key_id, "--postgres", postgres.url)
        assert subprocess.run(revoke, capture_output=True, check=False).returncode == 0
        for edge in edges:
            refused = await until_status(edge, key, 401)
            assert refused[-1] == 401
            with pytest.raises(openai.AuthenticationError):
                openai_client(edge, key).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "Hi?"}], max_tokens=2
                )
    finally:
        for edge in edges:
            edge.stop()
