"""The journey's one bill, in process: a finished journey, in each of its outcomes, settles its TPM
reservation and budget hold, writes one ledger row with the checked usage and its cost, and counts it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from edge.billing import Price, PriceTable
from edge.config import EdgeConfig
from edge.journey import CLIENT_LEFT, Admission, CacheUse, Journey, Relayed
from edge.keys import ApiKey
from edge.ledger import UsageRecord
from edge.limits import Decision, Window
from edge.metrics import EdgeMetrics
from edge.spend_budget import Hold
from edge.stages.settle import settle_journey
from nearshore.protocol.errors import UPSTREAM_UNAVAILABLE, ApiError
from nearshore.protocol.schemas import ChatCompletionRequest

MODEL = "gemma-3-270m"
PRICE = Price(input=1.0, cached_input=0.5, output=2.0)  # USD per million tokens
PROMPT_CEILING, PROMPT_ESTIMATE, MAX_TOKENS = 40, 12, 16


class Books:
    """What settling writes to: the limiter, the budget, the ledger; each call kept."""

    def __init__(self) -> None:
        self.limits: list[tuple[str, str, int]] = []
        self.budgets: list[tuple[Hold | None, str, float]] = []
        self.rows: list[UsageRecord] = []

    async def settle_limit(self, key_id: str, reservation: str, tokens: int) -> None:
        self.limits.append((key_id, reservation, tokens))

    async def settle_budget(self, hold: Hold | None, key_id: str, cost: float) -> None:
        self.budgets.append((hold, key_id, cost))

    async def record(self, row: UsageRecord) -> None:
        self.rows.append(row)


@pytest.fixture
def books() -> Books:
    return Books()


def journey(books: Books, limits_in_memory: bool = False) -> Journey:
    """A streamed chat request, admitted (reserved and held), forwarded to london; its limits shared
    (settled in the background, as with Redis) unless ``limits_in_memory``."""
    background: list[asyncio.Task] = []

    def in_background(coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        background.append(task)
        return task

    state = SimpleNamespace(
        config=EdgeConfig(),
        metrics=EdgeMetrics(),
        prices=PriceTable({MODEL: PRICE}),
        limiter=SimpleNamespace(settle=books.settle_limit, settles_in_memory=limits_in_memory),
        budget=SimpleNamespace(settle=books.settle_budget),
        ledger=SimpleNamespace(record=books.record),
        in_background=in_background,
        background=background,
    )
    j = Journey(SimpleNamespace(headers={}), state, "chat", time.perf_counter(), "req-1", "client-7")
    j.key = ApiKey(key_id="k1", tenant="acme")
    j.body = msgspec.convert(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ChatCompletionRequest,
    )
    window = Window(0, 0, 0.0)
    decision = Decision(True, window, window, reservation="res-1")
    j.admission = Admission(decision, Hold("k1", 0.001), PROMPT_CEILING, PROMPT_ESTIMATE, MAX_TOKENS)
    j.forwarded.region, j.forwarded.attempts = "london", 1
    return j


async def settled(j: Journey) -> Any:
    audited = await settle_journey(j)
    await asyncio.gather(*j.state.background)  # the TPM refund runs in the background
    return audited


def usage(prompt: int, completion: int, cached: int = 0, total: int | None = None) -> bytes:
    figures = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
    figures["total_tokens"] = prompt + completion if total is None else total
    figures["prompt_tokens_details"] = {"cached_tokens": cached}
    return json.dumps(figures).encode()


def sample(j: Journey, name: str, **labels: str) -> float | None:
    return j.state.metrics.registry.get_sample_value(name, labels)


async def test_an_answered_request_is_billed_its_usage_at_its_price_once(books: Books):
    j = journey(books)
    j.answered()
    j.relayed = Relayed(events=3, usage=usage(10, 3, cached=4), produced=True)

    audited = await settled(j)

    cost = (6 * 1.0 + 4 * 0.5 + 3 * 2.0) / 1e6
    assert audited is not None and not audited.anomalies
    [row] = books.rows
    assert (row.request_id, row.client_request_id, row.key_id, row.tenant) == (
        "req-1",
        "client-7",
        "k1",
        "acme",
    )
    assert (row.model, row.region, row.status, row.http_status, row.error_code) == (
        MODEL,
        "london",
        "ok",
        200,
        "",
    )
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (10, 4, 3)
    assert row.cost_usd == pytest.approx(cost) and row.cache_status == "bypass" and row.attempts == 1
    assert books.limits == [("k1", "res-1", 13)]  # the reservation settles to the real total
    assert books.budgets == [(j.admission.hold, "k1", pytest.approx(cost))]
    assert j.billed is not None and j.billed.total_tokens == 13
    assert sample(j, "nearshore_edge:requests_total", status="ok", region="london") == 1
    assert sample(j, "nearshore_edge:generation_tokens_total", model=MODEL) == 3


async def test_limits_kept_in_memory_are_settled_in_place_not_in_a_task(books: Books):
    """An in-memory limiter's refund cannot wait on anything: it is done when the bill is, with no task."""
    j = journey(books, limits_in_memory=True)
    j.answered()
    j.relayed = Relayed(events=3, usage=usage(10, 3), produced=True)

    await settle_journey(j)

    assert books.limits == [("k1", "res-1", 13)] and not j.state.background
    assert len(books.rows) == 1

    assert await settled(j) is None  # billed once: a second exit writes nothing
    assert len(books.rows) == 1 and len(books.limits) == 1 and len(books.budgets) == 1


