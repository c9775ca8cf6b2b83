"""The scripts of one loop turn go to Redis together (edge/redis_scripts.py), against a real Redis: each
caller gets its own reply, in order; a script Redis forgot is sent again with its source; one script's
error fails only its caller; a script that watches for resets is not run where Redis forgot it (its
caller is told); a Redis gone fails every caller of the batch; a cancelled caller leaves the
others their replies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from edge.redis_scripts import Script, ScriptRunner, StoreReset
from tests.redis_server import RedisServer

INCR = Script.of("return redis.call('INCRBY', KEYS[1], ARGV[1])")
FAILS = Script.of("return redis.error_reply('refused on purpose')")


async def test_one_turns_calls_go_in_one_pipeline_and_each_gets_its_reply(tmp_path: Path):
    with RedisServer(tmp_path / "redis") as server:
        redis = Redis.from_url(server.url)
        runner = ScriptRunner(redis)
        try:
            replies = await asyncio.gather(*(runner.run(INCR, ["n"], [1]) for _ in range(20)))
            assert replies == list(range(1, 21))  # Redis never knew INCR: sent again with its source
            assert runner.batches == 1

            await redis.script_flush()  # a restarted Redis forgets its scripts
            mixed = [runner.run(INCR, ["n"], [10]), runner.run(FAILS, [], []), runner.run(INCR, ["n"], [5])]
            replies = await asyncio.gather(*mixed, return_exceptions=True)
            assert replies[0] == 30 and replies[2] == 35
            assert isinstance(replies[1], ResponseError) and "refused on purpose" in str(replies[1])

            alone = await runner.run(INCR, ["n"], [1])  # a call alone goes as it is
            assert alone == 36 and runner.batches == 2

            doomed = asyncio.ensure_future(runner.run(INCR, ["n"], [100]))
            kept = asyncio.ensure_future(runner.run(INCR, ["m"], [1]))
            await asyncio.sleep(0)
            doomed.cancel()  # its request went away: the batch still answers the others
            assert await kept == 1
            with pytest.raises(asyncio.CancelledError):
                await doomed
        finally:
            await runner.close()
            await redis.aclose()


async def test_a_redis_gone_fails_every_caller_of_the_batch(tmp_path: Path):
    server = RedisServer(tmp_path / "redis").start()
    redis = Redis.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    runner = ScriptRunner(redis)
    try:
        assert await runner.run(INCR, ["n"], [1]) == 1
        server.stop()
        calls = [runner.run(INCR, ["n"], [1]) for _ in range(5)]
        replies = await asyncio.gather(*calls, return_exceptions=True)
        unreachable = RedisConnectionError | RedisTimeoutError | OSError
        assert all(isinstance(r, unreachable) for r in replies), replies
    finally:
        await runner.close()
        await redis.aclose()
        server.stop()


async def test_a_script_that_watches_for_resets_is_not_run_where_redis_forgot_it(tmp_path: Path):
    watching = Script.of("return redis.call('INCRBY', KEYS[1], ARGV[1]) -- watching", watches_resets=True)
    with RedisServer(tmp_path / "redis") as server:
        redis = Redis.from_url(server.url)
        runner = ScriptRunner(redis)
        try:
            batch = [
                runner.run(watching, ["w"], [1]),
                runner.run(watching, ["w"], [1]),
                runner.run(INCR, ["n"], [1]),
            ]
            replies = await asyncio.gather(*batch, return_exceptions=True)
            # Every watching call of the batch is told, none ran; the other script runs as before.
            assert [type(r) for r in replies[:2]] == [StoreReset, StoreReset] and replies[2] == 1
            assert await redis.get("w") is None
            assert await runner.run(watching, ["w"], [1]) == 1  # loaded again for the next call
            await redis.script_flush()
            with pytest.raises(StoreReset):  # a call alone, the same
                await runner.run(watching, ["w"], [1])
            assert await redis.get("w") == b"1"
        finally:
            await runner.close()
            await redis.aclose()
