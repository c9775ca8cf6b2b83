"""A Redis restart (empty) loses neither the shared limits nor the shared budgets (issue 34 N4), with two
real edges on one real redis-server, each with its own ledger.

- Limits: each edge keeps its own record of what it admitted in the window; an edge notices the loss on its
  next admission (or by its marker, unasked), puts its part of every key's window back, and waits a grace
  while the others put back theirs, so the window counts every request again before Redis decides.
- Budgets: each ledger adds its own spend to the key's shared spend once per Redis (it used to be the first
  edge's ledger alone, so a restart halved what the key had spent and the budget was overspent).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator

import pytest

from tests.edge.test_shared_state import health, post, refusal, session, two_edges_on_redis
from tests.edge_fixtures import Edge
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture
def two_edges(tmp_path) -> Iterator[tuple[RedisServer, Edge, Edge]]:
    with two_edges_on_redis(tmp_path) as edges:
        yield edges


async def restart_empty(redis: RedisServer, edges: tuple[Edge, ...]) -> None:
    redis.stop()
    redis.start()  # no persistence: an empty Redis on the same port
    for edge in edges:
        for _ in range(100):
            if (await health(edge))["limits"] == "up":
                break
            await asyncio.sleep(0.1)


def spent(edge: Edge, key: str) -> float:
    db = sqlite3.connect(edge.ledger_db)
    try:
        key_id = key.split("-")[1]
        return db.execute(
            "SELECT coalesce(sum(cost_usd), 0) FROM usage WHERE key_id = ?", (key_id,)
        ).fetchone()[0]
    finally:
        db.close()


async def test_a_redis_restart_keeps_the_window_each_edge_admitted(two_edges):
    redis, first, second = two_edges
    key = first.new_key(rpm=10)
    async with session(first) as s1, session(second) as s2:
        before = [await post(s1, first, key) for _ in range(5)] + [
            await post(s2, second, key) for _ in range(5)
        ]
        assert before == [200] * 10
        await restart_empty(redis, (first, second))
        after = [await post(s, edge, key) for s, edge in ((s1, first), (s2, second)) * 3]
    # The minute's ten requests are still counted, both edges' parts of them, from the first request after
    # the restart (it used to be six admitted, then one before the second edge's part was back).
    assert after == [429] * 6, after


async def test_a_redis_restart_does_not_reopen_a_spent_budget(two_edges):
    redis, first, second = two_edges
    budget = 0.000005
    key = first.new_key(budget_usd=budget, rpm=1000, tpm=10**6)
    async with session(first) as s1, session(second) as s2:
        served, refused = 0, set()
        for i in range(200):  # alternately through each edge, until the budget has said no on both
            s, edge = (s1, first) if i % 2 else (s2, second)
            status, error, _ = await refusal(s, edge, key)
            if status == 200:
                served += 1
                continue
            assert error["code"] == "insufficient_quota", error
            refused.add(edge.url)
            if len(refused) == 2:
                break
        assert served >= 2  # both edges spent part of it
        await restart_empty(redis, (first, second))
        after = [await refusal(s, edge, key) for s, edge in ((s1, first), (s2, second)) * 2]
    assert [status for status, _, _ in after] == [429] * 4, after
    assert all(error["code"] == "insufficient_quota" for _, error, _ in after)
    await asyncio.sleep(0.2)
    assert spent(first, key) + spent(second, key) <= budget
    assert spent(first, key) > 0 and spent(second, key) > 0
