"""What the router learns from each answer is told whose request it was (its key's tenant), through a real
edge (in process) over a paced region: a slower sample then counts only as far as another tenant's
corroborates it (geo/latency.py), so one tenant's slow request cannot move every user's traffic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest

from edge.config import EdgeConfig
from edge.keys import KeyStore
from edge.node import build_edge_app
from edge.state import EDGE
from tests.edge.test_journey import serve
from tests.edge_fixtures import Pacer, start_pacer

CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def pacer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pacer]:
    p = start_pacer(tmp_path_factory.mktemp("pacer"), tokens=4, interval_ms=2)
    yield p
    p.process.stop()


def key_of(folder: Path, tenant: str) -> str:
    store = KeyStore(folder / "keys.sqlite3")
    try:
        return store.create(tenant=tenant)[0]
    finally:
        store.close()


async def test_each_answer_teaches_the_router_as_its_tenants(tmp_path: Path, pacer: Pacer):
    keys = {tenant: key_of(tmp_path, tenant) for tenant in ("acme", "globex")}
    config = msgspec.convert(
        {
            "keys_db": str(tmp_path / "keys.sqlite3"),
            "ledger_db": str(tmp_path / "ledger.sqlite3"),
            "tls": {"enabled": False},
            "metrics": {"port": 0},
            "cache": {"enabled": False},
            "regions": [{"name": "pacer", "url": pacer.url}],
        },
        EdgeConfig,
    )
    app = build_edge_app(config)
    async for url in serve(app):
        observed = app[EDGE].pool.upstreams[0].replica.latency.observed
        async with aiohttp.ClientSession() as s:
            for tenant, key in keys.items():
                for stream in (True, False):
                    before = len(observed.recent)
                    async with s.post(
                        url + "/v1/chat/completions",
                        json={**CHAT, "stream": stream},
                        headers={"Authorization": f"Bearer {key}"},
                    ) as r:
                        assert r.status == 200
                        await r.read()
                    # A stream teaches its first token, a whole answer its queue: either as the tenant's.
                    taught = [source for source, _, _ in list(observed.recent)[before:]]
                    assert taught and set(taught) == {tenant}, (stream, taught)
