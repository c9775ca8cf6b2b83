"""The router's decision, with no I/O: filter, score, hysteresis, affinity, residency, health."""

from __future__ import annotations

import pytest

from geo.affinity import prefix_chain
from geo.catalog import GeoConfig, HealthSettings, RegionSpec, ResidencyPolicy, RoutingSettings, check_catalog
from geo.route import NoRoute, Router, Where
from nearshore.protocol.load import LoadReport

MODEL = "gemma-3-270m"
LAGOS = Where(6.45, 3.39, "NG", "AF", located=True)
VIRGINIA = Where(39.04, -77.47, "US", "NA", located=True)
BERLIN = Where(52.52, 13.40, "DE", "EU", located=True)


def catalog(*names: str, replicas: int = 1, capacity: int = 8) -> list[RegionSpec]:
    specs = []
    for i, name in enumerate(names):
        urls = [f"http://127.0.0.1:{9000 + 10 * i + n}" for n in range(replicas)]
        specs.append(RegionSpec(name=name, city=name, replicas=urls, capacity=capacity))
    return specs


def router(*names: str, **kw) -> Router:
    config = GeoConfig(
        residency=kw.pop("residency", []),
        health=kw.pop("health", HealthSettings()),
        routing=kw.pop("routing", RoutingSettings()),
    )
    specs = catalog(*names, **kw)
    assert check_catalog(specs, config, [MODEL]) == []
    return Router.build(specs, config, [MODEL])


def pick(r: Router, where: Where = LAGOS, now: float = 0.0, tenant: str = "t", prefix=(), tokens=10) -> str:
    return r.route(MODEL, where, tenant, tokens, prefix, now).ranked[0].id


def replica(r: Router, id: str):
    return next(x for x in r.replicas if x.id == id)


def measured(r: Router, **rtts: float) -> Router:
    for name, rtt in rtts.items():
        r.probe_passed(replica(r, name), rtt, None)
    return r


def test_until_measured_the_fibre_floor_decides_then_the_measured_round_trip():
    # By the great circle Johannesburg (4,500 km) is nearer Lagos than London (5,000 km) ...
    assert pick(router("london", "virginia", "johannesburg")) == "johannesburg"
    # ... but the cables go through Europe: measured, London wins.
    r = measured(
        router("london", "virginia", "johannesburg"), london=90.0, virginia=180.0, johannesburg=250.0
    )
    assert pick(r, LAGOS) == "london"


def test_a_client_located_elsewhere_goes_to_the_region_on_its_side():
    r = measured(router("london", "virginia"), london=90.0, virginia=180.0)
    assert pick(r, VIRGINIA) == "virginia"
    assert pick(r, LAGOS) == "london"


def test_the_failover_order_ranks_every_eligible_replica_and_explains_itself():
    r = measured(
        router("london", "virginia", "johannesburg"), london=90.0, virginia=180.0, johannesburg=250.0
    )
    route = r.route(MODEL, LAGOS, "t", 10, (), 0.0)
    assert [x.id for x in route.ranked] == ["london", "virginia", "johannesburg"]
    assert [t.total_ms for t in route.terms] == sorted(t.total_ms for t in route.terms)
    explained = route.explain()
    assert (
        explained.startswith("london score=")
        and "runner-up virginia" in explained
        and "rtt=90.0" in explained
    )


