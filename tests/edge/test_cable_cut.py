"""When the cables are cut (issue 22): a Lagos edge in front of two regions across emulated ocean links
(London: the large model; Frankfurt: the small one) and a Lagos-local region serving the small model over
the last mile only (``local = true``). Every ocean link goes down (``nearshore link``'s ``down`` fault: new
connections refused, open ones reset), then comes back. The regions are pacers, which answer under any
model name: the edge's side is what is tested, not the models.

The tests tell it in order, on one topology: before the cut, the cut (the small pool, the cache, a
large-only model, a key that may have a substitute, ``auto``), the links back, a stream the cable cuts, the
ledger. Each sets up what it needs of that story itself (``Topology.cut``, ``Topology.restored``), so a test
run alone, or on a pytest-xdist worker that stole it from the middle of the module, holds too.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv
from tests.edge_fixtures import START_TIMEOUT_S, Edge, start_edge, start_pacer

pytestmark = pytest.mark.slow

SMALL, LARGE = "smollm2-135m", "gemma-3-270m"
LOCAL_INTERVAL_S = 0.01  # the Lagos pacer's first token takes one interval (its "prefill") ...
LAST_MILE_RTT_S = 0.001  # ... behind the lagos-metro link
SLACK_S = 1.5  # the edge's own work and a busy machine's scheduling, on top
HEALTH_INTERVAL_S, HEALTHY_THRESHOLD, HOLD_S = 0.25, 2, 1.0
OCEAN = ("london", "frankfurt")
LINKS = {"london": "lagos-london", "frankfurt": "lagos-frankfurt", "lagos": "lagos-metro"}


@dataclass
class Topology:
    edge: Edge
    control: str  # the links' control API
    asked: list[str] = field(default_factory=list)  # every client request id sent: the ledger must hold each
    stored: bool = False  # London's answer to QUESTION is in the edge's cache (asked before the cut)

    async def cut(self) -> None:
        """The ocean links down and the edge's probes knowing it, with London's answer to QUESTION cached
        first (the first test asks it; a test that runs without it asks it here)."""
        if not self.stored:
            await self.restored()
            async with session(self.edge) as s:
                answer = await ask(self, s, self.edge.new_key(), LARGE, QUESTION, temperature=0)
            assert answer.status == 200 and answer.headers["x-nearshore-region"] == "london", answer.body
            self.stored = True
        await self.fault("down", *OCEAN)
        await self.wait_until("down", *OCEAN)

    async def restored(self) -> None:
        """The ocean links up and the edge's probes knowing it."""
        await self.fault("up", *OCEAN)
        await self.wait_until("up", *OCEAN)

    async def fault(self, fault: str, *links: str) -> None:
        async with aiohttp.ClientSession() as s:
            for link in links:
                async with s.post(f"{self.control}/links/{link}/faults/{fault}") as r:
                    assert r.status == 200, await r.text()

    async def regions(self) -> dict[str, str]:
        async with aiohttp.ClientSession() as s, s.get(self.edge.metrics_url + "/health") as r:
            return (await r.json())["regions"]

    async def wait_until(self, state: str, *names: str, timeout_s: float = 10.0) -> None:
        """Until the edge's probes find each of ``names`` in ``state`` ("down", "up")."""
        deadline = time.monotonic() + timeout_s
        while True:
            regions = await self.regions()
            if all(regions[n].startswith(state) for n in names):
                return
            assert time.monotonic() < deadline, regions
            await asyncio.sleep(0.05)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float
    ttft_s: float  # to the first content event (a stream), or the whole answer
    client_id: str

    def json(self) -> dict:
        return json.loads(self.body)

    def text(self) -> str:
        if not self.body.startswith(b"data:"):
            return self.json()["choices"][0]["message"]["content"]
        parts = []
        for line in self.body.split(b"\n\n"):
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    parts.append((choice.get("delta") or {}).get("content") or "")
        return "".join(parts)


