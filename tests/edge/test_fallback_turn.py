"""The fallback chain always gets its turn (issue 34, failover item 3): with as many replicas of the model as
``max_attempts``, all refusing, the model's own replicas leave an attempt for its fallback, which answers;
the answer, its headers and its ledger row name the fallback as any fallback's do, and ``max_attempts``
still bounds the requests sent.

Replicas ``a`` to ``d`` (``nearshore hostile``) serve MODEL and answer 503 here; ``e`` serves only SMALL,
MODEL's configured fallback."""

from __future__ import annotations

import aiohttp
import pytest

from tests.edge.test_failover import MODEL, PRICES, SMALL, UPSTREAM, ask, log_of, row_of
from tests.edge_fixtures import Edge, Pacer, start_edge, start_hostile

pytestmark = pytest.mark.slow

OWN = "abcd"
ALL_REFUSE = "a=503,b=503,c=503,d=503,e=ok"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("four-replicas")
    started: dict[str, Pacer] = {}
    try:
        for name in OWN + "e":
            started[name] = start_hostile(folder, name=name, limit_s=30, tokens=6)
        yield started
    finally:
        for replica in started.values():
            replica.process.stop()


def edge_over(folder, replicas: dict[str, Pacer], max_attempts: int) -> Edge:
    regions = [{"name": name, "url": replicas[name].url, "models": [MODEL]} for name in OWN]
    regions.append({"name": "e", "url": replicas["e"].url, "models": [SMALL]})
    return start_edge(
        folder,
        regions,
        top={"models": [MODEL, SMALL], "prices": PRICES},
        upstream={
            **UPSTREAM,
            "max_attempts": max_attempts,
            "ttft_timeout_s": 10.0,
            "request_deadline_s": 30.0,
        },
        cache={"enabled": False},
        fallbacks={"models": {MODEL: [SMALL]}},
    )


@pytest.mark.parametrize(("max_attempts", "stream"), [(4, True), (4, False), (1, True)])
async def test_the_fallback_answers_when_every_replica_of_the_model_refuses(
    tmp_path, replicas: dict[str, Pacer], max_attempts: int, stream: bool
):
    for replica in replicas.values():  # each case counts its own requests
        async with aiohttp.ClientSession() as s, s.delete(replica.url + "/_log") as r:
            assert r.status == 200
    edge = edge_over(tmp_path / "edge", replicas, max_attempts)
    try:
        answer = await ask(edge, edge.new_key(), ALL_REFUSE, stream=stream)
        assert answer.status == 200, answer.body[:400]
        assert answer.headers["x-nearshore-model"] == SMALL and answer.headers["x-nearshore-region"] == "e"
        assert answer.text()
        row = await row_of(edge, answer.client_id)
        assert (row["model"], row["fallback_from"], row["region"], row["status"]) == (SMALL, MODEL, "e", "ok")
        asked = {name: len(await log_of(replica)) for name, replica in replicas.items()}
        assert asked["e"] == 1
        own = sum(asked[name] for name in OWN)
        assert own >= 1
        # max_attempts bounds the requests sent; with a chain, the model's replicas leave it one of them
        # (with max_attempts = 1, the model's one and the fallback's one).
        assert own + asked["e"] == row["attempts"] == max(max_attempts, 2)
    finally:
        edge.stop()
