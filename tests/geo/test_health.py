"""The circuit a replica's failures open: ejection, half-open after it, and closing on a success."""

from __future__ import annotations

from geo.catalog import HealthSettings
from geo.health import Health

M = "gemma"


def settings() -> HealthSettings:
    return HealthSettings(consecutive_failures=3, base_ejection_s=10.0, max_ejection_s=300.0)


def test_failures_in_a_row_open_the_circuit_and_a_success_between_them_does_not():
    health = Health(settings())
    assert not health.request_failed("503", 0.0, True, M)
    assert not health.request_failed("503", 0.1, True, M)
    health.request_succeeded(M)
    assert not health.request_failed("503", 0.2, True, M) and not health.request_failed("503", 0.3, True, M)
    assert health.request_failed("503", 0.4, True, M)  # the third in a row
    assert not health.routable(5.0) and "ejected" in health.why_not(5.0)


def test_after_the_ejection_the_first_failure_opens_it_again_for_longer():
    health = Health(settings())
    for t in (0.0, 0.1, 0.2):
        health.request_failed("503", t, True, M)
    assert health.routable(10.3) and health.circuit(M).half_open  # the ejection ended: half-open
    assert health.request_failed("503", 10.4, True, M)  # one failure is enough now
    assert not health.routable(25.0) and health.routable(30.5)  # 20 s: the second ejection


def test_a_success_while_half_open_closes_the_circuit_and_the_next_outage_starts_afresh():
    health = Health(settings())
    for t in (0.0, 0.1, 0.2):
        health.request_failed("503", t, True, M)
    health.request_succeeded(M)
    assert not health.circuit(M).half_open and health.circuit(M).ejections == 0
    assert not health.request_failed("503", 11.0, True, M)  # closed: three in a row again
    for t in (11.1, 11.2):
        health.request_failed("503", t, True, M)
    assert not health.routable(15.0) and health.routable(21.3)  # base ejection again, not doubled


def test_no_ejection_when_too_many_replicas_are_out():
    health = Health(settings())
    for t in (0.0, 0.1, 0.2, 0.3):
        assert not health.request_failed("503", t, False, M)
    assert health.routable(0.4)


def test_each_model_has_its_own_circuit_and_probes_are_the_servers():
    health = Health(settings())
    for t in (0.0, 0.1, 0.2):
        health.request_failed("503", t, True, M)
        health.request_succeeded("other")  # a healthy model's answers on the same server reset nothing
    assert not health.routable(1.0, M) and health.routable(1.0, "other")
    assert health.routable(1.0)  # the server still serves something
    assert health.why_not(1.0, M).startswith("ejected") and health.why_not(1.0, "other") == "up"
    health.request_failed("503", 1.0, True, "other")
    health.request_failed("503", 1.1, True, "other")
    assert health.request_failed("503", 1.2, True, "other")
    assert not health.routable(1.3) and "ejected for other" in health.why_not(1.3)
    for _ in range(settings().unhealthy_threshold):
        health.probe_failed("connection refused")
    assert not health.routable(20.0, "third")  # a server down is down for every model
