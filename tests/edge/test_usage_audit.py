"""A region's usage is a claim: the edge bills the figure it can defend (issue 7, item 6), and budgets hold
the worst case of every request in flight (item 12)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from edge.keys import ApiKey
from edge.spend_budget import BudgetBook
from edge.token_count import EstimatingCounter, chat_ceiling, text_ceiling
from edge.usage_audit import UsageBounds, audit_usage
from nearshore.protocol.errors import ApiError
from nearshore.protocol.schemas import ChatMessage

BOUNDS = UsageBounds(prompt_ceiling=100, prompt_estimate=30, max_tokens=5)
STREAM = UsageBounds(prompt_ceiling=100, prompt_estimate=30, max_tokens=5, relayed_events=4)


def usage(prompt: int, completion: int, cached: int = 0) -> bytes:
    return msgspec.json.encode(
        {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
    )


def test_honest_usage_is_billed_as_reported():
    audited = audit_usage(usage(20, 4, cached=8), STREAM, produced=True)
    assert audited.anomalies == []
    assert (audited.usage.prompt_tokens, audited.usage.completion_tokens) == (20, 4)
    assert audited.usage.prompt_tokens_details.cached_tokens == 8


@pytest.mark.parametrize(
    ("reported", "bounds", "billed", "anomaly"),
    [
        (usage(-5, 3), BOUNDS, (30, 3), "negative_prompt"),
        (usage(20, -3), STREAM, (20, 4), "negative_completion"),
        (usage(10**15, 10**15), BOUNDS, (100, 5), "prompt_over_ceiling"),
        (usage(2**70, 3), BOUNDS, (100, 3), "prompt_over_ceiling"),  # past int64: SQLite would overflow
        (usage(10, 842_650), BOUNDS, (10, 5), "completion_over_max_tokens"),
        (usage(10, 842_650), STREAM, (10, 4), "completion_over_max_tokens"),  # what the user got
        (usage(10, 2), STREAM, (10, 4), "completion_under_relayed"),
        (usage(10, 3, cached=50), BOUNDS, (10, 3), "cached_out_of_range"),
    ],
)
def test_lies_are_clamped_to_what_the_edge_knows(reported, bounds, billed, anomaly):
    audited = audit_usage(reported, bounds, produced=True)
    assert anomaly in audited.anomalies
    assert (audited.usage.prompt_tokens, audited.usage.completion_tokens) == billed
    assert 0 <= audited.usage.prompt_tokens_details.cached_tokens <= audited.usage.prompt_tokens
    assert audited.usage.total_tokens == sum(billed) < 2**63


def test_the_stop_token_may_be_counted():
    assert audit_usage(usage(10, 6), BOUNDS, produced=True).anomalies == []


@pytest.mark.parametrize(
    "raw", [b"nonsense", b'{"prompt_tokens": "many"}', b"[1, 2]", b'{"prompt_tokens": 1.5}']
)
def test_malformed_usage_bills_the_estimate(raw):
    audited = audit_usage(raw, STREAM, produced=True)
    assert audited.anomalies == ["malformed"]
    assert (audited.usage.prompt_tokens, audited.usage.completion_tokens) == (30, 4)


def test_no_usage_bills_what_was_relayed():
    assert audit_usage(None, STREAM, produced=True).usage.total_tokens == 34
    nothing = UsageBounds(100, 30, 5, relayed_events=0)
    assert audit_usage(None, nothing, produced=False).usage.total_tokens == 0  # failed before any token


def test_the_prompt_ceiling_cannot_be_beaten_by_choice_of_text():
    """Digits are about a token a byte: the old bytes/3 estimate let them through a TPM limit."""
    digits = [ChatMessage(role="user", content="7" * 1500)]
    assert chat_ceiling(digits) >= 1500 + 1  # every byte a token, plus framing
    assert EstimatingCounter().count_chat(digits) < chat_ceiling(digits)
    assert text_ceiling("é" * 100) >= 200  # bytes, not characters


def key(budget: float | None) -> ApiKey:
    return ApiKey(key_id="k1", tenant="t", budget_usd=budget)


async def test_parallel_requests_cannot_overspend_a_budget_together():
    book = BudgetBook(lambda _key_id: 0.0)
    budget = key(0.000010)
    held = []
    for _ in range(50):
        try:
            held.append(await book.hold(budget, 0.000004))
        except ApiError as exc:
            assert exc.status == 429 and exc.kind.code == "insufficient_quota"
    assert len(held) == 2  # 2 x 4 <= 10 < 3 x 4
    await book.settle(held[0], "k1", 0.000001)  # the first really cost 1
    assert await book.hold(budget, 0.000004)  # 1 spent + 4 held + 4 <= 10
    with pytest.raises(ApiError) as never:
        await book.hold(budget, 0.000011)
    assert never.value.status == 400  # bigger than the whole budget: retrying cannot help


async def test_a_spent_budget_is_429_and_unbudgeted_keys_hold_nothing():
    book = BudgetBook(lambda _key_id: 0.5)
    with pytest.raises(ApiError) as spent:
        await book.hold(key(0.5), 0.0)
    assert spent.value.status == 429
    assert await book.hold(key(None), 1e9) is None


async def test_the_spend_is_read_once_however_many_arrive_together():
    reads = []

    def spent_of(key_id: str) -> float:
        reads.append(key_id)
        return 0.0

    book = BudgetBook(spent_of)
    await asyncio.gather(*(book.hold(key(1.0), 0.001) for _ in range(20)))
    assert reads == ["k1"]
    assert book.held["k1"] == pytest.approx(0.02) and book.spent["k1"] == 0.0