async def ask(
    t: Topology,
    session: aiohttp.ClientSession,
    key: str,
    model: str,
    content: str = "hi",
    *,
    stream: bool = False,
    max_tokens: int = 4,
    temperature: float | None = None,
    on_content: Callable[[int], Awaitable[None]] | None = None,
) -> Answer:
    client_id = uuid.uuid4().hex
    t.asked.append(client_id)
    payload: dict = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if temperature is not None:
        payload["temperature"] = temperature
    headers = {"Authorization": f"Bearer {key}", "x-client-request-id": client_id}
    started = time.perf_counter()
    ttft = 0.0
    body = b""
    async with session.post(t.edge.url + "/v1/chat/completions", json=payload, headers=headers) as r:
        if not stream or r.status != 200:
            body = await r.read()
        else:
            events = 0
            async for line in r.content:
                body += line
                if line.startswith(b"data: {") and b'"content"' in line:
                    events += 1
                    if events == 1:
                        ttft = time.perf_counter() - started
                    if on_content is not None:
                        await on_content(events)
    seconds = time.perf_counter() - started
    return Answer(r.status, dict(r.headers), body, seconds, ttft or seconds, client_id)


def session(edge: Edge) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30))


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    folder = tmp_path_factory.mktemp("cable-cut")
    pacers = {
        "london": start_pacer(folder, "london", tokens=8, interval_ms=60),
        "frankfurt": start_pacer(folder, "frankfurt", tokens=20, interval_ms=60),
        "lagos": start_pacer(folder, "lagos", tokens=20, interval_ms=LOCAL_INTERVAL_S * 1000),
    }
    ports = {name: free_port() for name in LINKS}
    control = free_port()
    argv = ["link", "--control", f"127.0.0.1:{control}"]
    for name, profile in LINKS.items():
        target = pacers[name].url.removeprefix("http://")
        argv += ["--link", f"{name}=127.0.0.1:{ports[name]}->{target}@{profile}"]
    links = ManagedProcess("links", nearshore_argv(*argv), folder / "links.log").start()
    processes = [links, *(p.process for p in pacers.values())]
    try:
        links.wait_http(f"http://127.0.0.1:{control}/health", timeout_s=START_TIMEOUT_S)
        url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        edge = start_edge(
            folder / "edge",
            [
                {"name": "london", "url": url["london"], "models": [LARGE]},
                {"name": "frankfurt", "url": url["frankfurt"], "models": [SMALL], "pool": "small"},
                {"name": "lagos", "url": url["lagos"], "models": [SMALL], "pool": "small", "local": True},
            ],
            top={
                "models": [SMALL, LARGE],
                "prices": {SMALL: {"input": 0.1, "output": 0.2}, LARGE: {"input": 1.0, "output": 2.0}},
                "aliases": [{"name": "auto", "small": SMALL, "large": LARGE, "small_max_tokens": 64}],
            },
            upstream={
                "health_interval_s": HEALTH_INTERVAL_S,
                "health_timeout_s": 1.0,
                "connect_timeout_s": 1.0,
                "ttft_timeout_s": 5.0,
                "request_deadline_s": 20.0,
            },
            geo={
                "health": {"unhealthy_threshold": 2, "healthy_threshold": HEALTHY_THRESHOLD},
                "routing": {"hold_s": HOLD_S},
            },
            cache={"semantic": False, "store_truncated": True},  # (a pacer's answers end at max_tokens)
            degraded={"retry_after_s": 30, "rules": [{"tiers": ["premium"], "substitute": "always"}]},
        )
    except BaseException:
        for p in processes:
            p.stop()
        raise
    edge.extra += processes
    yield Topology(edge, f"http://127.0.0.1:{control}")
    edge.stop()


QUESTION = "What is the capital of Nigeria?"


async def test_before_the_cut_the_remote_regions_answer_and_the_local_one_stands_by(topology: Topology):
    t = topology
    key = t.edge.new_key()
    async with session(t.edge) as s:
        small = await ask(t, s, key, SMALL)
        large = await ask(t, s, key, LARGE, QUESTION, temperature=0)  # stored: asked again in the cut
    assert small.status == 200 and small.headers["x-nearshore-region"] == "frankfurt"
    assert large.status == 200 and large.headers["x-nearshore-region"] == "london"
    assert "x-nearshore-degraded" not in small.headers and "x-nearshore-degraded" not in large.headers
    assert large.headers["x-nearshore-cache"] == "MISS"
    t.stored = True


