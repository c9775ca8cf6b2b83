"""Unary answers teach the router as streams do (issue 34 N3), against real replicas behind a real edge: a
replica that answers /health at once and reports an idle batch, but takes seconds per non-streamed answer,
loses its unary traffic to one that answers at once, after a request or two, as it would with streams.

``a`` (London, nearer Lagos) is slow per answer; ``b`` (Virginia) is quick."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.edge.test_failover import MODEL, PRICES, UPSTREAM, ask, log_of
from tests.edge_fixtures import Pacer, start_edge, start_hostile

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Pacer]]:
    folder = tmp_path_factory.mktemp("unary-routing")
    started: dict[str, Pacer] = {}
    try:
        for name in "ab":
            started[name] = start_hostile(folder, name=name, limit_s=30, tokens=6)
        yield started
    finally:
        for replica in started.values():
            replica.process.stop()


async def test_a_replica_slow_at_unary_answers_loses_its_unary_traffic(tmp_path, replicas: dict[str, Pacer]):
    regions = [
        {"name": "a", "url": replicas["a"].url, "city": "london", "models": [MODEL]},
        {"name": "b", "url": replicas["b"].url, "city": "virginia", "models": [MODEL]},
    ]
    edge = start_edge(
        tmp_path / "edge",
        regions,
        top={"models": [MODEL], "prices": PRICES},
        upstream={**UPSTREAM, "ttft_timeout_s": 10.0, "request_deadline_s": 30.0},
        cache={"enabled": False},
        fallbacks={"models": {}},
    )
    try:
        key = edge.new_key()
        served = []
        for _ in range(8):
            answer = await ask(edge, key, "a=slow-first-token:1.5,b=ok", stream=False)
            assert answer.status == 200, answer.body[:300]
            served.append(answer.headers["x-nearshore-region"])
        assert served[0] == "a"  # the nearer one, while nothing says it is slow
        assert served[-4:] == ["b"] * 4, served  # its unary answers taught the router
        assert len(await log_of(replicas["a"])) <= 3
    finally:
        edge.stop()
