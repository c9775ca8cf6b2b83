"""Circuits and cooling are the upstream's and the model's (issue 34, failover item 4), against a real
misbehaving server (``nearshore hostile``) behind a real edge.

- One model failing on a server opens that model's circuit there, however well another model answers on the
  same server in between; the other model is never benched by it.
- Two region entries that name one URL are one server: a Retry-After from it is not "escaped" by asking the
  other entry at once, and the edge warns about them at start. One model's Retry-After does not make another
  model skip the server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import aiohttp
import pytest

from tests.edge.test_failover import MODEL, PRICES, SMALL, UPSTREAM, log_of
from tests.edge_fixtures import Edge, Pacer, start_edge, start_hostile

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pacer]:
    started = start_hostile(tmp_path_factory.mktemp("one-server"), name="h", limit_s=30, tokens=4)
    try:
        yield started
    finally:
        started.process.stop()


@pytest.fixture(autouse=True)
async def fresh_log(server: Pacer) -> None:
    async with aiohttp.ClientSession() as s, s.delete(server.url + "/_log") as r:
        assert r.status == 200


def edge_over(folder, server: Pacer, names: list[str], **upstream: object) -> Edge:
    regions = [{"name": name, "url": server.url, "models": [MODEL, SMALL]} for name in names]
    return start_edge(
        folder,
        regions,
        top={"models": [MODEL, SMALL], "prices": PRICES},
        upstream={**UPSTREAM, **upstream},
        cache={"enabled": False},
        fallbacks={"models": {}},
        geo={"health": {"consecutive_failures": 3, "base_ejection_s": 60.0, "max_ejected_percent": 100}},
    )


async def ask(edge: Edge, key: str, model: str, mode: str) -> tuple[int, dict]:
    payload = {
        "model": model,
        "max_tokens": 4,
        "user": f"mode:{mode}",
        "messages": [{"role": "user", "content": f"hi {uuid.uuid4().hex}"}],
    }
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(
            edge.url + "/v1/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
        ) as r,
    ):
        return r.status, await r.json()


async def modes_asked(server: Pacer) -> list[str]:
    return [entry["mode"] for entry in await log_of(server)]


async def test_a_failing_model_opens_its_own_circuit_while_another_model_answers_on_the_server(
    tmp_path, server: Pacer
):
    edge = edge_over(tmp_path / "edge", server, ["h"], max_attempts=1)
    try:
        key = edge.new_key()
        for _ in range(6):
            status, _ = await ask(edge, key, MODEL, "503")
            assert status == 503
            status, body = await ask(edge, key, SMALL, "ok")
            assert status == 200, body  # the failing model never benches the server for this one
        asked = await modes_asked(server)
        # Three failures in a row open MODEL's circuit there, though SMALL's answers came between them;
        # after that MODEL's requests are refused at the edge (its only region is out for it).
        assert asked.count("503") == 3 and asked.count("ok") == 6, asked
    finally:
        edge.stop()


async def test_two_entries_naming_one_url_share_its_retry_after_per_model(tmp_path, server: Pacer):
    edge = edge_over(tmp_path / "edge", server, ["h1", "h2"])
    try:
        key = edge.new_key()
        status, body = await ask(edge, key, MODEL, "429:30")
        assert status == 429, body
        # The server said "not for 30 s": the other entry is that server, so it is not asked at once.
        assert await modes_asked(server) == ["429:30"]
        status, body = await ask(edge, key, SMALL, "ok")
        assert status == 200, body  # another model is not cooling there
        log = (edge.folder / "edge.log").read_text(errors="replace")
        assert "regions h1 and h2 name one upstream" in log
    finally:
        edge.stop()