async def test_links_down_the_small_pool_is_answered_in_lagos_within_a_last_mile_round_trip_and_its_ttft(
    topology: Topology,
):
    t = topology
    key = t.edge.new_key()
    await t.cut()
    async with session(t.edge) as s:
        await ask(t, s, key, SMALL)  # the client's own handshake to the edge is not the edge's to time
        answer = await ask(t, s, key, SMALL, stream=True, max_tokens=8)
    assert answer.status == 200, answer.body
    h = answer.headers
    assert h["x-nearshore-region"] == "lagos" and h["x-nearshore-degraded"] == "cable-cut"
    assert h["x-nearshore-model"] == SMALL and answer.text() == " token" * 8
    assert answer.ttft_s < LAST_MILE_RTT_S + LOCAL_INTERVAL_S + SLACK_S, answer.ttft_s
    row = row_of(t, answer)
    assert (row["region"], row["degraded"], row["attempts"], row["model"]) == ("lagos", "cable-cut", 1, SMALL)


async def test_in_the_cut_a_repeated_question_is_answered_from_the_cache(topology: Topology):
    t = topology
    await t.cut()
    async with session(t.edge) as s:
        answer = await ask(t, s, t.edge.new_key(), LARGE, QUESTION, temperature=0)
    assert answer.status == 200 and answer.headers["x-nearshore-cache"] == "HIT"
    assert answer.headers["x-nearshore-degraded"] == "cable-cut"
    assert answer.headers["x-nearshore-model"] == LARGE
    assert answer.text() == " token" * 4  # London's answer, from before the cut
    row = row_of(t, answer)
    assert (row["cache_status"], row["degraded"], row["model"]) == ("exact", "cable-cut", LARGE)
    assert 'nearshore_edge:degraded_answers_total{by="cache",reason="cable-cut"}' in await scrape(t)


async def test_in_the_cut_a_large_only_model_gets_503_with_retry_after_at_once(topology: Topology):
    t = topology
    await t.cut()
    async with session(t.edge) as s:
        answer = await ask(t, s, t.edge.new_key(), LARGE, "A question London never saw")
        streamed = await ask(t, s, t.edge.new_key(), LARGE, "Another one", stream=True)
    for refused in (answer, streamed):
        assert refused.status == 503, refused.body
        error = refused.json()["error"]
        assert error["code"] == "cable_cut" and error["type"] == "server_error"
        assert "'gemma-3-270m'" in error["message"] and f"ask for '{SMALL}'" in error["message"]
        assert refused.headers["Retry-After"] == "30"
        assert refused.headers["x-nearshore-degraded"] == "cable-cut"
        assert refused.seconds < 3.0  # the probes know: no request waits for a timeout
        row = row_of(t, refused)
        assert (row["status"], row["http_status"], row["error_code"], row["degraded"]) == (
            "error",
            503,
            "cable_cut",
            "cable-cut",
        )
    assert 'nearshore_edge:degraded_answers_total{by="none",reason="cable-cut"}' in await scrape(t)


async def test_in_the_cut_a_key_allowed_a_substitute_and_auto_get_the_local_model(topology: Topology):
    t = topology
    await t.cut()
    async with session(t.edge) as s:
        premium = await ask(t, s, t.edge.new_key(tier="premium"), LARGE, "Substitute me", stream=True)
        sized = await ask(t, s, t.edge.new_key(), "auto", "Write an essay.", max_tokens=100)
        # A key of the default tier made with `keys create --substitute`: its own permission.
        own = await ask(t, s, t.edge.new_key(substitute=True), LARGE, "Substitute me too")
    assert premium.status == 200 and premium.text() == " token" * 4
    assert sized.status == 200 and sized.text() == " token" * 20  # the Lagos pacer's whole answer
    assert own.status == 200 and own.text() == " token" * 4
    for answer in (premium, sized, own):
        h = answer.headers
        assert h["x-nearshore-region"] == "lagos" and h["x-nearshore-degraded"] == "cable-cut"
        assert h["x-nearshore-model"] == SMALL  # the model that answered, not the one asked for
        row = row_of(t, answer)
        assert (row["model"], row["fallback_from"], row["region"], row["degraded"]) == (
            SMALL,
            LARGE,
            "lagos",
            "cable-cut",
        )
    metrics = await scrape(t)
    assert 'nearshore_edge:degraded_answers_total{by="local",reason="cable-cut"}' in metrics


