"""A key its RPM refused is refused again at once until that refusal's retry time (edge/limits.py
StandingRefusals), and a request the edge refused as the client's mistake counts against its RPM
(edge/admission.py): a key at its limit cannot make the edge read and check bodies it will refuse."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import aiohttp
import pytest

from edge.admission import count_refused
from edge.limits import Decision, LimitSpec, RateLimiter, StandingRefusals, Window
from edge.limits_memory import MemoryLimiter
from edge.limits_redis import RedisLimiter
from tests.edge_fixtures import Edge, edge_over_pacer
from tests.redis_server import RedisServer

SPEC = LimitSpec(rpm=2, tpm=1000)


async def refused_by_requests(limiter: MemoryLimiter) -> Decision:
    for _ in range(SPEC.rpm):
        assert (await limiter.admit("k", SPEC, 1)).allowed
    decision = await limiter.admit("k", SPEC, 1)
    assert decision.refused_by == "requests"
    return decision


def test_a_refusal_by_requests_stands_until_its_retry_time_and_no_longer():
    now = [100.0]
    limiter = MemoryLimiter(clock=lambda: now[0])
    decision = asyncio.run(refused_by_requests(limiter))
    refusals = StandingRefusals()
    refusals.note("k", SPEC, decision, now[0])
    now[0] += 10
    standing = refusals.standing("k", SPEC, now[0])
    assert standing is not None and not standing.allowed
    assert standing.retry_after_s == pytest.approx(decision.retry_after_s - 10)
    assert standing.requests.reset_s == pytest.approx(decision.requests.reset_s - 10)
    # The limiter agrees all along: nothing in the window left before the retry time.
    assert not asyncio.run(limiter.admit("k", SPEC, 1)).allowed
    assert refusals.standing("other", SPEC, now[0]) is None
    assert refusals.standing("k", LimitSpec(rpm=50, tpm=1000), now[0]) is None  # its limits changed
    assert len(refusals) == 0  # and that refusal is forgotten
    refusals.note("k", SPEC, decision, now[0] - 10)
    now[0] += decision.retry_after_s  # past the retry time: the limiter admits, nothing stands
    assert refusals.standing("k", SPEC, now[0]) is None
    assert asyncio.run(limiter.admit("k", SPEC, 1)).allowed


def test_only_a_refusal_by_requests_that_the_limiter_made_stands():
    window = Window(2, 0, 30.0)
    by_tokens = Decision(False, window, window, 30.0, refused_by="tokens")  # a smaller request may fit
    guessed = Decision(False, window, window, 30.0, refused_by="requests", degraded=True)  # Redis away
    allowed = Decision(True, window, window)
    refusals = StandingRefusals()
    for decision in (by_tokens, guessed, allowed):
        refusals.note("k", SPEC, decision, 0.0)
    assert len(refusals) == 0


def test_the_refusals_kept_are_bounded_the_lapsed_going_first():
    window = Window(2, 0, 0.0)
    refusals = StandingRefusals(max_keys=3)
    for i, retry in enumerate((5.0, 50.0, 40.0)):
        refusals.note(f"k{i}", SPEC, Decision(False, window, window, retry, refused_by="requests"), 0.0)
    refusals.note("k3", SPEC, Decision(False, window, window, 60.0, refused_by="requests"), 10.0)
    assert len(refusals) == 3 and refusals.standing("k0", SPEC, 10.0) is None  # it had lapsed
    refusals.note("k4", SPEC, Decision(False, window, window, 60.0, refused_by="requests"), 11.0)
    assert len(refusals) == 3 and refusals.standing("k2", SPEC, 11.0) is None  # the soonest to lapse
    assert refusals.standing("k1", SPEC, 11.0) is not None


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_refused_request_takes_a_slot_of_no_tokens_in_either_backend(backend: str, tmp_path):
    server = None
    if backend == "memory":
        limiter: RateLimiter = MemoryLimiter()
    else:
        server = RedisServer(tmp_path / "redis").start()
        limiter = RedisLimiter(server.url, "closed", socket_timeout_s=10.0)
    try:
        state = SimpleNamespace(limiter=limiter, refusals=StandingRefusals())
        key = SimpleNamespace(key_id="k", rpm=2, tpm=1000)
        await count_refused(state, key)  # type: ignore[arg-type]
        await count_refused(state, key)  # type: ignore[arg-type]
        decision = await limiter.admit("k", LimitSpec(2, 1000), 10)
        assert decision.refused_by == "requests" and decision.tokens.remaining == 1000  # no tokens taken
        await count_refused(state, key)  # type: ignore[arg-type]  # refused itself: now it stands
        assert state.refusals.standing("k", LimitSpec(2, 1000), time.monotonic()) is not None
    finally:
        await limiter.close()
        if server is not None:
            server.stop()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory):
    edge = edge_over_pacer(tmp_path_factory.mktemp("standing"), "pacer", tokens=2, interval_ms=1)
    yield edge
    edge.stop()


async def post(edge: Edge, key: str, body: bytes) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(edge.url + "/v1/chat/completions", data=body, headers=headers) as r,
    ):
        return r.status, dict(r.headers), await r.json()


def chat(model: str = "gemma-3-270m") -> bytes:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ).encode()


async def test_bad_requests_count_against_the_rpm_and_then_their_bodies_are_not_read(edge: Edge):
    key, bystander = edge.new_key(rpm=3), edge.new_key(rpm=3)
    # The client's mistakes: an unknown model, a body that is not JSON, a bad field.
    statuses = [
        (await post(edge, key, chat("no-such-model")))[0],
        (await post(edge, key, b"{not json"))[0],
        (await post(edge, key, chat().replace(b'"max_tokens": 2', b'"max_tokens": -5')))[0],
    ]
    assert statuses == [404, 400, 400]
    # Its RPM is spent: a good request is refused by it, and the refusal says when to come back.
    status, headers, body = await post(edge, key, chat())
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body
    assert 0 < float(headers["retry-after-ms"]) <= 60_000
    # From then on its bodies are not read: one that is not JSON is refused by the limit, not the parser.
    status, headers, body = await post(edge, key, b"{not json")
    assert status == 429 and "requests per minute" in body["error"]["message"], body
    assert headers["x-ratelimit-remaining-requests"] == "0"
    # Another key of the same edge is untouched.
    assert (await post(edge, bystander, chat()))[0] == 200
