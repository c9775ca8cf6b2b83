"""The router's local tier (regions with ``local = true``: this side of the ocean), with no I/O: standby last
in the failover order, the route when every remote replica is out (marked ``cut``), ranked with the others
when shared, and traffic back on the remote regions as soon as the probes bring them back."""

from __future__ import annotations

import pytest

from geo.catalog import GeoConfig, HealthSettings, RegionSpec, RoutingSettings, check_catalog
from geo.route import NoRoute, Router, Where

SMALL, LARGE = "smollm2-135m", "gemma-3-270m"
LAGOS = Where(6.45, 3.39, "NG", "AF", located=True)


def router(local: bool = True, hold_s: float = 3.0) -> Router:
    specs = [
        RegionSpec(name="london", url="http://127.0.0.1:9001", models=[LARGE]),
        RegionSpec(name="frankfurt", url="http://127.0.0.1:9002", models=[SMALL], pool="small"),
        RegionSpec(name="lagos", url="http://127.0.0.1:9003", models=[SMALL], pool="small", local=local),
    ]
    config = GeoConfig(
        health=HealthSettings(unhealthy_threshold=1, healthy_threshold=2),
        routing=RoutingSettings(hold_s=hold_s),
    )
    assert check_catalog(specs, config, [SMALL, LARGE]) == []
    r = Router.build(specs, config, [SMALL, LARGE])
    for replica, rtt in zip(r.replicas, (100.0, 110.0, 2.0), strict=True):
        r.probe_passed(replica, rtt, None)
    return r


def ranked(r: Router, model: str = SMALL, now: float = 0.0, share: bool = False) -> list[str]:
    return [x.id for x in r.route(model, LAGOS, "t", 10, (), now, share).ranked]


def cut(r: Router, *names: str) -> None:
    for replica in r.replicas:
        if replica.id in names:
            r.probe_failed(replica, "connection refused")


def test_a_standby_local_region_is_last_in_the_failover_order_while_a_remote_one_is_up():
    r = router()
    route = r.route(SMALL, LAGOS, "t", 10, (), 0.0)
    assert [x.id for x in route.ranked] == ["frankfurt", "lagos"] and not route.cut
    assert not r.cut_off(SMALL, LAGOS, "t", 0.0)


def test_with_every_remote_replica_down_the_local_ones_are_the_route_marked_cut():
    r = router()
    cut(r, "london", "frankfurt")
    route = r.route(SMALL, LAGOS, "t", 10, (), 0.0)
    assert [x.id for x in route.ranked] == ["lagos"] and route.cut and "cut" in route.explain()
    assert r.cut_off(SMALL, LAGOS, "t", 0.0) and r.cut_off(LARGE, LAGOS, "t", 0.0)
    with pytest.raises(NoRoute) as raised:  # no local region serves the large model
        r.route(LARGE, LAGOS, "t", 10, (), 0.0)
    assert raised.value.cut and "london: down (connection refused)" in str(raised.value)


def test_without_a_local_region_a_region_down_is_no_cut():
    r = router(local=False)
    cut(r, "london")
    with pytest.raises(NoRoute) as raised:
        r.route(LARGE, LAGOS, "t", 10, (), 0.0)
    assert not raised.value.cut and not r.cut_off(LARGE, LAGOS, "t", 0.0)


def test_shared_the_local_region_takes_its_pools_traffic_and_says_cut_only_when_the_remote_is_out():
    r = router()
    route = r.route(SMALL, LAGOS, "t", 10, (), 0.0, share_local=True)
    assert [x.id for x in route.ranked] == ["lagos", "frankfurt"] and not route.cut  # the nearest
    assert ranked(r) == ["frankfurt", "lagos"]  # standby requests keep their own group
    cut(r, "frankfurt")
    assert r.route(SMALL, LAGOS, "t", 10, (), 1.0, share_local=True).cut


def test_traffic_returns_to_the_remote_region_as_soon_as_its_probes_bring_it_back():
    r = router(hold_s=3.0)
    cut(r, "frankfurt")
    assert ranked(r, now=0.0) == ["lagos"]
    assert ranked(r, now=1.0) == ["lagos"]  # the group is on the local region now
    frankfurt = r.replicas[1]
    assert not r.probe_passed(frankfurt, 110.0, None)
    assert ranked(r, now=2.0) == ["lagos"]  # one pass is not enough (healthy_threshold = 2)
    assert r.probe_passed(frankfurt, 110.0, None)
    # Back: the next request goes there, no hold (the local region was never a challenger to wait out).
    route = r.route(SMALL, LAGOS, "t", 10, (), 2.1)
    assert [x.id for x in route.ranked] == ["frankfurt", "lagos"] and not route.cut and not route.held