def test_residency_keeps_eu_clients_in_the_eu_and_names_the_policy_when_the_eu_is_down():
    eu = ResidencyPolicy(name="eu-only", regions=["london", "frankfurt"], continents=["EU"])
    r = router(
        "virginia", "london", "frankfurt", residency=[eu], health=HealthSettings(unhealthy_threshold=1)
    )
    measured(r, virginia=95.0, london=120.0, frankfurt=130.0)  # the European cables are cut
    assert pick(r, LAGOS) == "virginia"  # no policy covers Nigeria
    route = r.route(MODEL, BERLIN, "t", 10, (), 0.0)
    assert {x.region for x in route.ranked} == {"london", "frankfurt"} and route.policies == ("eu-only",)
    r.probe_failed(replica(r, "london"), "connection refused")
    r.probe_failed(replica(r, "frankfurt"), "connection refused")
    with pytest.raises(NoRoute, match="eu-only") as caught:
        r.route(MODEL, BERLIN, "t", 10, (), 0.0)
    assert "london: down (connection refused)" in str(caught.value)
    assert caught.value.policies == ("eu-only",)
    assert pick(r, LAGOS) == "virginia"  # never a silent detour, but others are unaffected


def test_a_tenant_pinned_to_one_region_is_served_only_there():
    pin = ResidencyPolicy(name="acme-pin", regions=["virginia"], tenants=["acme"])
    r = measured(router("london", "virginia", residency=[pin]), london=90.0, virginia=180.0)
    assert [x.id for x in r.route(MODEL, LAGOS, "acme", 10, (), 0.0).ranked] == ["virginia"]
    assert pick(r, LAGOS, tenant="other") == "london"


def test_consecutive_failures_eject_a_replica_for_a_growing_time_and_it_returns():
    settings = HealthSettings(consecutive_failures=2, base_ejection_s=10, max_ejected_percent=50)
    r = measured(router("london", "virginia", health=settings), london=90.0, virginia=180.0)
    london = replica(r, "london")
    assert not r.failed(london, "connect", model=MODEL, now=0.0)
    assert r.failed(london, "connect", model=MODEL, now=0.0)
    assert pick(r, now=1.0) == "virginia"
    assert pick(r, now=10.5) == "virginia"  # routable again after base_ejection_s: the challenger ...
    assert pick(r, now=13.6) == "london"  # ... takes the traffic back once it has held its lead (hold_s)
    r.failed(london, "connect", model=MODEL, now=14.0)
    r.failed(london, "connect", model=MODEL, now=14.0)
    assert london.health.ejected_until(MODEL) == pytest.approx(
        34.0
    )  # the second ejection lasts twice as long
    virginia = replica(r, "virginia")  # never more than half the replicas out
    r.failed(virginia, "connect", model=MODEL, now=15.0)
    assert not r.failed(virginia, "connect", model=MODEL, now=15.0)
    assert pick(r, now=15.0) == "virginia"


def test_probes_take_a_replica_out_after_the_threshold_and_back_after_passes():
    settings = HealthSettings(unhealthy_threshold=2, healthy_threshold=2)
    r = measured(router("london", "virginia", health=settings), london=90.0, virginia=180.0)
    london = replica(r, "london")
    assert not r.probe_failed(london, "timeout")
    assert pick(r) == "london"
    assert r.probe_failed(london, "timeout")
    assert pick(r) == "virginia"
    assert not r.probe_passed(london, 90.0, None)
    assert r.probe_passed(london, 90.0, None)
    assert pick(r, now=0.0) == "virginia"  # back, and challenging ...
    assert pick(r, now=3.1) == "london"  # ... it takes the traffic back after hold_s


def test_a_loading_replica_is_skipped_while_another_can_serve():
    r = measured(router("london", "virginia", health=HealthSettings(unhealthy_threshold=1)), london=90.0)
    london = replica(r, "london")
    r.probe_passed(london, 90.0, LoadReport(state="loading"))
    assert pick(r) == "virginia"
    r.probe_failed(replica(r, "virginia"), "refused")
    assert pick(r) == "london"  # the only one left: better late than a refusal
    r.probe_passed(london, 90.0, LoadReport(state="ready"))
    assert pick(r) == "london"


