"""Hysteresis and exploration (geo/hold.py): a client group stays on its region until another wins by the
switch margin for ``hold_s``; it moves at once from a region measured far slower than the challenger's
whole score, or to one an exploration just found recovered; and one request per ``explore_after_s`` goes to a
replica whose stale observations alone make it lose."""

from __future__ import annotations

from geo.catalog import HealthSettings, Place, RegionSpec, RoutingSettings
from geo.decision import Replica, Scored
from geo.health import Health
from geo.hold import _MAX_GROUPS, Group, explore, hold
from geo.latency import Latency

ROUTING = RoutingSettings()  # margin max(10 ms, 15%), hold_s 3, explore_after_s 10
KEY = ("gemma-3-270m", "NG", ())


def replica(region: str, n: int = 0, capacity: int = 8) -> Replica:
    rid = region if n == 0 else f"{region}/{n}"
    return Replica(
        id=rid,
        region=region,
        url=f"http://127.0.0.1:{9000 + n}",
        spec=RegionSpec(name=region, url="http://127.0.0.1:9000", capacity=capacity),
        place=Place(0.0, 0.0, "", ""),
        health=Health(HealthSettings()),
        latency=Latency(20.0, 1.6, 0.5, stale_after_s=ROUTING.explore_after_s),
        models=frozenset({"gemma-3-270m"}),
    )


def scored(*entries: tuple[Replica, float] | tuple[Replica, float, float]) -> list[Scored]:
    """In score order, as the router passes them: (replica, total ms[, queue ms])."""
    out: list[Scored] = []
    for entry in entries:
        r, total = entry[0], entry[1]
        queue = entry[2] if len(entry) > 2 else 0.0
        out.append((int(total), total, r, (total - queue, 0.0, queue, 0.0, 0.0, 0.0)))
    return sorted(out, key=lambda s: s[0])


def regions(order: list[Scored]) -> list[str]:
    return [s[2].id for s in order]


def test_a_new_group_takes_the_best_region_and_is_not_held():
    london, virginia = replica("london"), replica("virginia")
    groups: dict = {}
    order = scored((london, 100.0), (virginia, 180.0))
    out, held = hold(groups, ROUTING, KEY, order, now=0.0)
    assert out is order and not held
    assert groups[KEY] == Group("london")


def test_a_challenger_within_the_margin_never_moves_the_group():
    london, virginia = replica("london"), replica("virginia")
    groups = {KEY: Group("london")}
    # margin = max(10, 0.15 x 100) = 15: 90 does not beat 100 by it.
    out, held = hold(groups, ROUTING, KEY, scored((virginia, 90.0), (london, 100.0)), now=0.0)
    assert held and regions(out) == ["london", "virginia"]
    out, held = hold(groups, ROUTING, KEY, scored((virginia, 90.0), (london, 100.0)), now=60.0)
    assert held and regions(out) == ["london", "virginia"] and groups[KEY].challenger == ""


def test_a_challenger_that_keeps_its_lead_for_hold_s_takes_the_group():
    london, virginia = replica("london"), replica("virginia")
    groups = {KEY: Group("london")}
    out, held = hold(groups, ROUTING, KEY, scored((virginia, 80.0), (london, 100.0)), now=10.0)
    assert held and regions(out) == ["london", "virginia"]
    assert groups[KEY] == Group("london", challenger="virginia", since=10.0)
    # While it waits it need keep only half the margin (7.5): 91 + 7.5 < 100.
    out, held = hold(groups, ROUTING, KEY, scored((virginia, 91.0), (london, 100.0)), now=12.0)
    assert held and groups[KEY].since == 10.0
    out, held = hold(groups, ROUTING, KEY, scored((virginia, 85.0), (london, 100.0)), now=13.0)
    assert not held and regions(out) == ["virginia", "london"]
    assert (groups[KEY].region, groups[KEY].challenger) == ("virginia", "")


def test_a_challenger_that_loses_its_lead_while_waiting_starts_again():
    london, virginia = replica("london"), replica("virginia")
    groups = {KEY: Group("london")}
    hold(groups, ROUTING, KEY, scored((virginia, 80.0), (london, 100.0)), now=0.0)
    _, held = hold(groups, ROUTING, KEY, scored((virginia, 95.0), (london, 100.0)), now=1.0)  # 95 + 7.5 > 100
    assert held and groups[KEY].challenger == ""
    hold(groups, ROUTING, KEY, scored((virginia, 80.0), (london, 100.0)), now=2.0)
    _, held = hold(groups, ROUTING, KEY, scored((virginia, 80.0), (london, 100.0)), now=4.0)
    assert held and groups[KEY].since == 2.0  # the wait counts from its new lead, not the first one
    _, held = hold(groups, ROUTING, KEY, scored((virginia, 80.0), (london, 100.0)), now=5.0)
    assert not held and groups[KEY].region == "virginia"


