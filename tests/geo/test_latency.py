"""The latency model (geo/latency.py): the moving averages, the observed first-token excess and when it goes
stale, and a replica's round trip before and after it is measured (never below the fibre floor)."""

from __future__ import annotations

import math

import pytest

from geo.latency import PREFILL_NOISE_MS, Ewma, Latency, Observed


def test_an_ewma_starts_at_its_first_sample_then_moves_by_alpha():
    e = Ewma(alpha=0.25)
    assert (e.value, e.samples) == (0.0, 0)
    e.add(100.0)
    assert (e.value, e.samples) == (100.0, 1)  # not 25: the first sample is the estimate
    e.add(200.0)
    assert e.value == pytest.approx(125.0)
    e.add(125.0)
    assert e.value == pytest.approx(125.0) and e.samples == 3


def test_observed_is_stale_until_its_first_sample_and_again_after_stale_after_s():
    o = Observed(alpha=0.5, stale_after_s=10.0)
    assert o.at == -math.inf and o.stale(0.0) and o.stale(1e9)
    o.add(80.0, now=100.0)
    assert (o.value, o.samples, o.at) == (80.0, 1, 100.0)
    assert not o.stale(100.0) and not o.stale(109.9)
    assert o.stale(110.0)  # exactly stale_after_s without a sample: stale


def test_a_fresh_observation_is_averaged_with_its_weight_and_a_stale_one_replaced():
    o = Observed(alpha=0.5, stale_after_s=10.0)
    o.add(100.0, now=0.0)
    o.add(50.0, now=1.0)
    assert o.value == pytest.approx(75.0)
    o.add(0.0, now=2.0, weight=0.5)  # a quarter of the way, not a half
    assert o.value == pytest.approx(75.0 - 0.25 * 75.0)
    # After the silence the next sample starts it afresh: a recovered replica is seen to be at once.
    o.add(5.0, now=100.0)
    assert o.value == 5.0 and o.samples == 4 and o.at == 100.0


def test_until_measured_the_round_trip_is_the_inflated_floor_then_the_average_never_below_the_floor():
    latency = Latency(floor_rtt_ms=40.0, inflation=1.5, alpha=0.5)
    assert latency.rtt_ms == pytest.approx(60.0) and not latency.measured and not latency.below_floor
    latency.rtt.add(90.0)
    assert latency.measured and latency.rtt_ms == 90.0
    latency.rtt.add(10.0)  # average 50: still above the floor
    assert latency.rtt_ms == pytest.approx(50.0)
    latency.rtt.add(0.0)  # average 25: faster than light allows from the catalog's place
    assert latency.rtt.value == pytest.approx(25.0) and latency.rtt_ms == 40.0
    assert not latency.below_floor  # 25 is not under half the floor (20) ...
    latency.rtt.add(0.0)
    assert latency.rtt.value == pytest.approx(12.5) and latency.below_floor  # ... 12.5 is


def test_a_probe_far_above_the_round_trip_counts_only_once_the_next_probe_agrees():
    latency = Latency(floor_rtt_ms=40.0, inflation=1.5, alpha=0.5)
    latency.probe_round_trip(900.0)  # the first is taken as it is: nothing to weigh it against
    assert latency.rtt_ms == 900.0
    latency = Latency(floor_rtt_ms=40.0, inflation=1.5, alpha=0.5)
    latency.probe_round_trip(100.0)
    latency.probe_round_trip(150.0)  # under twice the estimate: jitter, averaged as it is
    assert latency.rtt_ms == pytest.approx(125.0)
    latency.probe_round_trip(800.0)  # one answer held up at the node: counted as the previous probe's 150
    assert latency.rtt_ms == pytest.approx(137.5)
    latency.probe_round_trip(140.0)
    assert latency.rtt_ms == pytest.approx(138.75)
    # A path that did get slower: its first probe waits, its second agrees.
    latency.probe_round_trip(400.0)
    assert latency.rtt_ms == pytest.approx(139.375)
    latency.probe_round_trip(420.0)  # as far as both saw
    assert latency.rtt_ms == pytest.approx((139.375 + 400.0) / 2)


def test_each_latency_has_its_own_averages():
    a, b = Latency(10.0, 1.6, 0.3), Latency(10.0, 1.6, 0.3)
    a.rtt.add(50.0)
    a.service.add(700.0)
    assert b.rtt.samples == 0 and b.service.samples == 0 and a.rtt is not b.rtt
    assert a.observed.alpha == 0.3 and a.observed.stale_after_s == 10.0


def test_the_service_time_is_the_default_until_real_requests_are_timed():
    latency = Latency(10.0, 1.6, 0.5)
    assert latency.service_ms(2000.0) == 2000.0
    latency.service.add(300.0)
    latency.service.add(500.0)
    assert latency.service_ms(2000.0) == pytest.approx(400.0)