def test_every_replica_down_or_none_serving_the_model_is_a_no_route_at_once():
    r = router("london", health=HealthSettings(unhealthy_threshold=1))
    with pytest.raises(NoRoute, match="serves the model"):
        r.route("other-model", LAGOS, "t", 10, (), 0.0)
    r.probe_failed(replica(r, "london"), "connection refused")
    with pytest.raises(NoRoute, match="unavailable"):
        r.route(MODEL, LAGOS, "t", 10, (), 0.0)


def test_hysteresis_moves_traffic_only_after_a_margin_held_for_hold_s():
    r = router("london", "virginia", routing=RoutingSettings(hold_s=3.0, switch_margin_ms=10))
    london = replica(r, "london")
    measured(r, london=90.0, virginia=180.0)
    assert pick(r, now=0.0) == "london"
    london.latency.rtt.value = 175.0  # a spike: Virginia is better, by less than the margin
    assert pick(r, now=1.0) == "london"
    london.latency.rtt.value = 400.0  # now by far
    assert pick(r, now=2.0) == "london"  # the challenger is noted
    assert r.route(MODEL, LAGOS, "t", 10, (), 4.0).held
    assert pick(r, now=5.1) == "virginia"  # it held for 3 s: traffic moves
    london.latency.rtt.value = 90.0
    assert pick(r, now=6.0) == "virginia"
    assert pick(r, now=9.2) == "london"  # and back, once London has held its lead


def test_requests_beyond_a_replicas_slots_go_to_one_with_free_slots():
    r = router("london", replicas=2, capacity=2)
    a, b = r.replicas
    a.inflight = 2
    assert pick(r) == b.id
    a.inflight, b.inflight = 0, 2
    assert pick(r) == a.id
    a.load = LoadReport(running=4, waiting=3, capacity=4)  # other edges' work counts too
    b.inflight = 1
    assert pick(r) == b.id


def test_a_long_shared_prefix_sticks_to_one_replica_until_it_is_overloaded():
    routing = RoutingSettings(
        affinity_min_chars=512, affinity_block_chars=128, balance_abs=2, balance_rel=1.5
    )
    r = router("london", replicas=3, capacity=16, routing=routing)
    document = "The contract between the parties states the following terms. " * 40

    def ask(question: str) -> str:
        return pick(r, prefix=prefix_chain(document + question, 128, 512), tokens=600)

    first = ask("Question one?")
    owner = replica(r, first)
    for i in range(2):  # other questions on the same document stick, though others are idle
        owner.inflight += 1
        assert ask(f"Question {i}?") == first
    owner.inflight = 10  # far above the others: least-loaded wins, and the prefix follows
    moved = ask("Question seven?")
    assert moved != first
    owner.inflight = 0
    assert ask("Question eight?") == moved
    # A short prompt has no affinity at all.
    assert prefix_chain("hello", 128, 512) == ()


def test_the_catalog_checks_name_their_keys():
    config = GeoConfig(residency=[ResidencyPolicy(name="eu", regions=["paris"], continents=["EU"])])
    specs = [
        RegionSpec(name="london", city="london", url="http://a:1"),
        RegionSpec(name="london", city="atlantis", url="http://b:1"),
        RegionSpec(name="empty", city="london"),
        RegionSpec(name="odd", city="london", url="http://c:1", models=["gpt-9"]),
    ]
    problems = "\n".join(check_catalog(specs, config, [MODEL]))
    assert "regions[1] (london): the name 'london' is used twice" in problems
    assert "regions[1] (london): unknown city 'atlantis'" in problems
    assert "regions[2] (empty): no replica" in problems
    assert "regions[3] (odd).models: gpt-9 not in the edge's models" in problems
    assert "geo.residency[0] (eu).regions: unknown region 'paris'" in problems


# --- what real requests show: observed first-token times ------------------------------------------------


def serve(r: Router, now: float, ttft_ms: dict[str, float], tokens: int = 10) -> str:
    """One request: routed, then answered by the chosen replica in its ``ttft_ms`` (its load idle)."""
    chosen = r.route(MODEL, LAGOS, "t", tokens, (), now).ranked[0]
    r.answered(chosen, ttft_ms[chosen.id], LoadReport(capacity=8), prompt_tokens=tokens, now=now)
    return chosen.id