def test_the_held_regions_replicas_go_first_in_their_score_order():
    l0, l1, virginia = replica("london", 0), replica("london", 1), replica("virginia")
    groups = {KEY: Group("london")}
    out, held = hold(groups, ROUTING, KEY, scored((virginia, 95.0), (l1, 100.0), (l0, 104.0)), now=0.0)
    assert held and regions(out) == ["london/1", "london", "virginia"]


def test_a_region_measured_far_slower_than_the_challengers_whole_score_is_left_at_once():
    london, virginia = replica("london"), replica("virginia")
    london.latency.observed.add(400.0, now=0.0)  # real requests waited 400 ms there beyond the network
    groups = {KEY: Group("london")}
    out, held = hold(groups, ROUTING, KEY, scored((virginia, 200.0), (london, 420.0)), now=1.0)
    assert not held and regions(out) == ["virginia", "london"] and groups[KEY] == Group("virginia")


def test_the_scopes_baseline_is_not_counted_against_the_current_region():
    london, virginia = replica("london"), replica("virginia")
    london.latency.observed.add(400.0, now=0.0)
    groups = {KEY: Group("london")}
    # 400 - 300 (what every node takes anyway) is not beyond 200 + 30: an ordinary hold.
    order = scored((virginia, 200.0), (london, 230.0))
    _, held = hold(groups, ROUTING, KEY, order, now=1.0, baseline_ms=300.0)
    assert held and groups[KEY].region == "london"


def test_an_exploration_that_found_the_challenger_recovered_moves_the_group_without_the_margin():
    london, virginia = replica("london"), replica("virginia")
    groups = {KEY: Group("london")}
    virginia.latency.explored_at = 20.0
    virginia.latency.observed.add(0.0, now=20.5)  # the explored request's sample, after it was sent
    out, held = hold(groups, ROUTING, KEY, scored((virginia, 97.0), (london, 100.0)), now=21.0)
    assert not held and groups[KEY] == Group("virginia") and regions(out) == ["virginia", "london"]


def test_an_explored_region_that_a_third_leads_by_the_margin_does_not_take_the_group():
    london, johannesburg, virginia = replica("london"), replica("johannesburg"), replica("virginia")
    groups = {KEY: Group("johannesburg")}
    virginia.latency.explored_at = 20.0
    virginia.latency.observed.add(0.0, now=20.5)
    order = scored((london, 107.0), (johannesburg, 219.0), (virginia, 220.0))
    _, held = hold(groups, ROUTING, KEY, order, now=21.0)
    assert held and groups[KEY].region == "johannesburg" and groups[KEY].challenger == "london"


def test_an_old_exploration_is_no_reason_to_move():
    london, virginia = replica("london"), replica("virginia")
    groups = {KEY: Group("london")}
    virginia.latency.explored_at = 0.0
    virginia.latency.observed.add(0.0, now=0.5)
    _, held = hold(groups, ROUTING, KEY, scored((virginia, 97.0), (london, 100.0)), now=30.0)
    assert held and groups[KEY].region == "london"


def test_a_current_region_no_longer_eligible_gives_the_group_to_the_best():
    london, virginia = replica("london"), replica("virginia")
    groups = {KEY: Group("frankfurt", challenger="london", since=1.0)}
    out, held = hold(groups, ROUTING, KEY, scored((london, 100.0), (virginia, 180.0)), now=2.0)
    assert not held and regions(out) == ["london", "virginia"]
    assert groups[KEY] == Group("london", home="frankfurt")