def test_a_first_token_counts_what_the_round_trip_and_the_prefill_do_not_explain():
    latency = Latency(floor_rtt_ms=20.0, inflation=1.5, alpha=0.5)  # a round trip of 30 until measured
    latency.first_token(ttft_ms=130.0, prefill_ms=0.0, now=0.0)
    assert latency.observed.value == pytest.approx(100.0) and latency.ttft.value == 130.0
    latency.first_token(ttft_ms=80.0, prefill_ms=0.0, now=1.0)
    assert latency.observed.value == pytest.approx(75.0)  # 75 = 100 + 0.5 * (50 - 100)
    # Faster than the round trip and the prefill: no negative queue.
    latency.first_token(ttft_ms=10.0, prefill_ms=0.0, now=2.0)
    assert latency.observed.value == pytest.approx(37.5)


def test_a_long_prompts_sample_weighs_less_in_the_average():
    latency = Latency(floor_rtt_ms=0.0, inflation=1.0, alpha=0.5)
    latency.first_token(ttft_ms=700.0, prefill_ms=0.0, now=0.0)
    # prefill == PREFILL_NOISE_MS: half the weight; its excess is 900 - 500 = 400.
    latency.first_token(ttft_ms=900.0, prefill_ms=PREFILL_NOISE_MS, now=1.0)
    assert latency.observed.value == pytest.approx(700.0 + 0.5 * 0.5 * (400.0 - 700.0))


def test_a_whole_answers_time_is_an_upper_bound_that_may_only_lower_the_estimate():
    latency = Latency(floor_rtt_ms=0.0, inflation=1.0, alpha=0.5)
    latency.first_token(500.0, 0.0, now=0.0, upper_bound=True)  # nothing to lower: not a sample
    assert latency.observed.samples == 0 and latency.ttft.samples == 1
    latency.first_token(200.0, 0.0, now=1.0)
    latency.first_token(900.0, 0.0, now=2.0, upper_bound=True)  # above the estimate: says nothing
    assert latency.observed.value == 200.0 and latency.observed.samples == 1
    latency.first_token(100.0, 0.0, now=3.0, upper_bound=True)  # below it: the first token came sooner
    assert latency.observed.value == pytest.approx(150.0) and latency.observed.samples == 2


def test_a_raise_counts_only_as_far_as_another_sources_fresh_sample_corroborates_it():
    o = Observed(alpha=0.5, stale_after_s=10.0)
    o.add(20.0, now=0.0, source="b")
    o.add(2000.0, now=1.0, source="a")  # one tenant's slow request: b saw 20 a second ago
    assert o.value == pytest.approx(20.0)
    o.add(1800.0, now=2.0, source="b")  # b sees it too: a saw 2000, so b's 1800 counts whole
    assert o.value == pytest.approx(20.0 + 0.5 * (1800.0 - 20.0))
    # A lower sample needs no witness: recovery shows at once.
    o.add(0.0, now=3.0, source="a")
    assert o.value == pytest.approx(0.5 * (20.0 + 0.5 * 1780.0))


def test_with_one_source_a_raise_needs_its_next_sample_and_an_old_witness_does_not_count():
    o = Observed(alpha=1.0, stale_after_s=10.0)
    o.add(30.0, now=0.0, source="a")
    o.add(900.0, now=1.0, source="a")  # its own last (30) is the witness
    assert o.value == pytest.approx(30.0)
    o.add(1000.0, now=2.0, source="a")  # and again: its last saw 900
    assert o.value == pytest.approx(900.0)
    o.add(50.0, now=3.0, source="b")  # lower: taken at once
    assert o.value == pytest.approx(50.0)
    o.add(1200.0, now=14.0, source="a")  # after the silence, higher: it waits for a witness
    assert o.value == pytest.approx(50.0)
    # b's 50 came 12 s ago: too old to witness anything; a's own last (1200) does.
    o.add(1500.0, now=15.0, source="a")
    assert o.value == pytest.approx(1200.0)


def test_after_silence_a_lower_sample_replaces_the_estimate_and_a_higher_one_waits_for_a_witness():
    o = Observed(alpha=0.5, stale_after_s=10.0)
    o.add(3000.0, now=0.0, source="a")  # the very first: nothing to weigh it against
    assert o.value == 3000.0
    o.add(40.0, now=20.0, source="a")  # explored after the silence: recovered, seen at once
    assert o.value == 40.0
    o.add(2500.0, now=40.0, source="b")  # the first after a quiet spell, slow for its own reasons
    assert o.value == 40.0
    o.add(2000.0, now=41.0, source="c")  # slow for another tenant too: it counts
    assert o.value == pytest.approx(40.0 + 0.5 * (2000.0 - 40.0))