async def test_an_error_before_the_first_byte_costs_nothing_and_is_counted_as_the_regions(books: Books):
    j = journey(books)
    j.failed(ApiError(UPSTREAM_UNAVAILABLE, "No region could take the request"))

    await settled(j)

    [row] = books.rows
    assert (row.status, row.http_status, row.error_code) == ("error", 503, "upstream_unavailable")
    assert (row.prompt_tokens, row.completion_tokens, row.cost_usd) == (0, 0, 0.0)
    assert books.limits == [("k1", "res-1", 0)]  # nothing was generated: the whole reservation comes back
    assert (
        sample(j, "nearshore_edge:upstream_errors_total", code="upstream_unavailable", region="london") == 1
    )


async def test_a_prompt_the_region_refused_keeps_its_share_of_the_tpm_window(books: Books):
    j = journey(books)
    j.failed(ApiError(UPSTREAM_UNAVAILABLE, "too long"), refused=True)

    await settled(j)

    assert books.rows[0].cost_usd == 0.0 and books.limits == [("k1", "res-1", PROMPT_ESTIMATE)]
    assert (
        sample(j, "nearshore_edge:upstream_errors_total", code="upstream_unavailable", region="london")
        is None
    )


async def test_a_client_that_left_mid_stream_is_billed_what_it_was_sent(books: Books):
    j = journey(books)
    j.relayed = Relayed(events=5, produced=True)  # five tokens relayed, then the client went away
    j.left()

    await settled(j)

    [row] = books.rows
    assert (row.status, row.http_status) == ("aborted", CLIENT_LEFT)
    assert (row.prompt_tokens, row.completion_tokens) == (PROMPT_ESTIMATE, 5)  # no usage came: the estimate
    assert row.cost_usd == pytest.approx((PROMPT_ESTIMATE * 1.0 + 5 * 2.0) / 1e6)
    assert books.limits == [("k1", "res-1", PROMPT_ESTIMATE + 5)]


async def test_a_region_that_lies_about_its_usage_is_billed_what_the_edge_can_defend(books: Books):
    j = journey(books)
    j.answered()  # over the prompt's ceiling and max_tokens, a wrong total:
    j.relayed = Relayed(events=4, usage=usage(10_000, 1_000, total=5), produced=True)

    audited = await settled(j)

    assert audited.anomalies == ["prompt_over_ceiling", "completion_over_max_tokens", "total_mismatch"]
    [row] = books.rows
    assert (row.prompt_tokens, row.completion_tokens) == (PROMPT_CEILING, 4)  # the ceiling; what was relayed
    assert row.cost_usd == pytest.approx((PROMPT_CEILING * 1.0 + 4 * 2.0) / 1e6)
    assert audited.usage.total_tokens == PROMPT_CEILING + 4  # what the client's usage chunk says
    kinds = ("prompt_over_ceiling", "completion_over_max_tokens", "total_mismatch")
    for kind in kinds:
        assert sample(j, "nearshore_edge:usage_anomalies_total", kind=kind, region="london") == 1


async def test_a_cache_hit_is_billed_at_the_caches_price_and_a_fallback_names_what_was_asked(books: Books):
    j = journey(books)
    j.answered()
    j.relayed = Relayed(usage=usage(10, 3), produced=True)
    j.cache = CacheUse("semantic", 0.002)
    j.forwarded.served_model, j.forwarded.region = MODEL, ""
    j.body = msgspec.structs.replace(j.body, model="gemma-3-270m-large")

    await settled(j)

    [row] = books.rows
    factor = j.state.config.cache.price_factor
    assert row.cache_status == "semantic" and row.region == ""
    assert row.cost_usd == pytest.approx((10 * 1.0 + 3 * 2.0) / 1e6 * factor)
    assert (row.model, row.fallback_from) == (MODEL, "gemma-3-270m-large")  # priced as the model that served


async def test_a_request_refused_before_admission_has_no_row(books: Books):
    j = journey(books)
    j.admission = None

    assert await settled(j) is None
    assert books.rows == [] and books.limits == [] and books.budgets == []
