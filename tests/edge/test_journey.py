"""The edge's journey as stages: a new stage plugs in without touching the others, every outcome is billed
exactly once by the one exit (issue 8, item 1), and what the router learns from an answer is told whose
request it was."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from edge.config import EdgeConfig
from edge.journey import Journey, Relayed, Reply
from edge.keys import KeyStore
from edge.node import build_edge_app
from edge.pipeline import Stage
from edge.stages import default_pipeline
from edge.state import EDGE
from edge.usage_audit import AuditedUsage
from tests.edge_fixtures import Edge, Pacer, edge_over_pacer, start_pacer

pytestmark = pytest.mark.slow

CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def edge_config(folder: Path, region_url: str, **upstream: object) -> EdgeConfig:
    return msgspec.convert(
        {
            "keys_db": str(folder / "keys.sqlite3"),
            "ledger_db": str(folder / "ledger.sqlite3"),
            "tls": {"enabled": False},
            "metrics": {"port": 0},
            "regions": [{"name": "pacer", "url": region_url}],
            "upstream": upstream,
        },
        EdgeConfig,
    )


def new_key(folder: Path, tenant: str = "journey") -> str:
    store = KeyStore(folder / "keys.sqlite3")
    try:
        return store.create(tenant=tenant)[0]
    finally:
        store.close()


async def chat(s: aiohttp.ClientSession, url: str, key: str, stream: bool) -> aiohttp.ClientResponse:
    """One chat request, answered 200 and read to its end."""
    async with s.post(
        url + "/v1/chat/completions",
        json={**CHAT, "stream": stream},
        headers={"Authorization": f"Bearer {key}"},
    ) as r:
        assert r.status == 200
        await r.read()
    return r


async def serve(app: web.Application) -> AsyncIterator[str]:
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture(scope="module")
def pacer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pacer]:
    p = start_pacer(tmp_path_factory.mktemp("pacer"), tokens=4, interval_ms=2)
    yield p
    p.process.stop()


async def test_a_new_stage_plugs_in_without_touching_the_others(tmp_path: Path, pacer: Pacer):
    seen: list[tuple[str, bool]] = []

    async def noop(journey: Journey) -> Reply | None:
        seen.append((journey.request_id, journey.admission is not None))
        return None

    pipeline = default_pipeline().with_stage(Stage("noop", noop), before="forward")
    assert pipeline.names == [
        "authenticate",
        "parse",
        "rightsize",
        "admit",
        "cut",
        "cache",
        "route",
        "gate",
        "noop",
        "forward",
        "relay",
        "continue",
        "store",
        "settle",
    ]
    key = new_key(tmp_path)
    async for url in serve(build_edge_app(edge_config(tmp_path, pacer.url), pipeline)):
        async with aiohttp.ClientSession() as s:
            for stream in (False, True):
                r = await chat(s, url, key, stream)
                assert (r.headers["x-request-id"], True) in seen  # it ran after admission, once
    assert len(seen) == 2


class CannedReply:
    """What a response cache's hit would hand back: an answer that never crosses the ocean."""

    def __init__(self, journey: Journey) -> None:
        self.journey = journey

    async def finish(self, audited: AuditedUsage | None) -> web.StreamResponse:
        return web.json_response({"cached": True, "billed": audited.usage.total_tokens if audited else None})


async def test_a_stage_can_answer_and_the_exit_still_bills_it_once(tmp_path: Path, pacer: Pacer):
    async def answer(journey: Journey) -> Reply | None:
        journey.answered()
        usage = b'{"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}'
        journey.relayed = Relayed(usage=usage, produced=True)
        return CannedReply(journey)

    pipeline = default_pipeline().with_stage(Stage("canned", answer), before="forward")
    key = new_key(tmp_path)
    async for url in serve(build_edge_app(edge_config(tmp_path, pacer.url), pipeline)):
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}) as r,
        ):
            assert r.status == 200 and await r.json() == {"cached": True, "billed": 5}
    rows = ledger_rows(tmp_path / "ledger.sqlite3")
    assert [(row["status"], row["region"], row["completion_tokens"]) for row in rows] == [("ok", "", 2)]


