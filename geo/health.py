"""Whether a replica may be routed to: active probes with thresholds, and outlier ejection from real traffic.

Active: ``unhealthy_threshold`` failed probes in a row take a replica out, ``healthy_threshold`` passes in a
row bring it back. Passive (Envoy's outlier detection): ``consecutive_failures`` failed requests in a row
(connect errors, 5xx, timeouts) eject it for ``base_ejection_s`` times the number of times it has been
ejected (at most ``max_ejection_s``); a success resets the count. The router never ejects more than
``max_ejected_percent`` of the replicas at once, so a fault that looks like every replica's (the edge's own
network) cannot empty the pool. An ejection is an open circuit: when it ends the replica is half-open, and
the first request that fails there ejects it again at once (for longer); the first that succeeds closes the
circuit. Refusals (429, 503) count as failures here: a region refusing every request is out as surely as
one that fails them. Time comes in as an argument: everything here is pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from geo.catalog import HealthSettings


@dataclass(slots=True)
class Health:
    settings: HealthSettings
    probed_up: bool = True  # optimistic until the first probe: the edge probes every replica at start
    passes: int = 0
    probe_failures: int = 0
    failures: int = 0  # real requests failed in a row
    ejections: int = 0
    ejected_until: float = 0.0
    half_open: bool = False  # an ejection ended and no request has succeeded since
    last_error: str = ""

    def probe_passed(self) -> bool:
        """Record a passing probe; True when this brought the replica back."""
        self.passes += 1
        self.probe_failures = 0
        if not self.probed_up and self.passes >= self.settings.healthy_threshold:
            self.probed_up = True
            return True
        return False

    def probe_failed(self, why: str) -> bool:
        """Record a failed probe; True when this took the replica out."""
        self.passes = 0
        self.probe_failures += 1
        self.last_error = why
        if self.probed_up and self.probe_failures >= self.settings.unhealthy_threshold:
            self.probed_up = False
            return True
        return False

    def request_succeeded(self) -> None:
        self.failures = 0
        if self.half_open:  # the trial passed: the circuit closes, and the next outage starts afresh
            self.half_open = False
            self.ejections = 0

    def request_failed(self, why: str, now: float, may_eject: bool) -> bool:
        """Record a failed request; True when it ejected the replica (only if ``may_eject``)."""
        self.failures += 1
        self.last_error = why
        if self.ejected(now) or not may_eject:
            return False
        if self.failures < self.settings.consecutive_failures and not self.half_open:
            return False
        self.ejections += 1
        s = self.settings
        self.ejected_until = now + min(s.base_ejection_s * self.ejections, s.max_ejection_s)
        self.failures = 0
        self.half_open = True
        return True

    def ejected(self, now: float) -> bool:
        return now < self.ejected_until

    def routable(self, now: float) -> bool:
        return self.probed_up and not self.ejected(now)

    def why_not(self, now: float) -> str:
        if not self.probed_up:
            return f"down ({self.last_error or 'failed its probes'})"
        if self.ejected(now):
            return f"ejected for {self.ejected_until - now:.0f}s more ({self.last_error})"
        return "up"
