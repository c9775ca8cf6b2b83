"""A key's share of the pool through a real edge (in process) over a paced region: over its caps while another
key uses the pool a request waits, then gets an OpenAI-shaped 429; the share is given back on every exit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest

from edge.config import EdgeConfig
from edge.journey import Journey, Reply
from edge.keys import parse_key, share_key
from edge.node import build_edge_app
from edge.pipeline import Stage
from edge.stages import default_pipeline
from edge.state import EDGE
from harness.procs import free_port
from nearshore.protocol.headers import SHARE_KEY
from tests.edge.test_journey import new_key, serve
from tests.edge_fixtures import Pacer, start_pacer

pytestmark = pytest.mark.slow

CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def pacer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pacer]:
    p = start_pacer(tmp_path_factory.mktemp("pacer"), tokens=8, interval_ms=50)  # a stream takes ~0.4 s
    yield p
    p.process.stop()


def config(folder: Path, region_url: str, **key_share: object) -> EdgeConfig:
    return msgspec.convert(
        {
            "keys_db": str(folder / "keys.sqlite3"),
            "ledger_db": str(folder / "ledger.sqlite3"),
            "tls": {"enabled": False},
            "metrics": {"port": 0},
            "cache": {"enabled": False},
            "regions": [{"name": "pacer", "url": region_url}],
            "pools": {"key_share": {"max_concurrent": 1, **key_share}},
        },
        EdgeConfig,
    )


def key_id(plaintext: str) -> str:
    parsed = parse_key(plaintext)
    assert parsed is not None
    return parsed[0]


async def post(s: aiohttp.ClientSession, url: str, key: str, **body: object) -> tuple[int, dict, bytes]:
    async with s.post(
        url + "/v1/chat/completions", json={**CHAT, **body}, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        return r.status, dict(r.headers), await r.read()


async def test_over_its_cap_beside_another_key_a_request_waits_then_gets_a_429(tmp_path: Path, pacer: Pacer):
    flood, victim = new_key(tmp_path), new_key(tmp_path)  # before the edge loads its keys
    app = build_edge_app(config(tmp_path, pacer.url, max_wait_s=0.2, max_queue=4))
    async for url in serve(app):
        async with aiohttp.ClientSession() as s:
            victim_chat = asyncio.create_task(post(s, url, victim, stream=True))
            await asyncio.sleep(0.1)  # the victim's stream is in flight: the pool is shared
            first, second = await asyncio.gather(
                post(s, url, flood, stream=True), post(s, url, flood, stream=True)
            )
            assert (await victim_chat)[0] == 200
        statuses = sorted([first[0], second[0]])
        refused = first if first[0] == 429 else second
        assert statuses == [200, 429]
        error = msgspec.json.decode(refused[2])["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "concurrency_limit_exceeded"
        assert "at its limit of 1 requests" in error["message"] and refused[1]["Retry-After"] == "1"
        shares = app[EDGE].gates["large"].shares
        assert shares is not None and shares.in_flight(key_id(flood)) == (0, 0)


async def test_a_key_alone_is_not_held_back(tmp_path: Path, pacer: Pacer):
    key = new_key(tmp_path)
    app = build_edge_app(config(tmp_path, pacer.url, max_wait_s=0.0))
    async for url in serve(app):
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(post(s, url, key, stream=True) for _ in range(4)))
    assert [status for status, _, _ in results] == [200] * 4


async def test_the_share_is_given_back_on_every_exit(tmp_path: Path, pacer: Pacer):
    key = new_key(tmp_path)
    app = build_edge_app(config(tmp_path, pacer.url, shared_only=False, max_wait_s=0.0))
    shares = app[EDGE].gates["large"].shares
    assert shares is not None
    async for url in serve(app):
        async with aiohttp.ClientSession() as s:
            for stream in (False, True):  # answered
                assert (await post(s, url, key, stream=stream))[0] == 200
                assert shares.in_flight(key_id(key)) == (0, 0)
            # The client leaves mid-stream.
            async with s.post(
                url + "/v1/chat/completions",
                json={**CHAT, "stream": True},
                headers={"Authorization": f"Bearer {key}"},
            ) as r:
                await r.content.readline()
                assert shares.in_flight(key_id(key))[0] == 1
            for _ in range(50):
                if shares.in_flight(key_id(key)) == (0, 0):
                    break
                await asyncio.sleep(0.02)
            assert shares.in_flight(key_id(key)) == (0, 0)
            assert (await post(s, url, key))[0] == 200  # and the next request is not refused
    # Errors: a region that is not there.
    (tmp_path / "dead").mkdir()
    dead_key = new_key(tmp_path / "dead")
    dead = build_edge_app(config(tmp_path / "dead", f"http://127.0.0.1:{free_port()}", shared_only=False))
    dead_shares = dead[EDGE].gates["large"].shares
    assert dead_shares is not None
    async for url in serve(dead):
        async with aiohttp.ClientSession() as s:
            for _ in range(2):
                status, _, _ = await post(s, url, dead_key, stream=True)
                assert status in (502, 503, 504)
                assert dead_shares.in_flight(key_id(dead_key)) == (0, 0)


async def test_the_edge_sends_the_region_an_opaque_share_key(tmp_path: Path, pacer: Pacer):
    seen: list[dict[str, str]] = []

    async def capture(journey: Journey) -> Reply | None:
        assert journey.call is not None
        seen.append(journey.call.headers)
        return None

    key = new_key(tmp_path)
    pipeline = default_pipeline().with_stage(Stage("capture", capture), before="forward")
    app = build_edge_app(config(tmp_path, pacer.url), pipeline)
    async for url in serve(app):
        async with aiohttp.ClientSession() as s:
            status, _, _ = await post(s, url, key, stream=True)
            assert status == 200
            # A client cannot choose its share: the edge's value replaces whatever it sent.
            async with s.post(
                url + "/v1/chat/completions",
                json=CHAT,
                headers={"Authorization": f"Bearer {key}", SHARE_KEY: "someone-else"},
            ) as r:
                assert r.status == 200
    assert [h[SHARE_KEY] for h in seen] == [share_key(key_id(key))] * 2
    assert all(key_id(key) not in value and key not in value for h in seen for value in h.values())
