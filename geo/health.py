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

Probes are the server's: a replica that fails them is out for every model. Requests are the model's: each
model a replica serves has a circuit of its own there, so one model's answers do not reset the count of
another failing on the same server, and one model's outage does not eject the server for the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from geo.catalog import HealthSettings


@dataclass(slots=True)
class Circuit:
    """One model's circuit at a replica: its real requests' failures in a row, and its ejections."""

    failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0
    half_open: bool = False  # an ejection ended and no request has succeeded since
    last_error: str = ""

    def ejected(self, now: float) -> bool:
        return now < self.ejected_until


@dataclass(slots=True)
class Health:
    settings: HealthSettings
    probed_up: bool = True  # optimistic until the first probe: the edge probes every replica at start
    passes: int = 0
    probe_failures: int = 0
    last_error: str = ""  # the last probe's
    circuits: dict[str, Circuit] = field(default_factory=dict)  # by model

    def circuit(self, model: str) -> Circuit:
        found = self.circuits.get(model)
        if found is None:
            found = self.circuits[model] = Circuit()
        return found

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

    def request_succeeded(self, model: str) -> None:
        circuit = self.circuit(model)  # (kept for a model it served: the server serves something)
        circuit.failures = 0
        if circuit.half_open:  # the trial passed: the circuit closes, and the next outage starts afresh
            circuit.half_open = False
            circuit.ejections = 0

    def request_failed(self, why: str, now: float, may_eject: bool, model: str) -> bool:
        """Record a failed request for ``model``; True when it ejected the replica for that model (only if
        ``may_eject``)."""
        circuit = self.circuit(model)
        circuit.failures += 1
        circuit.last_error = why
        if circuit.ejected(now) or not may_eject:
            return False
        if circuit.failures < self.settings.consecutive_failures and not circuit.half_open:
            return False
        circuit.ejections += 1
        s = self.settings
        circuit.ejected_until = now + min(s.base_ejection_s * circuit.ejections, s.max_ejection_s)
        circuit.failures = 0
        circuit.half_open = True
        return True

    def ejected(self, now: float, model: str) -> bool:
        circuit = self.circuits.get(model)
        return circuit is not None and circuit.ejected(now)

    def ejected_until(self, model: str) -> float:
        circuit = self.circuits.get(model)
        return circuit.ejected_until if circuit is not None else 0.0

    def routable(self, now: float, model: str | None = None) -> bool:
        """Whether requests for ``model`` may go to it; without a model, whether any may (it passes its
        probes and not every model it had requests for is ejected)."""
        if not self.probed_up:
            return False
        if model is not None:
            return not self.ejected(now, model)
        return not self.circuits or not all(c.ejected(now) for c in self.circuits.values())

    def why_not(self, now: float, model: str | None = None) -> str:
        if not self.probed_up:
            return f"down ({self.last_error or 'failed its probes'})"
        out = [
            (name, c)
            for name, c in self.circuits.items()
            if c.ejected(now) and (model is None or name == model)
        ]
        if model is not None and out:
            c = out[0][1]
            return f"ejected for {c.ejected_until - now:.0f}s more ({c.last_error})"
        if out and len(out) == len(self.circuits):
            return "; ".join(f"ejected for {name} ({c.ejected_until - now:.0f}s more)" for name, c in out)
        return "up"