def test_a_replica_idle_by_its_reports_but_slow_in_practice_loses_its_traffic_at_once():
    r = measured(router("london", "frankfurt"), london=80.0, frankfurt=150.0)
    for name in ("london", "frankfurt"):  # both answer /health at once and report nothing running
        r.probe_passed(replica(r, name), None, LoadReport(running=0, capacity=8))
    slow = {"london": 3000.0, "frankfurt": 160.0}
    picks = [serve(r, 0.5 * i, slow) for i in range(30)]  # 15 s of traffic
    # London had the first request; one sample, and it lost the rest but for one exploration at 10 s.
    assert picks[0] == "london" and picks[1:4] == ["frankfurt"] * 3
    assert picks.count("london") == 2 and picks[20] == "london"
    route = r.route(MODEL, LAGOS, "t", 10, (), 15.0)
    assert route.ranked[0].id == "frankfurt" and not route.held
    assert route.terms[1].queue_ms > 2500  # London's observed excess is its queue term


def test_one_tenants_slow_request_does_not_move_every_users_traffic():
    # London serves Lagos's traffic, Frankfurt is farther. A tenant's one request comes 3 s late for its own
    # reasons (a prompt whose prefill the estimate underrates, many choices): alone it is not London's
    # speed, and the other tenants' requests stay there. London slow for two tenants is slow: they move.
    r = measured(router("london", "frankfurt"), london=80.0, frankfurt=150.0)
    for name in ("london", "frankfurt"):
        r.probe_passed(replica(r, name), None, LoadReport(running=0, capacity=8))
    london = replica(r, "london")

    def asked(now: float, tenant: str, ttft_ms: float) -> str:
        chosen = r.route(MODEL, LAGOS, tenant, 10, (), now).ranked[0]
        r.answered(chosen, ttft_ms, None, prompt_tokens=10, now=now, source=tenant)
        return chosen.id

    assert [asked(0.1 * i, "b", 85.0) for i in range(5)] == ["london"] * 5
    assert asked(0.6, "a", 3000.0) == "london"
    assert [asked(0.7 + 0.1 * i, t, 85.0) for i, t in enumerate("bcbc")] == ["london"] * 4
    assert london.latency.observed.value < 50.0
    # Now London is slow for everyone: the second tenant to see it moves the traffic.
    assert asked(1.2, "a", 3000.0) == "london" and asked(1.3, "b", 3000.0) == "london"
    assert asked(1.4, "c", 85.0) == "frankfurt"


def test_a_replica_measured_slow_wins_its_traffic_back_once_it_is_fast_again():
    r = measured(router("london", "frankfurt"), london=80.0, frankfurt=150.0)
    times = {"london": 3000.0, "frankfurt": 160.0}
    assert serve(r, 0.0, times) == "london"
    assert [serve(r, 0.5 * i, times) for i in range(1, 19)] == ["frankfurt"] * 18  # until 9 s
    times["london"] = 85.0  # it recovered
    route = r.route(MODEL, LAGOS, "t", 10, (), 10.0)  # its observation is stale: one request measures it
    assert route.explored and route.ranked[0].id == "london" and "explored" in route.explain()
    r.answered(route.ranked[0], 85.0, None, prompt_tokens=10, now=10.0)
    picks = [serve(r, 10.0 + 0.5 * i, times) for i in range(1, 12)]
    # The fresh sample replaced the stale estimate: London is the better by far, and once it has held its
    # lead for hold_s (3 s) the traffic is back.
    assert picks[-1] == "london" and picks.index("london") <= 8
    assert replica(r, "london").latency.observed.value < 10


