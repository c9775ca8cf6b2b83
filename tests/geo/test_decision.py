"""What the router decides on and returns (geo/decision.py): a replica's capacity, busy count and loading
state from the catalog and its load report, a decision's score terms and their total, the
``x-nearshore-route`` explanation, and the refusal that names the residency policy."""

from __future__ import annotations

import pytest

from geo.catalog import HealthSettings, Place, RegionSpec
from geo.decision import NoRoute, Replica, Route, Terms, Where
from geo.health import Health
from geo.latency import Latency
from nearshore.protocol.load import LoadReport

MODEL = "gemma-3-270m"


def replica(name: str, capacity: int = 8, load: LoadReport | None = None, inflight: int = 0) -> Replica:
    spec = RegionSpec(name=name, url="http://127.0.0.1:9000", capacity=capacity)
    return Replica(
        id=name,
        region=name,
        url="http://127.0.0.1:9000",
        spec=spec,
        place=Place(51.5, -0.13, "GB", "EU"),
        health=Health(HealthSettings()),
        latency=Latency(20.0, 1.6, 0.3),
        models=frozenset({MODEL}),
        load=load,
        inflight=inflight,
    )


def test_capacity_is_the_catalogs_unless_the_replica_reports_less():
    assert replica("a", capacity=8).capacity == 8  # no report
    assert replica("a", capacity=8, load=LoadReport(capacity=0)).capacity == 8  # 0: unknown
    assert replica("a", capacity=8, load=LoadReport(capacity=4)).capacity == 4
    assert replica("a", capacity=8, load=LoadReport(capacity=32)).capacity == 8  # never more than the edge's


def test_busy_is_the_larger_of_what_it_reports_and_what_this_edge_has_in_flight():
    assert replica("a").busy == 0
    assert replica("a", inflight=3).busy == 3
    assert replica("a", load=LoadReport(running=2, waiting=5), inflight=3).busy == 7
    assert replica("a", load=LoadReport(running=1), inflight=4).busy == 4


@pytest.mark.parametrize(
    ("state", "loading"), [("ready", False), ("unloaded", False), ("loading", True), ("failed", True)]
)
def test_a_replica_is_loading_while_its_report_says_it_cannot_serve_now(state, loading):
    assert replica("a", load=LoadReport(state=state)).loading is loading
    assert replica("a").loading is False  # no report: assumed ready


def test_the_total_is_the_round_trip_and_client_term_never_below_zero_plus_the_rest_minus_affinity():
    t = Terms(rtt_ms=90.0, client_ms=10.0, queue_ms=5.0, load_ms=2.5, prefill_ms=50.0, affinity_ms=20.0)
    assert t.total_ms == pytest.approx(100.0 + 5.0 + 2.5 + 50.0 - 20.0)
    # A client nearer the replica than the edge is: its negative term may cancel the round trip, no more.
    near = Terms(rtt_ms=30.0, client_ms=-45.0, queue_ms=0.0, load_ms=0.0, prefill_ms=5.0, affinity_ms=0.0)
    assert near.total_ms == pytest.approx(5.0)


def test_a_route_builds_its_terms_from_its_rows_in_order():
    a, b = replica("london"), replica("virginia")
    route = Route([a, b], [(90.0, 0.0, 0.0, 5.0, 5.0, 0.0), (180.0, 1.0, 2.0, 0.0, 5.0, 0.0)])
    assert route.terms == [Terms(90.0, 0.0, 0.0, 5.0, 5.0, 0.0), Terms(180.0, 1.0, 2.0, 0.0, 5.0, 0.0)]
    assert [t.total_ms for t in route.terms] == [pytest.approx(100.0), pytest.approx(188.0)]
    assert (route.policies, route.affinity, route.held, route.explored) == ((), False, False, False)


def test_the_explanation_names_the_choice_its_terms_and_the_scored_runner_up():
    a, b = replica("london"), replica("virginia")
    route = Route([a, b], [(90.0, 0.0, 3.3, 2.5, 5.0, 1.0), (180.0, 12.0, 0.0, 0.0, 5.0, 0.0)])
    assert route.explain() == (
        "london score=99.8ms rtt=90.0 client=0.0 queue=3.3 load=2.5 prefill=5.0 affinity=-1.0; "
        "runner-up virginia score=197.0ms rtt=180.0 client=12.0 queue=0.0 load=0.0 prefill=5.0 affinity=-0.0"
    )


def test_the_explanation_says_when_the_runner_up_was_not_scored_and_which_flags_applied():
    a, b = replica("london"), replica("virginia")
    route = Route(
        [a, b],
        [(90.0, 0.0, 0.0, 0.0, 0.0, 0.0)],
        policies=("eu-only", "acme-pin"),
        affinity=True,
        held=True,
        explored=True,
    )
    parts = route.explain().split("; ")
    assert parts[0].startswith("london score=90.0ms ")
    assert parts[1:] == [
        "runner-up virginia (not scored)",
        "policy=eu-only+acme-pin",
        "affinity",
        "held",
        "explored",
    ]


def test_a_lone_replica_is_explained_without_a_runner_up():
    route = Route([replica("london")], [(90.0, 0.0, 0.0, 0.0, 0.0, 0.0)], held=True)
    assert route.explain() == (
        "london score=90.0ms rtt=90.0 client=0.0 queue=0.0 load=0.0 prefill=0.0 affinity=-0.0; held"
    )


def test_where_defaults_to_an_unlocated_client():
    w = Where(6.45, 3.39)
    assert (w.country, w.continent, w.located) == ("", "", False)
    with pytest.raises(AttributeError):
        w.country = "NG"  # type: ignore[misc]  # frozen: a router's cache key may hold it


def test_no_route_carries_its_message_and_the_policies_that_applied():
    exc = NoRoute("Every region allowed by data-residency policy eu-only is unavailable.", ("eu-only",))
    assert str(exc).startswith("Every region") and exc.policies == ("eu-only",)
    assert NoRoute("No region serves the model 'x'.").policies == ()
    assert isinstance(exc, Exception)  # the edge's route stage catches it as an exception, not a result
