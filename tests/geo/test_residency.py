"""Data residency (geo/residency.py): the regions a request may be served in, by the client's country or
continent and the key's tenant; uncovered requests go anywhere, and several policies allow only where all of
them do, each named."""

from __future__ import annotations

from geo.catalog import ResidencyPolicy
from geo.residency import Allowed, Residency

EU = ResidencyPolicy(name="eu-only", regions=["london", "frankfurt"], continents=["EU"])
GERMANY = ResidencyPolicy(name="de-only", regions=["frankfurt"], countries=["DE"])
ACME = ResidencyPolicy(name="acme-pin", regions=["virginia"], tenants=["acme"])
NIGERIA = ResidencyPolicy(name="ng-local", regions=["lagos", "london"], countries=["NG"], tenants=["gov-ng"])


def test_with_no_policy_every_request_goes_anywhere():
    assert Residency([]).allowed("DE", "EU", "acme") == Allowed(None, ())


def test_a_request_no_policy_covers_goes_anywhere():
    allowed = Residency([EU, GERMANY, ACME]).allowed("NG", "AF", "someone")
    assert allowed.regions is None and allowed.policies == ()


def test_a_policy_covers_by_country_by_continent_or_by_tenant():
    residency = Residency([EU, GERMANY, ACME])
    assert residency.allowed("FR", "EU", "t") == Allowed(frozenset({"london", "frankfurt"}), ("eu-only",))
    assert residency.allowed("US", "NA", "acme") == Allowed(frozenset({"virginia"}), ("acme-pin",))
    # A policy matches on any of its three lists: Nigeria's covers its tenant wherever the client is.
    ng = Residency([NIGERIA])
    assert ng.allowed("NG", "AF", "t").policies == ("ng-local",)
    assert ng.allowed("US", "NA", "gov-ng").regions == frozenset({"lagos", "london"})


def test_several_policies_allow_only_where_all_of_them_do_and_are_all_named_in_order():
    allowed = Residency([EU, GERMANY]).allowed("DE", "EU", "t")
    assert allowed.regions == frozenset({"frankfurt"}) and allowed.policies == ("eu-only", "de-only")


def test_policies_that_agree_on_nothing_allow_no_region_rather_than_any():
    allowed = Residency([EU, ACME]).allowed("DE", "EU", "acme")
    # An empty set, not None: the router refuses and names both, never a silent detour.
    assert allowed.regions == frozenset() and allowed.regions is not None
    assert allowed.policies == ("eu-only", "acme-pin")


def test_an_unlocated_client_is_covered_only_by_its_tenant():
    residency = Residency([EU, GERMANY, ACME])
    assert residency.allowed("", "", "t") == Allowed(None, ())
    assert residency.allowed("", "", "acme").policies == ("acme-pin",)


def test_matching_is_exact_on_the_codes():
    # Codes are upper case in the config (validated there) and from GeoIP; a lower-case one matches nothing.
    assert Residency([GERMANY]).allowed("de", "eu", "t").regions is None
