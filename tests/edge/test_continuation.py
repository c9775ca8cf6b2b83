"""A stream that survives its region: the next region continues the answer from the text already sent."""

from __future__ import annotations

import asyncio
import json
import signal

import aiohttp
import pytest

from tests.conftest import SHARED_ENGINE, Node, start_region
from tests.edge_fixtures import Edge, prices_with, start_edge, start_pacer

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
# Each region's own price (USD per million tokens): a continued answer pays each for its part.
PART_PRICES = {
    f"{MODEL}@breaking": {"input": 1.0, "output": 3.0},
    f"{MODEL}@spare": {"input": 5.0, "output": 7.0},
}


async def read_stream(edge: Edge, key: str, payload: dict, headers: dict | None = None, on_event=None):
    """The stream's data payloads, as parsed JSON (``[DONE]`` as the string)."""
    events: list[object] = []
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(
            edge.url + "/v1/chat/completions",
            json={**payload, "stream": True},
            headers={"Authorization": f"Bearer {key}", **(headers or {})},
        ) as r,
    ):
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
            if on_event is not None:
                await on_event(events)
    return events


def content(events: list) -> str:
    return "".join(
        (e["choices"][0]["delta"].get("content") or "")
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )


@pytest.fixture(scope="module")
def breaking_pair(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("pair")
    breaking = start_pacer(folder, name="breaking", tokens=20, interval_ms=5, break_after=6)
    spare = start_pacer(folder, name="spare", tokens=20, interval_ms=5)
    # Placed so that the breaking one is first: London is nearer Lagos than Virginia.
    edge = start_edge(
        folder / "edge",
        [
            {"name": "breaking", "url": breaking.url, "city": "london"},
            {"name": "spare", "url": spare.url, "city": "virginia"},
        ],
        prices=prices_with(PART_PRICES),
    )
    edge.extra += [breaking.process, spare.process]
    yield edge
    edge.stop()


async def test_the_next_region_finishes_a_stream_whose_region_died(breaking_pair: Edge):
    edge = breaking_pair
    key = edge.new_key()
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
    events = await read_stream(edge, key, {**payload, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in events)
    assert content(events) == " token" * 20  # six from the first region, fourteen from the second
    roles = [e for e in events if isinstance(e, dict) and e["choices"] and "role" in e["choices"][0]["delta"]]
    assert len(roles) == 1  # the second region's role event is not sent again
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == 20  # counted once: 6 relayed + 14 continued
    row = edge.ledger_rows()[-1]
    assert (row["status"], row["region"], row["continued_from"], row["completion_tokens"]) == (
        "ok",
        "spare",
        "breaking",
        20,
    )
    # Billed once, each part at the price of the region that served it; the prompt at the first's.
    assert row["served_by"] == "breaking:6,spare:14"
    breaking, spare = PART_PRICES[f"{MODEL}@breaking"], PART_PRICES[f"{MODEL}@spare"]
    cost = row["prompt_tokens"] * breaking["input"] + 6 * breaking["output"] + 14 * spare["output"]
    assert row["cost_usd"] == pytest.approx(cost / 1e6)


async def test_a_client_may_opt_out_and_gets_the_error_event(breaking_pair: Edge):
    edge = breaking_pair
    key = edge.new_key()
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
    events = await read_stream(edge, key, payload, headers={"x-nearshore-continue": "off"})
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "upstream_unavailable"
    assert content(events) == " token" * 6
    row = edge.ledger_rows()[-1]
    assert (row["status"], row["region"], row["continued_from"]) == ("error", "breaking", "")


# --- with the real model -----------------------------------------------------------------------------


ANSWER_TOKENS = 160


@pytest.fixture(scope="module")
def doomed(tmp_path_factory: pytest.TempPathFactory):
    node = start_region(tmp_path_factory.mktemp("doomed"), engine=SHARED_ENGINE)
    yield node
    node.process.stop()


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory):
    """The region that continues: a node of its own. On the session's shared node a stream an earlier test
    left decoding can share llama.cpp's batch with the reference, and a batch's makeup moves its numbers:
    greedy text then drifts (it did once, after test_responses)."""
    node = start_region(tmp_path_factory.mktemp("steady"), engine=SHARED_ENGINE)
    yield node
    node.process.stop()


async def test_a_region_killed_mid_stream_leaves_one_complete_answer(tmp_path, steady: Node, doomed: Node):
    """The user's text is the answer an unbroken greedy decode gives: the continuation of what was sent."""
    question = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write three sentences about the city of Lagos."}],
        # Long enough that the killed region cannot have sent the whole answer before the fifth token reaches
        # the test (on a busy machine the region ran 27 tokens ahead of the client, and finished 32 unkilled).
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
        "seed": 7,
    }
    async with aiohttp.ClientSession() as s, s.post(steady.url + "/v1/chat/completions", json=question) as r:
        reference = await r.json()
    expected = reference["choices"][0]["message"]["content"]
    assert reference["usage"]["completion_tokens"] == ANSWER_TOKENS and len(expected) > 40

    edge = start_edge(
        tmp_path / "edge",
        [
            {"name": "london", "url": doomed.url},  # placed by its name: nearer Lagos, so first
            {"name": "virginia", "url": steady.url},
        ],
    )
    try:
        key = edge.new_key(tpm=10**6)
        killed = False

        async def kill_after_five(events: list) -> None:
            nonlocal killed
            if not killed and len(content(events)) and sum(1 for e in events if _is_token(e)) >= 5:
                doomed.process.proc.send_signal(signal.SIGKILL)  # no goodbye, mid-answer
                killed = True

        events = await read_stream(edge, key, question, on_event=kill_after_five)
        assert killed
        assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in events)
        assert content(events) == expected
        row = edge.ledger_rows()[-1]
        assert (row["region"], row["continued_from"], row["status"]) == ("virginia", "london", "ok")
        assert row["completion_tokens"] == ANSWER_TOKENS
        assert row["prompt_tokens"] == reference["usage"]["prompt_tokens"]
    finally:
        edge.stop()
        await asyncio.sleep(0)


def _is_token(event: object) -> bool:
    return (
        isinstance(event, dict)
        and bool(event.get("choices"))
        and bool(event["choices"][0]["delta"].get("content"))
    )
