"""RPM and TPM limits: both backends against the same cases, Redis shared by two edges, Redis going away."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from edge.limits import (
    FIT_SCAN_ENTRIES,
    Decision,
    LimiterUnavailable,
    LimitSpec,
    RateLimiter,
    Window,
    format_reset,
    rate_limit_headers,
)
from edge.limits_memory import MemoryLimiter
from edge.limits_redis import RedisLimiter
from tests.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of its own, for the tests that stop and restart it."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    if request.param == "memory":
        made: RateLimiter = MemoryLimiter()
    else:
        made = RedisLimiter(request.getfixturevalue("redis_server").url, "closed", socket_timeout_s=PATIENT_S)
    yield made
    await made.close()


# Tests that read a live Redis wait on it patiently: the product's 0.25 s socket timeout is for failing
# over fast, and a busy CI machine can stall a hundred concurrent scripts longer than that.
PATIENT_S = 10.0


def new_key() -> str:
    return uuid.uuid4().hex  # the Redis server is shared by the module's tests


# --- both backends --------------------------------------------------------------------------------------


async def test_rpm_refuses_the_request_over_the_limit(limiter: RateLimiter):
    key, spec = new_key(), LimitSpec(rpm=3, tpm=0)
    admitted = [await limiter.admit(key, spec, 10) for _ in range(3)]
    assert all(d.allowed and d.reservation for d in admitted)
    assert [d.requests.remaining for d in admitted] == [2, 1, 0]
    refused = await limiter.admit(key, spec, 10)
    assert not refused.allowed and refused.refused_by == "requests" and refused.reservation is None
    assert 55 < refused.retry_after_s <= 60  # when the oldest of the three leaves the window
    assert refused.requests == Window(3, 0, refused.requests.reset_s)
    assert "3 requests per minute" in refused.reason
    assert not refused.degraded


async def test_tpm_reservation_is_refunded_on_settle(limiter: RateLimiter):
    key, spec = new_key(), LimitSpec(rpm=0, tpm=1000)
    first = await limiter.admit(key, spec, 800)
    assert first.allowed and first.tokens.remaining == 200
    refused = await limiter.admit(key, spec, 800)
    assert not refused.allowed and refused.refused_by == "tokens"
    assert 55 < refused.retry_after_s <= 60 and refused.tokens.remaining == 200
    assert first.reservation is not None
    await limiter.settle(key, first.reservation, 100)
    await limiter.settle(key, first.reservation, 100)  # settling twice sets the same value
    second = await limiter.admit(key, spec, 800)
    assert second.allowed and second.tokens.remaining == 100


async def test_usage_over_the_reservation_is_charged(limiter: RateLimiter):
    key, spec = new_key(), LimitSpec(rpm=0, tpm=1000)
    first = await limiter.admit(key, spec, 100)
    assert first.reservation is not None
    await limiter.settle(key, first.reservation, 950)
    refused = await limiter.admit(key, spec, 100)
    assert not refused.allowed and refused.tokens.remaining == 50
    assert (await limiter.admit(key, spec, 50)).allowed


async def test_settling_an_unknown_reservation_changes_nothing(limiter: RateLimiter):
    key, spec = new_key(), LimitSpec(rpm=0, tpm=100)
    assert (await limiter.admit(key, spec, 60)).allowed
    await limiter.settle(key, uuid.uuid4().hex, 0)
    await limiter.settle(new_key(), uuid.uuid4().hex, 0)
    await limiter.settle(key, "_sum", 0)
    assert (await limiter.admit(key, spec, 40)).tokens.remaining == 0


async def test_a_request_bigger_than_tpm_is_refused_outright(limiter: RateLimiter):
    key, spec = new_key(), LimitSpec(rpm=10, tpm=100)
    refused = await limiter.admit(key, spec, 101)
    assert not refused.allowed and refused.refused_by == "tokens" and refused.retry_after_s == 60
    assert "needs 101 tokens, more than the limit of 100" in refused.reason
    fits = await limiter.admit(key, spec, 100)  # the refusal recorded nothing
    assert fits.allowed and fits.requests.remaining == 9 and fits.tokens.remaining == 0


async def test_unlimited_dimensions(limiter: RateLimiter):
    key = new_key()
    free = await limiter.admit(key, LimitSpec(rpm=0, tpm=0), 10**9)
    assert free.allowed and free.reservation is None and rate_limit_headers(free) == {}
    for _ in range(20):
        only_tokens = await limiter.admit(key, LimitSpec(rpm=0, tpm=10_000), 100)
    assert only_tokens.allowed and only_tokens.tokens.remaining == 8000
    assert set(rate_limit_headers(only_tokens)) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    }


async def test_headers_of_a_real_decision(limiter: RateLimiter):
    key, spec = new_key(), LimitSpec(rpm=2, tpm=500)
    headers = rate_limit_headers(await limiter.admit(key, spec, 200))
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "1"
    assert headers["x-ratelimit-limit-tokens"] == "500"
    assert headers["x-ratelimit-remaining-tokens"] == "300"
    reset = headers["x-ratelimit-reset-tokens"]
    assert reset == headers["x-ratelimit-reset-requests"] and reset.endswith("s")
    assert reset.startswith(("59.", "1m0s", "60s")), reset  # the entry just made leaves in a minute
    await limiter.admit(key, spec, 1)
    refused = rate_limit_headers(await limiter.admit(key, spec, 1))
    assert refused["x-ratelimit-remaining-requests"] == "0"
    assert 55 <= int(refused["retry-after"]) <= 60 and 55_000 < int(refused["retry-after-ms"]) <= 60_000


def test_header_formatting():
    assert [format_reset(s) for s in (0, 0.5, 1, 1.2345, 59.9996, 60, 90.25, 360)] == [
        "0s",
        "0.5s",
        "1s",
        "1.234s",
        "1m0s",
        "1m0s",
        "1m30.25s",
        "6m0s",
    ]
    decision = Decision(False, Window(0, 0, 0.0), Window(1000, 10, 6.5), 6.5, refused_by="tokens")
    assert rate_limit_headers(decision) == {
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "10",
        "x-ratelimit-reset-tokens": "6.5s",
        "retry-after": "7",
        "retry-after-ms": "6500",
    }


# --- the sliding window ---------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_memory_window_slides():
    clock = FakeClock()
    limiter = MemoryLimiter(clock=clock)
    key, spec = "k", LimitSpec(rpm=2, tpm=100)
    assert (await limiter.admit(key, spec, 60)).allowed  # t=0
    clock.now += 10
    second = await limiter.admit(key, spec, 30)  # t=10
    assert second.allowed and second.requests.reset_s == 50
    clock.now += 10
    refused = await limiter.admit(key, spec, 50)  # t=20: 3rd request, and 90 + 50 tokens
    assert refused.refused_by == "requests" and refused.retry_after_s == 40
    clock.now += 39.5
    assert not (await limiter.admit(key, spec, 1)).allowed  # t=59.5: the first entry still counts
    clock.now += 0.5
    third = await limiter.admit(key, spec, 50)  # t=60: it has left
    assert third.allowed and third.tokens.remaining == 20 and third.requests.reset_s == 10
    clock.now += 10
    assert (await limiter.admit(key, spec, 100)).retry_after_s == 50  # t=70: until the 50 at t=60 leave
    clock.now += 50
    assert (await limiter.admit(key, spec, 100)).allowed  # t=120


async def test_memory_tokens_retry_waits_for_enough_old_entries():
    clock = FakeClock()
    limiter = MemoryLimiter(clock=clock)
    spec = LimitSpec(rpm=0, tpm=100)
    for tokens in (10, 20, 30):
        assert (await limiter.admit("k", spec, tokens)).allowed
        clock.now += 5  # entries at t=0, 5, 10
    refused = await limiter.admit("k", spec, 70)  # t=15: 60 + 70 > 100 until the 30 of t=0 and t=5 leave
    assert refused.retry_after_s == 50 and refused.tokens.reset_s == 45


async def test_a_refusal_by_tokens_reads_a_bounded_part_of_a_long_window():
    """A key with thousands of entries in its window: a refusal tells the time its oldest FIT_SCAN_ENTRIES
    leave (reading all of them on every refusal held the loop ~5 ms for 50,000), and a request back then is
    refused again with a later time, until it fits."""
    clock = FakeClock()
    limiter = MemoryLimiter(clock=clock)
    entries = 3 * FIT_SCAN_ENTRIES
    spec = LimitSpec(rpm=0, tpm=10 * entries)
    for _ in range(entries):  # 10 tokens each, 10 ms apart: the TPM full
        assert (await limiter.admit("k", spec, 10)).allowed
        clock.now += 0.01
    span = entries * 0.01
    small = await limiter.admit("k", spec, 100)  # fits once the oldest 10 leave: the exact time
    assert small.retry_after_s == pytest.approx(60 - span + 0.09)
    large = await limiter.admit("k", spec, 20 * FIT_SCAN_ENTRIES)  # 2 x FIT_SCAN_ENTRIES must leave
    assert large.retry_after_s == pytest.approx(60 - span + (FIT_SCAN_ENTRIES - 1) * 0.01)  # told: the first
    clock.now += large.retry_after_s + 0.001
    again = await limiter.admit("k", spec, 20 * FIT_SCAN_ENTRIES)
    assert not again.allowed and again.retry_after_s == pytest.approx(FIT_SCAN_ENTRIES * 0.01, abs=0.02)
    clock.now += again.retry_after_s + 0.001
    assert (await limiter.admit("k", spec, 20 * FIT_SCAN_ENTRIES)).allowed


async def test_a_refusal_by_tokens_reads_a_bounded_part_of_the_window_in_redis(redis_server: RedisServer):
    limiter = RedisLimiter(redis_server.url, "closed", socket_timeout_s=PATIENT_S)
    client = Redis.from_url(redis_server.url)
    try:
        key, spec = new_key(), LimitSpec(rpm=0, tpm=3 * FIT_SCAN_ENTRIES)
        for _ in range(3 * FIT_SCAN_ENTRIES):
            assert (await limiter.admit(key, spec, 1)).allowed
        before = await _zrange_calls(client)
        refused = await limiter.admit(key, spec, 2 * FIT_SCAN_ENTRIES)  # 2 x FIT_SCAN_ENTRIES must leave
        assert not refused.allowed and 0 < refused.retry_after_s <= 60
        # one read of the oldest FIT_SCAN_ENTRIES and one for the window's reset (the old script read the
        # whole window, 200 at a time)
        assert await _zrange_calls(client) - before <= -(-FIT_SCAN_ENTRIES // 200) + 1
    finally:
        await client.aclose()
        await limiter.close()


async def _zrange_calls(client: Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_zrange", {}).get("calls", 0))


async def test_a_key_whose_rpm_was_lowered_is_refused_at_its_rpm_th_newest_entry():
    clock = FakeClock()
    limiter = MemoryLimiter(clock=clock)
    for _ in range(1000):
        assert (await limiter.admit("k", LimitSpec(rpm=1000, tpm=0), 1)).allowed
        clock.now += 0.01
    lowered = await limiter.admit("k", LimitSpec(rpm=10, tpm=0), 1)  # the 10th newest must leave first
    assert not lowered.allowed and lowered.retry_after_s == pytest.approx(60 - 10 * 0.01)


async def test_memory_forgets_idle_keys():
    clock = FakeClock()
    limiter = MemoryLimiter(clock=clock)
    for i in range(10):
        await limiter.admit(f"k{i}", LimitSpec(rpm=1, tpm=0), 1)
    clock.now += 61
    await limiter.admit("other", LimitSpec(rpm=1, tpm=0), 1)
    assert list(limiter._logs) == ["other"]


async def test_redis_window_slides_and_keys_expire(redis_server: RedisServer):
    limiter = RedisLimiter(
        redis_server.url, "closed", key_prefix="t:", window_s=0.4, socket_timeout_s=PATIENT_S
    )
    client = Redis.from_url(redis_server.url)
    try:
        key, spec = new_key(), LimitSpec(rpm=1, tpm=100)
        assert (await limiter.admit(key, spec, 80)).allowed
        refused = await limiter.admit(key, spec, 10)
        assert refused.refused_by == "requests" and 0 < refused.retry_after_s <= 0.4
        assert refused.reason.endswith("1 requests per 0.4 s.")
        assert await client.exists(f"t:{{{key}}}:req", f"t:{{{key}}}:tok") == 2
        await asyncio.sleep(refused.retry_after_s + 0.05)
        assert await client.exists(f"t:{{{key}}}:req", f"t:{{{key}}}:tok") == 0  # PEXPIRE'd with the window
        again = await limiter.admit(key, spec, 100)
        assert again.allowed and again.tokens.remaining == 0
    finally:
        await limiter.close()
        await client.aclose()


async def test_redis_reloads_a_flushed_script(redis_server: RedisServer):
    limiter = RedisLimiter(redis_server.url, "closed", socket_timeout_s=PATIENT_S)
    client = Redis.from_url(redis_server.url)
    try:
        await client.script_flush()
        key = new_key()
        decision = await limiter.admit(key, LimitSpec(rpm=5, tpm=0), 1)
        assert decision.allowed and decision.reservation
        await client.script_flush()
        await limiter.settle(key, decision.reservation, 0)
        assert await client.hget(f"nearshore:rl:{{{key}}}:tok", decision.reservation) == b"0"
    finally:
        await limiter.close()
        await client.aclose()


# --- two edges sharing Redis -----------------------------------------------------------------------------


async def test_two_edges_never_admit_more_than_the_limit(redis_server: RedisServer):
    edges = [RedisLimiter(redis_server.url, "closed", socket_timeout_s=PATIENT_S) for _ in range(2)]
    try:
        key = new_key()
        spec = LimitSpec(rpm=50, tpm=0)
        decisions = await asyncio.gather(*(edges[i % 2].admit(key, spec, 1) for i in range(200)))
        assert sum(d.allowed for d in decisions) == 50
        assert all(d.refused_by == "requests" for d in decisions if not d.allowed)

        key = new_key()
        spec = LimitSpec(rpm=0, tpm=1000)
        decisions = await asyncio.gather(*(edges[i % 2].admit(key, spec, 30) for i in range(100)))
        assert sum(d.allowed for d in decisions) == 33
        assert min(d.tokens.remaining for d in decisions) == 10
        assert not any(d.degraded for d in decisions)
    finally:
        for edge in edges:
            await edge.close()


# --- Redis going away ------------------------------------------------------------------------------------


async def wait_until_up(limiter: RedisLimiter, timeout_s: float = 15.0) -> float:
    started = time.monotonic()
    while not limiter.backend_up():
        assert time.monotonic() - started < timeout_s, "the limiter did not reconnect"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_fail_open_falls_back_to_local_limits_and_recovers(own_redis: RedisServer):
    limiter = RedisLimiter(own_redis.url, "open", reset_grace_s=0.5)
    try:
        key, spec = new_key(), LimitSpec(rpm=3, tpm=0)
        assert not (await limiter.admit(key, spec, 1)).degraded
        own_redis.stop()

        started = time.monotonic()
        local = [await limiter.admit(key, spec, 1) for _ in range(3)]
        assert time.monotonic() - started < 5.0  # the first notices; the others skip Redis
        assert not limiter.backend_up()
        assert all(d.degraded for d in local)
        # Local limits start from what this edge admitted through Redis in the window (one of three).
        assert [d.allowed for d in local] == [True, True, False]
        assert local[0].reservation is not None
        await limiter.settle(key, local[0].reservation, 0)

        own_redis.start()  # empty: no persistence
        await wait_until_up(limiter)
        assert limiter.resets == 1  # the loss noticed: admissions wait out the grace, then Redis decides
        back = await limiter.admit(key, spec, 1)
        # Redis again, and the window still holds the three this edge admitted (put back: it had lost them,
        # the two admitted locally while it was away among them).
        assert not back.degraded and not back.allowed and back.refused_by == "requests"
    finally:
        await limiter.close()


async def test_a_hung_redis_costs_one_socket_timeout(own_redis: RedisServer):
    limiter = RedisLimiter(own_redis.url, "open", socket_timeout_s=2.0)
    try:
        key, spec = new_key(), LimitSpec(rpm=5, tpm=0)
        assert not (await limiter.admit(key, spec, 1)).degraded
        own_redis.pause()
        started = time.monotonic()
        decisions = await asyncio.gather(*(limiter.admit(key, spec, 1) for _ in range(4)))
        # One timeout (2 s) for all four, not four in a row (8 s); the margin is for a loaded CI machine.
        assert time.monotonic() - started < 5.5
        assert all(d.degraded for d in decisions) and not limiter.backend_up()
        own_redis.resume()
        await wait_until_up(limiter)
        assert not (await limiter.admit(key, spec, 1)).degraded
    finally:
        own_redis.resume()
        await limiter.close()


async def test_fail_closed_raises_and_recovers(own_redis: RedisServer):
    limiter = RedisLimiter(own_redis.url, "closed", reset_grace_s=0.5)
    try:
        key, spec = new_key(), LimitSpec(rpm=5, tpm=0)
        first = await limiter.admit(key, spec, 1)
        own_redis.stop()
        for _ in range(2):
            with pytest.raises(LimiterUnavailable):
                await limiter.admit(key, spec, 1)
        assert not limiter.backend_up()
        assert first.reservation is not None
        await limiter.settle(key, first.reservation, 0)  # best effort: no error while Redis is down
        unlimited = await limiter.admit(key, LimitSpec(0, 0), 1)
        assert unlimited.allowed  # a key without limits needs no store

        own_redis.start()  # empty: the first admission waits out the grace, then Redis decides it
        await wait_until_up(limiter)
        back = await limiter.admit(key, spec, 1)
        assert back.allowed and not back.degraded and limiter.resets == 1
    finally:
        await limiter.close()