def test_a_replica_about_as_good_as_the_best_is_not_explored_for_nothing():
    # London's 5 ms lead is inside the switch margin: measuring it again would only send one request away
    # and back; it is explored once the best gets worse than it by the margin.
    r = measured(router("london", "frankfurt"), london=80.0, frankfurt=85.0)
    times = {"london": 3000.0, "frankfurt": 90.0}
    picks = [serve(r, 0.25 * i, times) for i in range(80)]
    assert picks.count("london") == 1
    times["frankfurt"] = 900.0  # now the best is slow
    later = [serve(r, 20.0 + 0.25 * i, times) for i in range(20)]
    assert "london" in later


def test_a_replica_still_slow_when_explored_keeps_losing_and_is_tried_rarely():
    r = measured(router("london", "frankfurt"), london=80.0, frankfurt=150.0)
    times = {"london": 3000.0, "frankfurt": 160.0}
    picks = [serve(r, 0.25 * i, times) for i in range(200)]  # 50 s at 4 requests a second
    assert picks.count("london") == 5  # the first, then one exploration every explore_after_s (10 s)


def test_reported_load_still_breaks_ties_between_equally_measured_replicas():
    r = router("london", replicas=2, capacity=8)
    a, b = r.replicas
    measured(r, **{a.id: 90.0, b.id: 90.0})
    for x in (a, b):
        r.answered(x, 100.0, LoadReport(capacity=8), prompt_tokens=10, now=0.0)
    r.probe_passed(a, None, LoadReport(running=6, capacity=8))
    assert pick(r, now=0.1) == b.id
    r.probe_passed(a, None, LoadReport(running=0, capacity=8))
    r.probe_passed(b, None, LoadReport(running=6, capacity=8))
    assert pick(r, now=0.2) == a.id


def test_a_reported_queue_larger_than_the_observed_one_counts():
    r = router("london", "frankfurt", capacity=4)
    measured(r, london=80.0, frankfurt=85.0)
    london = replica(r, "london")
    r.answered(london, 90.0, None, prompt_tokens=10, now=0.0)  # fast when last asked ...
    r.probe_passed(london, None, LoadReport(running=4, waiting=8, capacity=4))  # ... but now it queues
    route = r.route(MODEL, LAGOS, "t", 10, (), 0.1)
    assert route.ranked[0].id == "frankfurt" and route.terms[1].queue_ms > 1000


def test_a_long_prompt_is_not_taken_for_a_slow_replica():
    r = measured(router("london", "frankfurt"), london=80.0, frankfurt=110.0)
    london = replica(r, "london")
    # 4,000 prompt tokens at the configured 2,000 tokens/s: 2 s of prefill are expected, not a queue.
    r.answered(london, 80.0 + 2000.0 + 15.0, None, prompt_tokens=4000, now=0.0)
    assert london.latency.observed.value == pytest.approx(15.0)
    assert pick(r, now=0.1) == "london"
    # A long prompt's sample also weighs less than a short one's: its prefill estimate is the noisy part.
    r.answered(london, 80.0 + 2000.0 + 515.0, None, prompt_tokens=4000, now=0.2)
    assert london.latency.observed.value < 15.0 + 0.3 * 500 / 2


def test_a_long_prompts_first_token_at_a_slow_prefilling_replica_is_not_taken_for_a_queue():
    r = measured(router("london", "johannesburg"), london=90.0, johannesburg=130.0)
    london = replica(r, "london")
    # 1,530 tokens, the first 256 at the configured 2,000 a second and the rest at London's reported 2.857 ms:
    # 3.8 s to the first token is its prefill, not a queue.
    prefill_ms = 256 * 0.5 + (1530 - 256) * 2.857
    r.answered(london, 90.0 + prefill_ms + 10.0, LoadReport(prefill_ms_per_token=2.857), 1530, now=0.0)
    assert london.latency.observed.value == pytest.approx(10.0, abs=0.5)
    assert pick(r, now=0.1) == "london"
    # A short prompt's few tokens count at the configured speed at every replica, whatever its report says:
    # two alike nodes' fits differ by tens of percent, which for a chat would be all the difference.
    johannesburg = replica(r, "johannesburg")
    r.answered(johannesburg, 130.0 + 20 * 0.5 + 10.0, LoadReport(prefill_ms_per_token=2.0), 20, now=0.2)
    assert johannesburg.latency.observed.value == pytest.approx(10.0)
    # Without a measured cost (0: a node that has not fitted its steps yet), the configured speed throughout.
    r.answered(london, 90.0 + 1530 * 0.5 + 10.0, LoadReport(), 1530, now=0.3)
    assert london.latency.observed.value == pytest.approx(10.0, abs=0.5)


