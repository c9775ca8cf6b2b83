"""How long a replica takes: round trip, first token and service time, as moving averages.

Until a path is measured its round trip is the speed-of-light floor for the great-circle distance times a
path-inflation factor; once probes time it, an exponentially weighted moving average of what they saw. The
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
    estimated_rtt_ms: float  # floor x inflation, until measured
    alpha: float
    rtt: Ewma = None  # type: ignore[assignment]
    ttft: Ewma = None  # type: ignore[assignment]
    service: Ewma = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.rtt, self.ttft, self.service = Ewma(self.alpha), Ewma(self.alpha), Ewma(self.alpha)

    @property
    def rtt_ms(self) -> float:
        return self.rtt.value if self.rtt.samples else self.estimated_rtt_ms

    @property
    def measured(self) -> bool:
        return self.rtt.samples > 0

    def service_ms(self, default_ms: float) -> float:
        return self.service.value if self.service.samples else default_ms
