"""Requests the edge ends itself (issue 34): an open stream whose key is revoked meanwhile (N13), and streams
still running when a shutdown's time is up (N7). Either way the client is told why (an error event, then
``[DONE]``), the region's request is cancelled, and the ledger row bills what was delivered and names the
reason, never "the client left"."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from edge.keys import KeyStore
from tests.edge_fixtures import Edge, Pacer, start_edge, start_pacer

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
TOKENS = 100  # the pacer's whole answer: at 50 ms a token, a stream runs for 5 s unless it is ended


@dataclass
class Streamed:
    """What one client read of its stream."""

    max_tokens: int = TOKENS
    started_after: int = 2  # ``started`` is set once this many tokens came (or the stream ended)
    client_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    tokens: int = 0
    finish_reason: str = ""
    errors: list[dict] = field(default_factory=list)
    done: bool = False
    events_after_done: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)


async def read_stream(s: aiohttp.ClientSession, edge: Edge, key: str, got: Streamed) -> Streamed:
    """Read one chat stream to its end (the edge's end: the connection's), into ``got``."""
    headers = {"Authorization": f"Bearer {key}", "x-client-request-id": got.client_id}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": got.max_tokens}
    try:
        async with s.post(
            edge.url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers
        ) as r:
            assert r.status == 200, await r.text()
            while line := await r.content.readline():
                if line.startswith(b"data: "):
                    _note(got, line[len(b"data: ") :].strip())
    finally:
        got.started.set()  # a stream that ended early (or failed) wakes its waiter too
    return got


def _note(got: Streamed, payload: bytes) -> None:
    if got.done:
        got.events_after_done += 1
    if payload == b"[DONE]":
        got.done = True
        return
    chunk = json.loads(payload)
    if "error" in chunk:
        got.errors.append(chunk["error"])
    for choice in chunk.get("choices", []):
        if choice.get("delta", {}).get("content"):
            got.tokens += 1
            if got.tokens >= got.started_after:
                got.started.set()
        got.finish_reason = choice.get("finish_reason") or got.finish_reason


def session(edge: Edge) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context()))


def rows_by_client(edge: Edge) -> dict[str, dict]:
    return {row["client_request_id"]: row for row in edge.ledger_rows()}


async def rows_of(edge: Edge, streams: list[Streamed]) -> dict[str, dict]:
    """The rows of ``streams``, once all are written (a row may follow its stream's end by a moment)."""
    for _ in range(100):
        rows = rows_by_client(edge)
        if all(got.client_id in rows for got in streams):
            return rows
        await asyncio.sleep(0.05)
    missing = [g.client_id for g in streams if g.client_id not in rows_by_client(edge)]
    raise AssertionError(f"no ledger row for {missing}")


async def pacer_counts(url: str, abandoned: int) -> dict:
    """The pacer's /health once it counts ``abandoned`` requests whose client (the edge) left, or as it is
    after a bounded wait."""
    async with aiohttp.ClientSession() as s:
        for _ in range(100):
            async with s.get(url + "/health") as r:
                health = await r.json()
            if health["abandoned"] >= abandoned:
                break
            await asyncio.sleep(0.05)
    return health


def edge_and_pacer(folder: Path, name: str, **sections: dict[str, object]) -> tuple[Edge, Pacer]:
    pacer = start_pacer(folder, name=name, tokens=TOKENS, interval_ms=50)
    try:
        edge = start_edge(folder / "edge", [(name, pacer.url)], **sections)
    except Exception:
        pacer.process.stop()
        raise
    edge.extra.append(pacer.process)
    return edge, pacer


async def test_a_revoked_keys_open_streams_end_with_an_error_event(tmp_path: Path):
    edge, pacer = edge_and_pacer(tmp_path, "revoke-pacer")
    admin = KeyStore(edge.keys_db)  # as `nearshore keys revoke` opens it, beside the running edge
    try:
        revoked_key, other_key = edge.new_key(), edge.new_key()
        cut, cut_too, whole = Streamed(), Streamed(), Streamed()
        async with session(edge) as s:
            tasks = [
                asyncio.create_task(read_stream(s, edge, key, got))
                for key, got in ((revoked_key, cut), (revoked_key, cut_too), (other_key, whole))
            ]
            await asyncio.gather(*(got.started.wait() for got in (cut, cut_too, whole)))
            assert admin.revoke(revoked_key[len("ns-") : len("ns-") + 12])
            await asyncio.gather(*tasks)
        for got in (cut, cut_too):
            assert got.tokens < TOKENS, "the revoked key's stream ran to its end"
            assert [e["code"] for e in got.errors] == ["key_revoked"], got.errors
            assert got.done and got.events_after_done == 0 and got.finish_reason == ""
        # Another key's stream, open at the same time, is untouched.
        assert (whole.tokens, whole.finish_reason, whole.errors, whole.done) == (TOKENS, "length", [], True)
        # The region's requests were cancelled: the pacer saw its client leave them.
        health = await pacer_counts(pacer.url, abandoned=2)
        assert (health["abandoned"], health["answered"]) == (2, 1), health
        rows = await rows_of(edge, [cut, cut_too, whole])
        for got in (cut, cut_too):
            row = rows[got.client_id]
            assert (row["status"], row["http_status"], row["error_code"]) == ("error", 401, "key_revoked")
            assert row["completion_tokens"] == got.tokens  # what was delivered, no more
        assert (rows[whole.client_id]["status"], rows[whole.client_id]["completion_tokens"]) == ("ok", TOKENS)
    finally:
        admin.close()
        edge.stop()


async def test_shutdown_ends_the_streams_still_running_with_an_error_event(tmp_path: Path):
    # Streams get 2 s after SIGTERM; the long ones would need about 5 s more.
    edge, pacer = edge_and_pacer(tmp_path, "shutdown-pacer", server={"shutdown_timeout_s": 2})
    try:
        key = edge.new_key()
        long = [Streamed() for _ in range(3)]
        short = Streamed(max_tokens=4, started_after=1)  # open at SIGTERM; it ends well within the 2 s
        async with session(edge) as s:
            tasks = [asyncio.create_task(read_stream(s, edge, key, got)) for got in [*long, short]]
            await asyncio.gather(*(got.started.wait() for got in [*long, short]))
            edge.process.proc.send_signal(signal.SIGTERM)
            await asyncio.gather(*tasks)
        for got in long:
            assert got.tokens < TOKENS, "a stream ran to its end past the shutdown's time"
            assert [e["code"] for e in got.errors] == ["server_shutting_down"], got.errors
            assert got.done and got.events_after_done == 0 and got.finish_reason == ""
        assert (short.tokens, short.finish_reason, short.errors, short.done) == (4, "length", [], True)
        try:
            code = edge.process.proc.wait(timeout=30)  # a bound for a hung process, not a timing check
        except subprocess.TimeoutExpired:
            pytest.fail(f"the edge did not exit after SIGTERM:\n{edge.process.log_tail()}")
        assert code == 0, edge.process.log_tail()
        rows = rows_by_client(edge)
        for got in long:
            row = rows[got.client_id]
            assert (row["status"], row["http_status"], row["error_code"]) == (
                "error",
                503,
                "server_shutting_down",
            )
            assert row["completion_tokens"] == got.tokens
        assert (rows[short.client_id]["status"], rows[short.client_id]["completion_tokens"]) == ("ok", 4)
        health = await pacer_counts(pacer.url, abandoned=len(long))  # the region's requests were cancelled
        assert health["abandoned"] == len(long), health
    finally:
        edge.stop()
