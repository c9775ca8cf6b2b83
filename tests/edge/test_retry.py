"""The retry discipline's pure pieces: the deadline, Retry-After in both forms, backoff, the retry budget."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from edge.retry import (
    MAX_RETRY_AFTER_S,
    Deadline,
    FirstByteBudget,
    RetryBudget,
    backoff_s,
    parse_duration,
    parse_retry_after,
    retry_after_of,
    stall_window,
)
from edge.sse_relay import StreamClock


def test_a_deadline_caps_every_timeout_by_what_is_left():
    deadline = Deadline.after(10.0, now=100.0)
    assert deadline.left(now=104.0) == 6.0
    assert deadline.cap(30.0, now=104.0) == 6.0 and deadline.cap(2.0, now=104.0) == 2.0
    assert not deadline.passed(now=109.9) and deadline.passed(now=110.0)
    assert deadline.left(now=200.0) == 0.0  # never negative


def test_retry_after_reads_seconds_and_http_dates():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 1.5 ") == 1.5
    now = 1_700_000_000.0
    date = format_datetime(datetime.fromtimestamp(now + 7, tz=UTC), usegmt=True)
    assert abs(parse_retry_after(date, now_epoch=now) - 7.0) < 1.0
    past = format_datetime(datetime.fromtimestamp(now - 60, tz=UTC), usegmt=True)
    assert parse_retry_after(past, now_epoch=now) == 0.0  # a date gone by: ask now


def test_retry_after_that_cannot_be_read_is_none_and_a_huge_one_is_bounded():
    for value in (None, "", "soon", "-", "nan", "1" * 100, "Mon, 99 Foo 2024 99:99:99 GMT"):
        assert parse_retry_after(value) is None, value
    assert parse_retry_after("-5") == 0.0
    assert parse_retry_after("1e12") == MAX_RETRY_AFTER_S


def test_backoff_doubles_to_its_ceiling_with_jitter_in_the_upper_half():
    rng = random.Random(7)
    for attempt, ceiling in ((0, 0.25), (1, 0.5), (2, 1.0), (3, 2.0), (10, 4.0)):
        waits = [backoff_s(attempt, 0.25, 4.0, rng) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), (attempt, min(waits), max(waits))
        assert max(waits) - min(waits) > ceiling / 4  # jittered, not one value


def test_the_retry_budget_is_a_share_of_traffic_plus_a_floor_per_second():
    budget = RetryBudget(share=0.2, floor_per_s=1.0, burst=3.0)
    now = 1000.0
    assert [budget.withdraw(now) for _ in range(4)] == [True, True, True, False]  # the burst, then none
    for _ in range(5):  # five first attempts earn one retry
        budget.deposit(now)
    assert budget.withdraw(now) and not budget.withdraw(now)
    assert budget.withdraw(now + 1.0)  # a second earns one more, whatever the traffic
    budget.deposit(now + 100.0)
    assert budget.tokens == 3.0  # never more than the burst


def test_a_streams_clock_has_one_limit_for_the_first_token_one_for_stalls_and_one_for_the_request():
    clock = StreamClock(first_token_by=10.0, stall_s=2.0, deadline_at=30.0, ttft_s=8.0)
    assert clock.overdue(9.0, 0, 2.0) == ("", False)  # no token yet, but within its limit: no stall rule
    assert clock.overdue(10.0, 0, 9.9) == ("no first token within 8s", False)
    assert clock.overdue(12.0, 5, 10.5) == ("", False)  # streaming: 1.5 s since the last event
    assert clock.overdue(12.6, 5, 10.5) == ("no event from the region for 2s", False)
    assert clock.overdue(30.0, 5, 29.9) == ("the request's deadline passed", True)  # nothing may continue it


def test_one_first_byte_budget_for_all_attempts_keeps_the_fallbacks_share():
    budget = FirstByteBudget(by=100.0, reserve_s=15.0, own_model="big")
    assert budget.limit("big", 30.0, now=55.0) == 30.0  # a first attempt waits its whole timeout
    assert budget.limit("big", 30.0, now=85.0) == 0.0  # the model's own replicas leave the reserve
    assert budget.limit("small", 30.0, now=85.0) == 15.0  # which is the fallback's
    assert budget.limit("small", 30.0, now=101.0) == 0.0
    assert FirstByteBudget(0.0).limit("big", 30.0, now=1e9) == 30.0  # no budget: the timeout alone


def test_the_stall_window_spends_the_stall_budget_down_to_a_floor():
    assert stall_window(20.0, 30.0, 0.0) == 20.0
    assert stall_window(20.0, 30.0, 20.0) == 10.0  # what the first stall left
    assert stall_window(20.0, 30.0, 30.0) == 5.0  # spent: the floor
    assert stall_window(2.0, 2.5, 2.0) == 1.0  # a short stall timeout's floor is half of it
    assert stall_window(2.0, 100.0, 50.0) == 2.0  # never longer than the stall timeout


def test_go_style_durations_as_providers_give_their_resets():
    cases = {
        "1s": 1.0,
        "6m0s": 360.0,
        "20ms": 0.02,
        "2m59.56s": 179.56,
        "1h2m": 3720.0,
        "0.5": 0.5,
        "5m": 300.0,
    }
    for text, seconds in cases.items():
        assert parse_duration(text) == pytest.approx(seconds), text
    for bad in ("", None, "soon", "1d", "-", "m", "1s2m", "9" * 40):
        assert parse_duration(bad) is None, bad


def test_a_429_says_when_by_retry_after_first_then_the_limit_it_ran_out_of():
    assert retry_after_of({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_of({"retry-after": "3", "x-ratelimit-reset-requests": "1s"}) == 3.0
    out_of_requests = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "4000",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert retry_after_of(out_of_requests) == 1.0  # the tokens' reset does not hold it back
    out_of_tokens = {
        **out_of_requests,
        "x-ratelimit-remaining-requests": "12",
        "x-ratelimit-remaining-tokens": "0",
    }
    assert retry_after_of(out_of_tokens) == 360.0
    unsaid = {"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "30s"}
    assert retry_after_of(unsaid) == 2.0  # which ran out is not said: the soonest chance
    assert retry_after_of({"x-ratelimit-reset-tokens": "99h"}) == MAX_RETRY_AFTER_S
    assert retry_after_of({}) is None and retry_after_of({"retry-after": "later"}) is None