def test_a_whole_non_streamed_answer_only_bounds_the_first_token():
    r = measured(router("london", "frankfurt"), london=80.0, frankfurt=85.0)
    london = replica(r, "london")
    r.answered(london, 2500.0, None, prompt_tokens=10, upper_bound=True, now=0.0)  # a long completion
    assert london.latency.observed.samples == 0 and pick(r, now=0.1) == "london"
    r.answered(london, 600.0, None, prompt_tokens=10, now=0.2)  # a slow stream ...
    r.answered(london, 100.0, None, prompt_tokens=10, upper_bound=True, now=0.3)  # ... a quick whole answer
    assert london.latency.observed.value < 515.0


def test_unary_answers_teach_the_router_as_streams_do():
    # London answers /health at once and reports an idle batch, but takes 3 s for a 6-token answer that
    # Frankfurt gives in 0.2 s: beyond its round trip and the tokens' decode, the rest was a queue.
    r = measured(router("london", "frankfurt"), london=80.0, frankfurt=110.0)
    london, frankfurt = replica(r, "london"), replica(r, "frankfurt")
    for x in (london, frankfurt):
        r.probe_passed(x, None, LoadReport(running=0, capacity=8))
    assert pick(r, now=0.0) == "london"
    r.answered(london, 3000.0, None, prompt_tokens=10, upper_bound=True, now=0.0)
    r.finished(london, 3000.0, tokens=6, prompt_tokens=10, now=0.0)
    assert london.latency.observed.value > 2000.0
    assert pick(r, now=0.1) == "frankfurt"
    # A stream teaches the decode speed a unary answer's tokens are explained by: 200 tokens at 40 ms.
    r.finished(frankfurt, 110.0 + 8000.0, tokens=201, first_token_ms=110.0)
    assert frankfurt.latency.decode.value == pytest.approx(40.0)
    r.finished(frankfurt, 110.0 + 100 * 40.0, tokens=100, prompt_tokens=10, now=0.2)  # a long unary answer
    assert frankfurt.latency.observed.value < 100.0  # its decode explains it: no queue
    assert pick(r, now=0.3) == "frankfurt"


def test_a_nodes_own_service_time_does_not_send_its_traffic_to_a_replica_not_measured_yet():
    # Lagos' regions on one CPU: London 100 ms away, Johannesburg 120; each node takes ~250 ms of its own
    # (queue, first step) beyond the network. Measured London must not lose to unmeasured Johannesburg on
    # that alone, nor flap between them once both are measured with the same service time.
    r = measured(router("london", "johannesburg"), london=100.0, johannesburg=120.0)
    times = {"london": 350.0, "johannesburg": 380.0}
    picks = [serve(r, 0.25 * i, times) for i in range(120)]  # 30 s at 4 requests a second
    assert picks.count("london") >= 110, picks.count("london")


