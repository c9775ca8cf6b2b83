"""How long a replica takes: round trip, first token and service time, as moving averages.

Until a path is measured its round trip is the speed-of-light floor for the great-circle distance times a
path-inflation factor; once probes time it, an exponentially weighted moving average of what they saw, but
never below the floor itself: a replica that answers faster than light allows from the place the catalog
gives it is not where the catalog says (a test bench on loopback, or a wrong city), and the catalog is what
the operator routes by. The
first-token time the edge observes on real requests, and their whole service time, are averaged the same
way: the first feeds the explanation and the prefill estimate, the second the queueing estimate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Ewma:
    alpha: float
    value: float = 0.0
    samples: int = 0

    def add(self, x: float) -> None:
        self.value = x if self.samples == 0 else self.value + self.alpha * (x - self.value)
        self.samples += 1


@dataclass(slots=True)
class Latency:
    floor_rtt_ms: float  # light in fibre over the great circle, both ways
    inflation: float
    alpha: float
    rtt: Ewma = None  # type: ignore[assignment]
    ttft: Ewma = None  # type: ignore[assignment]
    service: Ewma = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.rtt, self.ttft, self.service = Ewma(self.alpha), Ewma(self.alpha), Ewma(self.alpha)

    @property
    def rtt_ms(self) -> float:
        if self.rtt.samples:
            return max(self.rtt.value, self.floor_rtt_ms)
        return self.floor_rtt_ms * self.inflation

    @property
    def below_floor(self) -> bool:
        """Measured faster than light allows: the catalog's place for it is likely wrong."""
        return self.rtt.samples > 0 and self.rtt.value < 0.5 * self.floor_rtt_ms

    @property
    def measured(self) -> bool:
        return self.rtt.samples > 0

    def service_ms(self, default_ms: float) -> float:
        return self.service.value if self.service.samples else default_ms
