"""Failover bounded in time (issue 34, failover items 1 and 2), against real misbehaving replicas
(``nearshore hostile``) behind a real edge.

- A stalled stream continued into another stall: the silences that cut one stream share the request's stall
  budget (the second replica's window is what the first stall left, down to a floor), and after two of the
  model's replicas failed the stream its fallback model continues it; the third replica is never asked.
- With one region, a stalled stream is continued by the fallback model instead of ending in an error.
- No answer at all: the attempts share one first-byte budget, the model's replicas leaving a third of it to
  the fallback chain, so a silent first replica is the only one waited on before the fallback answers.

Replicas ``a``, ``b`` and ``c`` serve MODEL; ``e`` serves only SMALL, MODEL's configured fallback.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from tests.edge.test_failover import MODEL, PRICES, SMALL, UPSTREAM, ask, log_of, row_of
from tests.edge_fixtures import Edge, Pacer, start_edge, start_hostile

pytestmark = pytest.mark.slow

TOKENS = 12
OWN = "abc"
# The limits, scaled down: a first stall costs 2 s; the budget leaves the next one 0.5 s, so its window is
# the floor (half the stall timeout, 1 s). The first-byte budget (9 s) keeps 3 s for the fallback chain, so
# a replica silent for its whole ttft_timeout_s (6 s) spends the model's share.
BOUNDED = {
    **UPSTREAM,
    "ttft_timeout_s": 6.0,
    "first_byte_budget_s": 9.0,
    "stall_timeout_s": 2.0,
    "stall_budget_s": 2.5,
    "request_deadline_s": 30.0,
    "max_continuations": 2,
}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Pacer]]:
    folder = tmp_path_factory.mktemp("bounded")
    started: dict[str, Pacer] = {}
    try:
        for name in OWN + "e":
            started[name] = start_hostile(folder, name=name, limit_s=30, tokens=TOKENS)
        yield started
    finally:
        for replica in started.values():
            replica.process.stop()


@pytest.fixture(autouse=True)
async def fresh_logs(replicas: dict[str, Pacer]) -> None:
    async with aiohttp.ClientSession() as s:
        for replica in replicas.values():
            async with s.delete(replica.url + "/_log") as r:
                assert r.status == 200


def edge_over(folder, replicas: dict[str, Pacer], own: str = OWN) -> Edge:
    regions: list[dict[str, object]] = [
        {"name": name, "url": replicas[name].url, "models": [MODEL]} for name in own
    ]
    regions.append({"name": "e", "url": replicas["e"].url, "models": [SMALL]})
    return start_edge(
        folder,
        regions,
        top={"models": [MODEL, SMALL], "prices": PRICES},
        upstream=BOUNDED,
        cache={"enabled": False},
        fallbacks={"models": {MODEL: [SMALL]}},
    )


async def asked(replicas: dict[str, Pacer]) -> dict[str, int]:
    return {name: len(await log_of(replica)) for name, replica in replicas.items()}


def edge_log(edge: Edge) -> str:
    return (edge.folder / "edge.log").read_text(errors="replace")


async def test_a_stall_chain_spends_one_stall_budget_and_the_fallback_takes_the_rest(
    tmp_path, replicas: dict[str, Pacer]
):
    edge = edge_over(tmp_path / "edge", replicas)
    try:
        stalls = ",".join(f"{name}=stall-at:4:20" for name in OWN)
        answer = await ask(edge, edge.new_key(), f"{stalls},e=ok", max_tokens=TOKENS)
        assert answer.status == 200
        events = answer.events()
        assert events[-1] == b"[DONE]" and b'"error"' not in answer.body, answer.body[-400:]
        assert len(answer.text().split()) == TOKENS  # whole: 4 from each of two replicas, the rest from e
        # Two replicas each failed the stream after their 4 tokens; the model's third replica is not asked
        # (it would likely stall the same way): the fallback continues.
        # Which two of the model's replicas the router tried first depends on its estimates, not on names.
        counts = await asked(replicas)
        served = sorted(name for name in OWN if counts[name])
        assert len(served) == 2 and counts["e"] == 1 and sum(counts[n] for n in OWN) == 2, counts
        log = edge_log(edge)
        # Which replica failed the stream, after how many tokens, and who continued it; then each of the
        # continuation's attempts, one line each (a request's one plain answering attempt is a DEBUG line).
        first = next(name for name in served if f"{name} failed after 4 tokens" in log)
        second = next(name for name in served if name != first)
        assert f"{first} failed after 4 tokens" in log and "continues the answer" in log, log[-2000:]
        assert f"attempt 1 at {second} for gemma-3-270m: answered" in log, log[-2000:]
        # The first stall waited the stall timeout; the second only what the budget left (the floor).
        assert "no event from the region for 2s" in log
        assert "no event from the region for 1s" in log
        row = await row_of(edge, answer.client_id)
        assert (row["status"], row["model"], row["fallback_from"]) == ("ok", SMALL, MODEL)
        # every region that served part, in the order they served it
        assert (row["region"], row["continued_from"]) == ("e", f"{first},{second}")
    finally:
        edge.stop()


async def test_with_one_region_a_stalled_stream_is_continued_by_the_fallback(
    tmp_path, replicas: dict[str, Pacer]
):
    edge = edge_over(tmp_path / "edge", replicas, own="a")
    try:
        answer = await ask(edge, edge.new_key(), "a=stall-at:4:20,e=ok", max_tokens=TOKENS)
        assert answer.status == 200
        assert answer.events()[-1] == b"[DONE]" and b'"error"' not in answer.body, answer.body[-400:]
        assert len(answer.text().split()) == TOKENS
        counts = await asked(replicas)
        assert (counts["a"], counts["e"]) == (1, 1)
    finally:
        edge.stop()


@pytest.mark.parametrize(("stream", "mode"), [(True, "hang-after-headers"), (True, "hang"), (False, "hang")])
async def test_silent_replicas_share_one_first_byte_budget_and_the_fallback_answers(
    tmp_path, replicas: dict[str, Pacer], stream: bool, mode: str
):
    edge = edge_over(tmp_path / "edge", replicas)
    try:
        silent = ",".join(f"{name}={mode}" for name in OWN)
        answer = await ask(edge, edge.new_key(), f"{silent},e=ok", stream=stream)
        assert answer.status == 200, answer.body[:400]
        assert answer.text()
        # The first replica spent the model's share of the budget: the others are not asked.
        counts = await asked(replicas)
        assert sum(counts[name] for name in OWN) == 1 and counts["e"] == 1, counts
        row = await row_of(edge, answer.client_id)
        assert (row["model"], row["fallback_from"], row["region"], row["status"]) == (SMALL, MODEL, "e", "ok")
        assert "first-byte budget is spent" in edge_log(edge)
    finally:
        edge.stop()