def test_among_three_a_replica_that_recovered_is_explored_and_wins_its_traffic_back():
    # The scan's bound must not hide a replica whose only fault is an old observation.
    r = router("london", "virginia", "johannesburg")
    measured(r, london=100.0, virginia=176.0, johannesburg=120.0)
    slow = {"london": 3000.0, "virginia": 430.0, "johannesburg": 370.0}
    first = [serve(r, 0.25 * i, slow) for i in range(8)]
    assert first[0] == "london" and set(first[1:]) == {"johannesburg"}
    fast = {"london": 350.0, "virginia": 430.0, "johannesburg": 370.0}  # London's spike is over
    later = [serve(r, 2.0 + 0.25 * i, fast) for i in range(80)]  # 20 s more
    assert "london" in later[:48]  # explored within explore_after_s (10 s) of its last sample
    assert later[-20:] == ["london"] * 20  # and back for good


def london_explored_after_losing_its_traffic():
    """London found slow once loses its traffic to Frankfurt; at 10 s a request explores it again."""
    r = measured(router("london", "frankfurt"), london=100.0, frankfurt=120.0)
    times = {"london": 3000.0, "frankfurt": 125.0}
    assert serve(r, 0.0, times) == "london"
    assert [serve(r, 0.5 * i, times) for i in range(1, 19)] == ["frankfurt"] * 18
    route = r.route(MODEL, LAGOS, "t", 10, (), 10.0)
    assert route.explored and route.ranked[0].id == "london"
    return r, route, times


def test_an_exploration_that_found_it_recovered_moves_the_group_while_that_request_still_streams():
    # The explored request is still in flight when the next one is routed: its load term must not keep the
    # group away (it did, for one hold, and traffic went there, back and there again).
    r, route, times = london_explored_after_losing_its_traffic()
    london = replica(r, "london")
    r.answered(route.ranked[0], 105.0, None, prompt_tokens=10, now=10.2)  # its first token: recovered
    london.inflight += 1  # ... and it streams on
    times["london"] = 105.0
    picks = [serve(r, 10.5 + 0.5 * i, times) for i in range(8)]
    assert picks == ["london"] * 8, picks


def test_an_exploration_that_found_it_about_as_good_brings_the_group_back_at_once():
    # The explored sample puts London within the switch margin of Frankfurt, a hair behind: one sample
    # cannot say it is worse, so the group comes back now rather than going there, away and back (the
    # degraded-link scenario's 2 flaps in CI); the hold then keeps it there.
    r, route, times = london_explored_after_losing_its_traffic()
    r.answered(route.ranked[0], 132.0, None, prompt_tokens=10, now=10.2)  # 7 ms behind Frankfurt's 125
    times["london"] = 132.0
    picks = [serve(r, 10.5 + 0.5 * i, times) for i in range(8)]
    assert picks == ["london"] * 8, picks


def test_two_entries_naming_one_url_are_one_server_and_circuits_are_per_model():
    specs = [
        RegionSpec(name="london", city="london", url="http://127.0.0.1:9000", models=[MODEL, "other"]),
        RegionSpec(name="paris", city="paris", url="http://127.0.0.1:9000", models=[MODEL, "other"]),
        RegionSpec(name="virginia", city="virginia", url="http://127.0.0.1:9100", models=[MODEL, "other"]),
    ]
    config = GeoConfig(health=HealthSettings(consecutive_failures=2, max_ejected_percent=100))
    r = Router.build(specs, config, [MODEL, "other"])
    london, paris = replica(r, "london"), replica(r, "paris")
    assert london.health is paris.health
    r.failed(london, "503", now=0.0, model=MODEL, refused=True)
    r.answered(london, 90.0, None, model="other", now=0.1)  # the other model's answer resets nothing
    assert r.failed(paris, "503", now=0.2, model=MODEL, refused=True)  # the second in a row, one server
    ranked = r.route(MODEL, LAGOS, "t", 10, (), 0.5).ranked
    assert [x.id for x in ranked] == ["virginia"]  # both entries out for the failing model ...
    assert {x.id for x in r.route("other", LAGOS, "t", 10, (), 0.5).ranked} == {"london", "paris", "virginia"}
