"""A unary answer whose usage is a lie is billed as what was delivered: the completion tokens of the text
the client got, as the edge counts them, as the stream path bills the events it relayed (issue 19, item 3).

A fake region (tests/fake_region.py) answers chat and completions requests with a fixed text and whatever
usage the case names; a real edge process stands in front of it, and its ledger row is read back.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from edge.token_count import EstimatingCounter, chat_ceiling, text_ceiling
from edge.usage_audit import Delivered, UsageBounds, audit_usage
from nearshore.protocol.schemas import ChatMessage
from tests.edge_fixtures import Edge
from tests.fake_region import FakeRegion, completion, edge_over

MODEL = "gemma-3-270m"
MAX_TOKENS = 64
TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
PROMPT = "hi"
HONEST_COMPLETION = 18  # what a real tokenizer might make of TEXT: plausible, so it is trusted
_counter = EstimatingCounter()  # the edge's own counter when no GGUF is configured (as here)
DELIVERED = _counter.count_text(TEXT)
assert DELIVERED < MAX_TOKENS  # no cap hides the count


def prompt_bounds(kind: str) -> tuple[int, int]:
    """The edge's (estimate, ceiling) for the test's prompt."""
    if kind == "chat":
        messages = [ChatMessage(role="user", content=PROMPT)]
        ceiling = chat_ceiling(messages)
        return min(_counter.count_chat(messages), ceiling), ceiling
    ceiling = text_ceiling(PROMPT)
    return min(_counter.count_text(PROMPT), ceiling), ceiling


def usage(prompt: Any, completion_tokens: Any) -> dict[str, Any]:
    total = (
        prompt + completion_tokens if isinstance(prompt, int) and isinstance(completion_tokens, int) else 0
    )
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": total}


MISSING = object()  # the answer has no usage key at all
# case -> (the usage the region claims, billed prompt: "reported" | "estimate" | "ceiling",
#          billed completion: "delivered" | "reported")
CASES: dict[str, tuple[Any, str, str]] = {
    "completion-negative": (usage(10, -5), "reported", "delivered"),
    "both-negative": (usage(-10, -1000), "estimate", "delivered"),
    "prompt-negative": (usage(-10, HONEST_COMPLETION), "estimate", "reported"),
    "completion-float": (usage(10, 5.5), "estimate", "delivered"),
    "completion-string": (usage(10, "5"), "estimate", "delivered"),
    "completion-huge": (usage(10, 10**15), "reported", "delivered"),
    "completion-past-int64": (usage(10, 2**70), "reported", "delivered"),
    "prompt-huge": (usage(10**15, HONEST_COMPLETION), "ceiling", "reported"),
    "completion-zero": (usage(10, 0), "reported", "delivered"),  # 81 bytes of text are at least 1 token
    "usage-null": (None, "estimate", "delivered"),
    "usage-missing": (MISSING, "estimate", "delivered"),
    "usage-not-an-object": ([1, 2], "estimate", "delivered"),
}


async def answer(kind: str, body: dict[str, Any], _request: web.Request) -> web.Response:
    """The case the request's ``user`` names (``case:<name>``); no case: an honest answer."""
    case = (body.get("user") or "").removeprefix("case:")
    claimed = CASES[case][0] if case else usage(10, HONEST_COMPLETION)
    if claimed is MISSING:
        data = completion(kind, body["model"], TEXT, with_usage=False)
    else:
        data = completion(kind, body["model"], TEXT, claimed)
    return web.Response(body=data, content_type="application/json")


@pytest.fixture(scope="module")
async def edge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edge]:
    async with edge_over(FakeRegion(answer), tmp_path_factory.mktemp("unary-usage"), "fake") as e:
        yield e


async def ask(edge: Edge, key: str, kind: str, case: str) -> tuple[int, dict[str, Any], str]:
    client_id = uuid.uuid4().hex
    payload: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS}
    if case:
        payload["user"] = f"case:{case}"
    if kind == "chat":
        payload["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        payload["prompt"] = PROMPT
    headers = {"Authorization": f"Bearer {key}", "x-client-request-id": client_id}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s,
        s.post(
            f"{edge.url}/v1/{'chat/completions' if kind == 'chat' else 'completions'}",
            json=payload,
            headers=headers,
        ) as r,
    ):
        return r.status, json.loads(await r.read()), client_id


