"""The circuit a replica's failures open: ejection, half-open after it, and closing on a success."""

from __future__ import annotations

from geo.catalog import HealthSettings
from geo.health import Health


def settings() -> HealthSettings:
    return HealthSettings(consecutive_failures=3, base_ejection_s=10.0, max_ejection_s=300.0)


def test_failures_in_a_row_open_the_circuit_and_a_success_between_them_does_not():
    health = Health(settings())
    assert not health.request_failed("503", 0.0, True)
    assert not health.request_failed("503", 0.1, True)
    health.request_succeeded()
    assert not health.request_failed("503", 0.2, True) and not health.request_failed("503", 0.3, True)
    assert health.request_failed("503", 0.4, True)  # the third in a row
    assert not health.routable(5.0) and "ejected" in health.why_not(5.0)


def test_after_the_ejection_the_first_failure_opens_it_again_for_longer():
    health = Health(settings())
    for t in (0.0, 0.1, 0.2):
        health.request_failed("503", t, True)
    assert health.routable(10.3) and health.half_open  # the ejection ended: half-open
    assert health.request_failed("503", 10.4, True)  # one failure is enough now
    assert not health.routable(25.0) and health.routable(30.5)  # 20 s: the second ejection


def test_a_success_while_half_open_closes_the_circuit_and_the_next_outage_starts_afresh():
    health = Health(settings())
    for t in (0.0, 0.1, 0.2):
        health.request_failed("503", t, True)
    health.request_succeeded()
    assert not health.half_open and health.ejections == 0
    assert not health.request_failed("503", 11.0, True)  # closed: three in a row again
    for t in (11.1, 11.2):
        health.request_failed("503", t, True)
    assert not health.routable(15.0) and health.routable(21.3)  # base ejection again, not doubled


def test_no_ejection_when_too_many_replicas_are_out():
    health = Health(settings())
    for t in (0.0, 0.1, 0.2, 0.3):
        assert not health.request_failed("503", t, False)
    assert health.routable(0.4)