def ledger_rows(path: Path, client_id: str | None = None) -> list[dict]:
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    try:
        query, args = "SELECT * FROM usage", ()
        if client_id:
            query, args = query + " WHERE client_request_id = ?", (client_id,)
        return [dict(row) for row in db.execute(query, args)]
    finally:
        db.close()


async def one_row(edge: Edge, client_id: str) -> dict:
    for _ in range(60):  # rows of requests cut short are written just after
        rows = ledger_rows(edge.ledger_db, client_id)
        if rows:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # and no second one comes later
    rows = ledger_rows(edge.ledger_db, client_id)
    assert len(rows) == 1, rows
    return rows[0]


def session(edge: Edge) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context()))


async def test_each_outcome_is_billed_exactly_once(tmp_path: Path):
    async def streamed(edge: Edge, key: str, stop_after: int | None = None) -> str:
        client_id = uuid.uuid4().hex
        headers = {"Authorization": f"Bearer {key}", "x-client-request-id": client_id}
        async with (
            session(edge) as s,
            s.post(edge.url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers) as r,
        ):
            lines = 0
            while line := await r.content.readline():
                lines += line.startswith(b"data: ")
                if stop_after is not None and lines >= stop_after:
                    break  # the client leaves
        return client_id

    done = edge_over_pacer(tmp_path / "done", "done", tokens=4, interval_ms=20)
    cut = edge_over_pacer(tmp_path / "cut", "cut", tokens=20, interval_ms=5, break_after=3)
    stuck = edge_over_pacer(
        tmp_path / "stuck", "firehose", {"server": {"write_timeout_s": 1.0}}, tokens=100_000, interval_ms=0.05
    )
    try:
        row = await one_row(done, await streamed(done, done.new_key()))
        assert (row["status"], row["completion_tokens"]) == ("ok", 4)
        row = await one_row(done, await streamed(done, done.new_key(), stop_after=2))
        assert row["status"] == "aborted" and row["http_status"] == 499  # the client left
        row = await one_row(cut, await streamed(cut, cut.new_key()))
        assert (row["status"], row["error_code"], row["completion_tokens"]) == (
            "error",
            "upstream_unavailable",
            3,
        )
        big = stuck.new_key(tpm=10**9)
        payload = {**CHAT, "max_tokens": 100_000}
        client_id = uuid.uuid4().hex
        reader, writer = await asyncio.open_connection(
            "127.0.0.1",
            int(stuck.url.rsplit(":", 1)[1]),
            ssl=stuck.ssl_context(),
            server_hostname="localhost",
        )
        body = json.dumps({**payload, "stream": True}).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {big}\r\nx-client-request-id: {client_id}\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        await reader.read(1000)  # the stream started; now it stops reading
        row = await one_row_within(stuck, client_id, seconds=8)
        assert row["status"] == "aborted" and 0 < row["completion_tokens"] <= 100_000  # write timeout
        writer.close()
    finally:
        for edge in (done, cut, stuck):
            edge.stop()


async def one_row_within(edge: Edge, client_id: str, seconds: float) -> dict:
    for _ in range(int(seconds / 0.1)):
        if ledger_rows(edge.ledger_db, client_id):
            break
        await asyncio.sleep(0.1)
    return await one_row(edge, client_id)


async def test_each_answer_teaches_the_router_as_its_tenants(tmp_path: Path, pacer: Pacer):
    # A slower sample counts only as far as another tenant's corroborates it (geo/latency.py): one tenant's
    # slow request cannot move every user's traffic. So each sample must say whose request it was.
    keys = {tenant: new_key(tmp_path, tenant) for tenant in ("acme", "globex")}
    app = build_edge_app(edge_config(tmp_path, pacer.url))
    async for url in serve(app):
        observed = app[EDGE].pool.upstreams[0].replica.latency.observed
        async with aiohttp.ClientSession() as s:
            for tenant, key in keys.items():
                for stream in (True, False):
                    before = len(observed.recent)
                    await chat(s, url, key, stream)
                    # A stream teaches its first token, a whole answer its queue: either as the tenant's.
                    taught = [source for source, _, _ in list(observed.recent)[before:]]
                    assert taught and set(taught) == {tenant}, (stream, taught)