async def row_of(edge: Edge, client_id: str) -> dict[str, Any]:
    for _ in range(100):
        db = sqlite3.connect(edge.ledger_db)
        db.row_factory = sqlite3.Row
        try:
            rows = [
                dict(r) for r in db.execute("SELECT * FROM usage WHERE client_request_id = ?", (client_id,))
            ]
        finally:
            db.close()
        if rows:
            assert len(rows) == 1, rows
            return rows[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no ledger row for {client_id}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["chat", "completions"])
@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_lying_unary_usage_bills_what_was_delivered(edge: Edge, kind: str, case: str):
    key = await asyncio.to_thread(edge.new_key, rpm=10_000, tpm=10_000_000)
    status, body, client_id = await ask(edge, key, kind, case)
    assert status == 200, body
    delivered = body["choices"][0]["message"]["content"] if kind == "chat" else body["choices"][0]["text"]
    assert delivered == TEXT  # the client still gets the region's answer
    _, billed_prompt, billed_completion = CASES[case]
    estimate, ceiling = prompt_bounds(kind)
    prompt = {"reported": 10, "estimate": estimate, "ceiling": ceiling}[billed_prompt]
    completion_tokens = DELIVERED if billed_completion == "delivered" else HONEST_COMPLETION
    row = await row_of(edge, client_id)
    assert row["status"] == "ok" and row["http_status"] == 200
    assert (row["prompt_tokens"], row["completion_tokens"]) == (prompt, completion_tokens), case
    assert row["completion_tokens"] > 0
    # The client is told the figure it was billed, never the region's claim.
    assert body["usage"]["completion_tokens"] == completion_tokens
    assert body["usage"]["prompt_tokens"] == prompt


@pytest.mark.slow
async def test_an_honest_unary_usage_is_billed_as_reported(edge: Edge):
    key = await asyncio.to_thread(edge.new_key, rpm=10_000, tpm=10_000_000)
    for kind in ("chat", "completions"):
        status, body, client_id = await ask(edge, key, kind, "")
        assert status == 200 and body["usage"]["completion_tokens"] == HONEST_COMPLETION
        row = await row_of(edge, client_id)
        assert (row["prompt_tokens"], row["completion_tokens"]) == (10, HONEST_COMPLETION)


# ---- the audit on its own ------------------------------------------------------------------------------

UNARY = UsageBounds(prompt_ceiling=100, prompt_estimate=30, max_tokens=50, delivered=Delivered(20, 2))


def raw(prompt: Any, completion_tokens: Any) -> bytes:
    return json.dumps(usage(prompt, completion_tokens)).encode()


@pytest.mark.parametrize(
    ("reported", "billed", "anomaly"),
    [
        (raw(10, -1), (10, 20), "negative_completion"),
        (raw(10, 10**15), (10, 20), "completion_over_max_tokens"),
        (raw(10, 1), (10, 20), "completion_under_delivered"),  # 2 tokens at least
        (raw(10, 1.5), (30, 20), "malformed"),
        (None, (30, 20), "missing"),
    ],
)
def test_a_unary_lie_bills_the_delivered_count(reported: bytes | None, billed: tuple[int, int], anomaly: str):
    audited = audit_usage(reported, UNARY, produced=True)
    assert anomaly in audited.anomalies
    assert (audited.usage.prompt_tokens, audited.usage.completion_tokens) == billed


def test_a_plausible_unary_count_is_trusted_and_the_delivered_count_capped():
    assert audit_usage(raw(10, 2), UNARY, produced=True).anomalies == []  # fewer than estimated: trusted
    capped = UsageBounds(100, 30, max_tokens=5, delivered=Delivered(20, 2))
    assert audit_usage(raw(10, -1), capped, produced=True).usage.completion_tokens == 5
