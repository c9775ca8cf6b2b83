"""A replica's queue and load terms (geo/terms.py): what its load implies (requests beyond capacity times its
service time, utilisation times the load penalty), what real requests observed beyond the scope's baseline
(the larger wins, so a load report never makes a replica measured slow look fast), and SGLang's balance rule
that prefix affinity obeys."""

from __future__ import annotations

import pytest

from geo.catalog import HealthSettings, Place, RegionSpec, RoutingSettings
from geo.decision import Replica
from geo.health import Health
from geo.latency import Latency
from geo.terms import LOAD_PENALTY_MS, balanced, queue_and_load, reported_queue_and_load
from nearshore.protocol.load import LoadReport

SERVICE_MS = 1000.0


def replica(name: str = "a", capacity: int = 4, load: LoadReport | None = None, inflight: int = 0) -> Replica:
    return Replica(
        id=name,
        region=name,
        url="http://127.0.0.1:9000",
        spec=RegionSpec(name=name, url="http://127.0.0.1:9000", capacity=capacity),
        place=Place(0.0, 0.0, "", ""),
        health=Health(HealthSettings()),
        latency=Latency(20.0, 1.6, 0.5),
        models=frozenset({"m"}),
        load=load,
        inflight=inflight,
    )


def test_an_idle_replica_has_no_queue_and_no_load():
    assert reported_queue_and_load(replica(), SERVICE_MS) == (0.0, 0.0)


def test_below_capacity_only_the_load_term_grows_with_utilisation():
    queue_ms, load_ms = reported_queue_and_load(replica(capacity=4, inflight=2), SERVICE_MS)
    assert queue_ms == 0.0 and load_ms == pytest.approx(0.5 * LOAD_PENALTY_MS)
    # The next request takes the last slot: still no wait.
    assert reported_queue_and_load(replica(capacity=4, inflight=3), SERVICE_MS)[0] == 0.0


def test_beyond_capacity_each_request_ahead_costs_its_share_of_a_service_time():
    queue_ms, load_ms = reported_queue_and_load(replica(capacity=4, inflight=5), SERVICE_MS)
    assert queue_ms == pytest.approx((5 + 1 - 4) / 4 * SERVICE_MS)
    assert load_ms == LOAD_PENALTY_MS  # utilisation is capped at 1


def test_the_replicas_own_report_refines_the_capacity_and_the_busy_count():
    # It decodes 2 at once, not the catalog's 4; 3 running and 1 waiting, beyond this edge's 1 in flight.
    r = replica(capacity=4, load=LoadReport(running=3, waiting=1, capacity=2), inflight=1)
    queue_ms, load_ms = reported_queue_and_load(r, SERVICE_MS)
    assert queue_ms == pytest.approx((4 + 1 - 2) / 2 * SERVICE_MS) and load_ms == LOAD_PENALTY_MS
    # A report of a larger capacity than the catalog's is not believed; an unknown one (0) changes nothing.
    for reported in (64, 0):
        r = replica(capacity=2, load=LoadReport(capacity=reported), inflight=2)
        assert reported_queue_and_load(r, SERVICE_MS)[0] == pytest.approx(SERVICE_MS / 2)


def test_the_measured_service_time_replaces_the_default():
    r = replica(capacity=1, inflight=1)
    r.latency.service.add(300.0)
    assert reported_queue_and_load(r, SERVICE_MS)[0] == pytest.approx(300.0)


def test_a_capacity_below_one_from_an_unvalidated_spec_counts_as_one():
    r = replica(capacity=0, inflight=0)  # a Struct made in code is not validated
    assert reported_queue_and_load(r, SERVICE_MS) == (0.0, 0.0)
    r.inflight = 2
    assert reported_queue_and_load(r, SERVICE_MS) == (pytest.approx(2 * SERVICE_MS), LOAD_PENALTY_MS)


def test_without_observations_the_queue_is_what_the_load_implies():
    r = replica(capacity=1, inflight=1)
    assert queue_and_load(r, SERVICE_MS, baseline_ms=500.0) == reported_queue_and_load(r, SERVICE_MS)


def test_an_observed_queue_beyond_the_baseline_wins_over_an_idle_report():
    r = replica(load=LoadReport(running=0, waiting=0, capacity=4))
    r.latency.observed.add(900.0, now=0.0)
    assert queue_and_load(r, SERVICE_MS, baseline_ms=400.0) == (pytest.approx(500.0), 0.0)
    assert queue_and_load(r, SERVICE_MS) == (pytest.approx(900.0), 0.0)


def test_an_observation_under_the_baseline_never_makes_a_queue_negative_or_hides_a_reported_one():
    r = replica(capacity=1, inflight=1)  # implies one service time of queue
    r.latency.observed.add(100.0, now=0.0)
    assert queue_and_load(r, SERVICE_MS, baseline_ms=400.0)[0] == pytest.approx(SERVICE_MS)
    idle = replica()
    idle.latency.observed.add(100.0, now=0.0)
    assert queue_and_load(idle, SERVICE_MS, baseline_ms=400.0)[0] == 0.0


def test_balanced_without_the_holder_among_them():
    routing = RoutingSettings()
    assert balanced([replica("a", inflight=100), replica("b")], routing, "gone")


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ((0, 0), True),
        ((8, 0), True),  # max - min not beyond balance_abs (8)
        ((9, 0), False),  # beyond it, and beyond balance_rel (1.5) times the least
        ((30, 21), True),  # 9 apart, but 30 is not beyond 1.5 x 21
        ((33, 21), False),
    ],
)
def test_balanced_is_false_only_when_loads_are_far_apart_in_both_measures(loads, expected):
    routing = RoutingSettings()  # balance_abs 8, balance_rel 1.5
    replicas = [replica(f"r{i}", inflight=n) for i, n in enumerate(loads)]
    assert balanced(replicas, routing, "r0") is expected


def test_balanced_counts_the_larger_of_the_report_and_what_is_in_flight():
    routing = RoutingSettings(balance_abs=2, balance_rel=1.0)
    busy = replica("a", load=LoadReport(running=6, waiting=4), inflight=1)  # 10, by its report
    assert not balanced([busy, replica("b", load=LoadReport(running=0), inflight=7)], routing, "a")  # 10 vs 7
    assert balanced([busy, replica("b", load=LoadReport(running=0), inflight=9)], routing, "a")  # 10 vs 9