def test_the_region_a_failure_moved_the_group_from_wins_it_back_by_any_lead_it_keeps():
    london, johannesburg, virginia = replica("london"), replica("johannesburg"), replica("virginia")
    groups = {KEY: Group("london")}
    # London is down (not eligible): Johannesburg takes the group, which remembers London.
    hold(groups, ROUTING, KEY, scored((johannesburg, 130.0), (virginia, 180.0)), now=0.0)
    assert groups[KEY] == Group("johannesburg", home="london")
    # London is back, 12 ms ahead: less than the margin (max(10, 15% of 130) = 19.5), enough for its home.
    _, held = hold(groups, ROUTING, KEY, scored((london, 118.0), (johannesburg, 130.0)), now=20.0)
    assert held and groups[KEY].challenger == "london"
    hold(groups, ROUTING, KEY, scored((johannesburg, 130.0), (london, 131.0)), now=21.0)
    assert groups[KEY].challenger == ""  # it must lead the whole hold_s
    hold(groups, ROUTING, KEY, scored((london, 118.0), (johannesburg, 130.0)), now=22.0)
    _, held = hold(groups, ROUTING, KEY, scored((london, 118.0), (johannesburg, 130.0)), now=24.0)
    assert held and groups[KEY].region == "johannesburg"
    out, held = hold(groups, ROUTING, KEY, scored((london, 118.0), (johannesburg, 130.0)), now=25.0)
    assert not held and regions(out) == ["london", "johannesburg"]
    assert (groups[KEY].region, groups[KEY].home) == ("london", "")  # home: the margin holds as ever
    _, held = hold(groups, ROUTING, KEY, scored((johannesburg, 110.0), (london, 118.0)), now=40.0)
    assert held and groups[KEY].challenger == ""


def test_another_region_than_the_home_still_needs_the_margin():
    johannesburg, virginia = replica("johannesburg"), replica("virginia")
    groups = {KEY: Group("johannesburg", home="london")}
    _, held = hold(groups, ROUTING, KEY, scored((virginia, 120.0), (johannesburg, 130.0)), now=0.0)
    assert held and groups[KEY].challenger == ""
    # Failed again, the group keeps the first home it was moved from.
    hold(groups, ROUTING, KEY, scored((virginia, 180.0)), now=1.0)
    assert groups[KEY] == Group("virginia", home="london")


def test_the_group_table_is_bounded():
    groups = {("m", str(i), ()): Group("london") for i in range(_MAX_GROUPS)}
    hold(groups, ROUTING, KEY, scored((replica("london"), 100.0)), now=0.0)
    assert groups == {KEY: Group("london")}


# --- exploration ------------------------------------------------------------------------------------------


def stale_loser(now_observed: float = 0.0) -> tuple[Replica, Replica]:
    """London serving; Virginia lost its traffic to an observed queue of 250 ms, last seen at 0."""
    london, virginia = replica("london"), replica("virginia")
    virginia.latency.observed.add(250.0, now=now_observed)
    return london, virginia


def test_a_replica_whose_stale_queue_alone_makes_it_lose_is_explored_once_per_interval():
    london, virginia = stale_loser()
    order = scored((london, 100.0), (virginia, 300.0, 250.0))  # 50 without its queue: beats 100 - 15
    assert explore(ROUTING, order, now=20.0) == 1
    assert virginia.latency.explored_at == 20.0
    assert explore(ROUTING, order, now=25.0) == 0  # explored 5 s ago
    assert explore(ROUTING, order, now=30.0) == 1 and virginia.latency.explored_at == 30.0


def test_fresh_or_missing_observations_are_never_explored():
    london, virginia = stale_loser(now_observed=15.0)
    order = scored((london, 100.0), (virginia, 300.0, 250.0))
    assert explore(ROUTING, order, now=20.0) == 0  # observed 5 s ago: what it says holds
    unmeasured = replica("virginia")
    assert explore(ROUTING, scored((london, 100.0), (unmeasured, 300.0, 250.0)), now=20.0) == 0
    assert unmeasured.latency.explored_at == float("-inf") and virginia.latency.explored_at == float("-inf")


def test_a_replica_that_would_not_win_by_the_margin_even_without_its_queue_is_not_explored():
    london, virginia = stale_loser()
    # 90 without its queue is not below 100 - 15: it would come straight back.
    assert explore(ROUTING, scored((london, 100.0), (virginia, 340.0, 250.0)), now=20.0) == 0


def test_a_replica_whose_own_load_report_explains_its_queue_is_not_explored():
    london, virginia = stale_loser()
    virginia.inflight = 16  # capacity 8: (16 + 1 - 8) / 8 service times queued by what this edge sent
    assert explore(ROUTING, scored((london, 100.0), (virginia, 300.0, 250.0)), now=20.0) == 0


def test_the_first_candidate_in_score_order_is_the_one_explored():
    london, virginia = stale_loser()
    johannesburg = replica("johannesburg")
    johannesburg.latency.observed.add(250.0, now=0.0)
    order = scored((london, 100.0), (virginia, 300.0, 250.0), (johannesburg, 310.0, 250.0))
    assert explore(ROUTING, order, now=20.0) == 1
    assert explore(ROUTING, order, now=20.0) == 2  # Virginia was just sent one
