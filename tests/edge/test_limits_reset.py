"""Shared limits across a Redis restart that comes back empty (issue 34, N4): every edge's part of a key's
window is put back before Redis decides again, including the part of an edge that sends nothing after the
restart, and an edge that admitted none of the key's requests does not start it from nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from edge.limits import LimitSpec
from edge.limits_redis import RedisLimiter
from tests.redis_server import RedisServer


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def two_edges(redis: RedisServer) -> tuple[RedisLimiter, RedisLimiter]:
    return tuple(RedisLimiter(redis.url, "open", retry_interval_s=0.2) for _ in range(2))  # type: ignore[return-value]


async def marked(*limiters: RedisLimiter) -> None:
    """Until each has its marker in Redis (its watcher's first round, begun by its first admission): a
    state lost before that cannot be told from a first start, here as in any edge."""
    while not all(limiter.marked for limiter in limiters):
        await asyncio.sleep(0.01)


async def test_after_an_empty_restart_an_edge_with_none_of_a_keys_requests_does_not_start_it_over(
    restartable: RedisServer,
):
    first, second = two_edges(restartable)
    key, spec = uuid.uuid4().hex, LimitSpec(rpm=4, tpm=0)
    try:
        assert (await first.admit(uuid.uuid4().hex, spec, 1)).allowed  # the first edge is running
        assert all([(await second.admit(key, spec, 1)).allowed for _ in range(3)])  # 3 of 4, all second's
        await marked(first, second)

        restartable.stop()
        restartable.start()  # empty; the second edge sends nothing from now on

        after = [await first.admit(key, spec, 1) for _ in range(2)]
        assert [d.allowed for d in after] == [True, False]  # the 4th, then the limit (not 4 more)
        assert not any(d.degraded for d in after)  # decided by Redis, with the whole window
        assert first.store_resets() == 1 and second.store_resets() == 1  # the second noticed, unasked
        refused = await second.admit(key, spec, 1)
        assert not refused.allowed and refused.refused_by == "requests"
    finally:
        await asyncio.gather(first.close(), second.close())


async def test_a_flushed_redis_is_noticed_by_every_edge_and_the_window_put_back(restartable: RedisServer):
    first, second = two_edges(restartable)
    key, spec = uuid.uuid4().hex, LimitSpec(rpm=3, tpm=0)
    try:
        assert (await first.admit(key, spec, 1)).allowed
        assert (await second.admit(key, spec, 1)).allowed
        await marked(first, second)
        with Redis.from_url(restartable.url) as client:
            client.flushall()  # the data gone, the scripts kept: only the markers tell
        while first.resets == 0 or second.resets == 0:
            await asyncio.sleep(0.05)
        decisions = [await first.admit(key, spec, 1) for _ in range(2)]
        assert [d.allowed for d in decisions] == [True, False]
    finally:
        await asyncio.gather(first.close(), second.close())