async def test_links_back_traffic_returns_to_the_remote_region_within_the_hold(topology: Topology):
    t = topology
    key = t.edge.new_key()
    await t.cut()
    await t.fault("up", *OCEAN)
    back_at = time.monotonic()
    bound_s = (HEALTHY_THRESHOLD + 1) * HEALTH_INTERVAL_S + HOLD_S + 5.0  # probes, the hold, a busy machine
    async with session(t.edge) as s:
        while True:
            answer = await ask(t, s, key, SMALL, max_tokens=1)
            assert answer.status == 200, answer.body
            if answer.headers["x-nearshore-region"] == "frankfurt":
                break
            assert answer.headers["x-nearshore-degraded"] == "cable-cut"
            assert time.monotonic() - back_at < bound_s, await t.regions()
            await asyncio.sleep(0.05)
    assert "x-nearshore-degraded" not in answer.headers
    assert row_of(t, answer)["degraded"] == ""


async def test_a_stream_the_cable_cuts_mid_answer_finishes_on_the_local_model(topology: Topology):
    t = topology
    await t.restored()
    cut_after = 5

    async def cut(events: int) -> None:
        if events == cut_after:
            await t.fault("down", *OCEAN)

    try:
        async with session(t.edge) as s:
            answer = await ask(t, s, t.edge.new_key(), SMALL, stream=True, max_tokens=20, on_content=cut)
    finally:
        await t.fault("up", *OCEAN)
    assert answer.status == 200 and answer.headers["x-nearshore-region"] == "frankfurt"
    assert answer.text() == " token" * 20 and b'"error"' not in answer.body  # one unbroken answer
    assert answer.body.rstrip().endswith(b"data: [DONE]")
    row = row_of(t, answer)
    assert (row["status"], row["region"], row["continued_from"], row["degraded"]) == (
        "ok",
        "lagos",
        "frankfurt",
        "cable-cut",
    )
    assert row["completion_tokens"] == 20


async def test_a_large_model_stream_the_cable_cuts_finishes_on_the_stand_in_for_a_key_allowed_it(
    topology: Topology,
):
    t = topology
    await t.restored()
    cut_after = 3

    async def cut(events: int) -> None:
        if events == cut_after:
            await t.fault("down", *OCEAN)

    try:
        async with session(t.edge) as s:
            key = t.edge.new_key(tier="premium")
            answer = await ask(t, s, key, LARGE, "Go on", stream=True, max_tokens=8, on_content=cut)
    finally:
        await t.fault("up", *OCEAN)
    assert answer.status == 200 and answer.headers["x-nearshore-region"] == "london"
    assert answer.text() == " token" * 8 and b'"error"' not in answer.body
    row = row_of(t, answer)
    assert (row["model"], row["fallback_from"], row["region"], row["continued_from"], row["degraded"]) == (
        SMALL,
        LARGE,
        "lagos",
        "london",
        "cable-cut",
    )


async def test_nothing_is_lost_in_the_ledger(topology: Topology):
    t = topology
    rows = t.edge.ledger_rows()
    ids = [r["client_request_id"] for r in rows]
    assert sorted(ids) == sorted(t.asked)  # one row per request: answered, cached, refused, continued
    assert {r["degraded"] for r in rows} <= {"", "cable-cut"}  # (each test checks its own rows' value)


def row_of(t: Topology, answer: Answer) -> dict:
    rows = [r for r in t.edge.ledger_rows() if r["client_request_id"] == answer.client_id]
    assert len(rows) == 1, rows
    return rows[0]


async def scrape(t: Topology) -> str:
    async with aiohttp.ClientSession() as s, s.get(t.edge.metrics_url + "/metrics") as r:
        return await r.text()
